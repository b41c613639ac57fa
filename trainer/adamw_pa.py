"""Precision-aware AdamW: fp32 master weights updated straight from bf16 gradients, moments in fp32 or bf16.

Megatron-LM's precision-aware optimizer (`--use-precision-aware-optimizer`, `--exp-avg-dtype`,
`--exp-avg-sq-dtype`) keeps what fused AdamW over fp32 masters cannot: the bf16 gradients are read where the
backward left them (no fp32 copy of every gradient, 4 bytes per parameter), and the two moments may be stored in
bf16 (4 more bytes per parameter saved). The math is fused AdamW's, done in fp32 per element:

    master *= 1 - lr·wd;  m = lerp(m, g, 1 - β1);  v = β2·v + (1 - β2)·g²
    master -= lr / (1 - β1^t) · m / (sqrt(v) / sqrt(1 - β2^t) + eps)

with g = grad / grad_scale (the clip), and nothing written when `found_inf` is set (the step is skipped on the
device, t is not advanced). On a GPU each tensor's update is one compiled elementwise kernel (torch.compile,
dynamic 1-D shapes); on the CPU the same function runs eagerly.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from trainer.recipe import OptimizerConfig


def adamw_update(
    master: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    scalars: torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """One AdamW update of 1-D tensors in place. scalars = [lr, weight decay, step, 1/grad_scale, skip]."""
    lr, weight_decay, step, inv_scale, skip = scalars.unbind()
    g = grad.float() * inv_scale
    m = torch.lerp(exp_avg.float(), g, 1.0 - beta1)
    v = exp_avg_sq.float() * beta2 + (1.0 - beta2) * g * g
    bias1 = 1.0 - beta1**step
    bias2_sqrt = torch.sqrt(1.0 - beta2**step)
    new = master * (1.0 - lr * weight_decay) - (lr / bias1) * m / (torch.sqrt(v) / bias2_sqrt + eps)
    keep = skip == 0
    master.copy_(torch.where(keep, new, master))
    exp_avg.copy_(torch.where(keep, m, exp_avg.float()))
    exp_avg_sq.copy_(torch.where(keep, v, exp_avg_sq.float()))


class PrecisionAwareAdamW:
    """AdamW over `targets` (fp32 masters, or the parameters themselves) whose gradients live on `sources`.

    Honours what the training loop sets on fused AdamW: `param_groups[i]["lr"]`, `grad_scale` (the clip
    divisor, a device tensor or None) and `found_inf` (a device tensor; 1 skips the step without a sync).
    """

    def __init__(
        self,
        targets: list[nn.Parameter],
        sources: list[nn.Parameter],
        cfg: OptimizerConfig,
        moments: torch.dtype,
    ):
        if len(targets) != len(sources):
            raise ValueError("one gradient source per target")
        self.cfg = cfg
        self.targets, self.sources = targets, sources
        self.exp_avg = [torch.zeros_like(t, dtype=moments) for t in targets]
        self.exp_avg_sq = [torch.zeros_like(t, dtype=moments) for t in targets]
        decay = [t.ndim >= 2 for t in targets]  # weight decay on matrices only (not norms), as Megatron
        self.param_groups = [
            {"lr": cfg.lr, "weight_decay": cfg.weight_decay, "index": [i for i, d in enumerate(decay) if d]},
            {"lr": cfg.lr, "weight_decay": 0.0, "index": [i for i, d in enumerate(decay) if not d]},
        ]
        device = targets[0].device if targets else torch.device("cpu")
        self.step_count = torch.zeros((), dtype=torch.float32, device=device)
        self.grad_scale: torch.Tensor | None = None
        self.found_inf: torch.Tensor | None = None
        self.update = torch.compile(adamw_update, dynamic=True) if device.type == "cuda" else adamw_update

    @torch.no_grad()
    def step(self) -> None:
        device = self.step_count.device
        skip = self.found_inf if self.found_inf is not None else torch.zeros((), device=device)
        self.step_count += 1 - skip
        inv_scale = 1.0 / self.grad_scale if self.grad_scale is not None else torch.ones((), device=device)
        for group in self.param_groups:
            scalars = torch.stack([
                torch.tensor(float(group["lr"]), device=device), torch.tensor(float(group["weight_decay"]), device=device),
                self.step_count, inv_scale.float().reshape(()), skip.float().reshape(()),
            ])  # fmt: skip
            for i in group["index"]:
                grad = self.sources[i].grad
                if grad is None:
                    continue
                args = (self.targets[i].view(-1), grad.view(-1), self.exp_avg[i].view(-1),
                        self.exp_avg_sq[i].view(-1), scalars, self.cfg.beta1, self.cfg.beta2, self.cfg.eps)  # fmt: skip
                try:
                    self.update(*args)
                except Exception as err:  # a compiler failure must not stop training: the eager kernels
                    if self.update is adamw_update:
                        raise
                    warnings.warn(
                        f"precision-aware AdamW: torch.compile failed ({type(err).__name__}); eager",
                        stacklevel=2,
                    )
                    self.update = adamw_update
                    self.update(*args)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for source in self.sources:
            source.grad = None

    def state_bytes(self) -> int:
        """Bytes held by the two moments (for the memory estimate's tests)."""
        return sum(t.numel() * t.element_size() for t in self.exp_avg + self.exp_avg_sq)
