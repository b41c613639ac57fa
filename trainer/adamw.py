"""Fused AdamW: torch's fused multi-tensor kernel, driven without `torch.optim.Optimizer` (no torch._dynamo import).

`torch.optim.AdamW(fused=True)` runs one `torch._fused_adamw_` kernel per (device, dtype) group; this class
calls the same kernel with the same arguments, so its updates are bit for bit torch's (tests/test_trainer_adamw.py).
What it leaves out is `torch.optim.Optimizer`'s machinery, whose `add_param_group`, `step` and `zero_grad` are
wrapped in `torch._disable_dynamo` and import `torch._dynamo` on first call: ~2 s of CPU in every trainer process
that never compiles anything (every CPU run, hence every test that launches a trainer).

State per parameter is torch's fused layout, `state[p] = {"step", "exp_avg", "exp_avg_sq"}` (`step` a float32
tensor on the parameter's device), which trainer/checkpoint.py reads and writes.
"""

from __future__ import annotations

from typing import Any

import torch


class FusedAdamW:
    """AdamW over param groups (`params`, `lr`, `weight_decay`); honours `grad_scale` and `found_inf` as torch does.

    `grad_scale` (a device tensor or None) divides every gradient inside the kernel (the clip); `found_inf`
    (a device tensor, 1 = skip) leaves parameters and moments untouched and does not advance `step`, no sync.
    """

    def __init__(self, groups: list[dict[str, Any]], lr: float, betas: tuple[float, float], eps: float):
        self.param_groups = [{"lr": lr, **group, "params": list(group["params"])} for group in groups]
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        self.grad_scale: torch.Tensor | None = None
        self.found_inf: torch.Tensor | None = None

    def _state_of(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state.get(p)
        if state is None:
            state = self.state[p] = {
                "step": torch.tensor(0.0, dtype=torch.float32, device=p.device),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
        return state

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            buckets: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    buckets.setdefault((p.device, p.dtype), []).append(p)
            for (device, _), params in buckets.items():
                self._step_bucket(group, device, params)

    def _step_bucket(self, group: dict[str, Any], device: torch.device, params: list[torch.Tensor]) -> None:
        states = [self._state_of(p) for p in params]
        steps = [s["step"] for s in states]
        grad_scale = None if self.grad_scale is None else self.grad_scale.to(device, non_blocking=True)
        found_inf = None if self.found_inf is None else self.found_inf.to(device, non_blocking=True)
        torch._foreach_add_(steps, 1)
        torch._fused_adamw_(
            params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
            [], steps, amsgrad=False, lr=float(group["lr"]), beta1=self.beta1, beta2=self.beta2,
            weight_decay=float(group["weight_decay"]), eps=self.eps, maximize=False,
            grad_scale=grad_scale, found_inf=found_inf,
        )  # fmt: skip
        if found_inf is not None:
            torch._foreach_sub_(steps, [found_inf] * len(steps))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
