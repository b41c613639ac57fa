"""AdamW (fused, with on-device step skipping), linear warm-up then cosine decay, gradient clipping."""

from __future__ import annotations

import math

import torch
from torch import nn

from trainer.recipe import OptimizerConfig


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms), as Megatron.

    fused=True (CUDA and CPU kernels): one multi-tensor kernel per step, and it honours
    `optimizer.found_inf`, which lets a non-finite step be skipped without a host sync.
    """
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=True)


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


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_gradients(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Global L2 norm of the gradients (a device tensor: no sync), scaling them to max_norm when above (0 = off)."""
    grads = [p.grad for p in params if p.grad is not None]
    # foreach=None: multi-tensor kernels on CUDA, a per-tensor loop on CPU (which has no foreach kernels).
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=None)
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=None)
    return norm
