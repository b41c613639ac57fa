"""AdamW (fused, with on-device step skipping), linear warm-up then cosine decay, gradient clipping."""

from __future__ import annotations

import math

import torch
from torch import nn

from trainer.adamw import FusedAdamW
from trainer.adamw_pa import PrecisionAwareAdamW
from trainer.recipe import OptimizerConfig


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> FusedAdamW | PrecisionAwareAdamW:
    """AdamW with weight decay on matrices only (not on norms), as Megatron.

    torch's fused kernel (CUDA and CPU; trainer/adamw.py): one multi-tensor kernel per step, and it honours
    `optimizer.found_inf`, which lets a non-finite step be skipped without a host sync. With
    `optimizer.moments: bf16` the precision-aware AdamW (trainer/adamw_pa.py) instead, over the parameters.
    """
    if cfg.moments == "bf16":
        params = [p for p in model.parameters() if p.requires_grad]
        return PrecisionAwareAdamW(params, params, cfg, torch.bfloat16)
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return FusedAdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def lr_at(step: int, total_steps: int, cfg: OptimizerConfig) -> float:
    """Learning rate of 1-based `step`: linear warm-up to `lr` over warmup_steps, then cosine to min_lr.

    Step 1 already trains (lr/warmup, not Megatron's 0); the last step runs at min_lr.
    """
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    decay_steps = total_steps - cfg.warmup_steps
    if decay_steps <= 0:
        return cfg.lr
    ratio = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.lr - cfg.min_lr)


def set_lr(optimizer: FusedAdamW | PrecisionAwareAdamW, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Global L2 norm of the gradients, as a device tensor (no sync); bf16 gradients are summed in fp32."""
    if any(g.dtype != torch.float32 for g in grads):
        if grads[0].device.type == "cuda":
            norms = list(torch._foreach_norm(grads, 2.0, dtype=torch.float32))
        else:
            norms = [torch.linalg.vector_norm(g, 2.0, dtype=torch.float32) for g in grads]
        return torch.linalg.vector_norm(torch.stack(norms), 2.0)
    # foreach=None: multi-tensor kernels on CUDA, a per-tensor loop on CPU (which has no foreach kernels).
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=None)


def clip_divisor(norm: torch.Tensor, max_norm: float) -> torch.Tensor | None:
    """What fused AdamW divides every gradient by to clip the global norm to max_norm (None = no clipping).

    Equals 1 / torch.nn.utils.clip_grad_norm_'s coefficient, max(1, (norm + 1e-6) / max_norm). Setting it as
    `optimizer.grad_scale` applies the clip inside the optimizer's own pass over the gradients, instead of
    a separate read-modify-write of every gradient (one fewer full pass over ~4 bytes per parameter).
    """
    if max_norm <= 0:
        return None
    return torch.clamp((norm.float() + 1e-6) / max_norm, min=1.0)
