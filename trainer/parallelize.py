"""What wraps the model from outside: activation recompute, torch.compile, data parallelism (DDP)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from trainer.distributed import Dist
from trainer.model import GPT


class Recompute(nn.Module):
    """Drop the wrapped module's activations after the forward and recompute them in the backward."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        # preserve_rng_state=False: the model draws no random numbers (no dropout, deterministic routing).
        return checkpoint(self.inner, *args, use_reentrant=False, preserve_rng_state=False)


def apply_recompute(model: GPT, mode: str) -> None:
    """full: every transformer layer (Megatron --recompute-granularity full, uniform, 1 layer per chunk);
    selective: the core attention only (Megatron's selective recompute of softmax(QKᵀ)V)."""
    if mode == "none":
        return
    for i, layer in enumerate(model.layers):
        if mode == "full":
            model.layers[i] = Recompute(layer)
        elif mode == "selective":
            layer.attn.core = Recompute(layer.attn.core)
        else:
            raise ValueError(f"unknown recompute mode {mode!r}")


def apply_compile(model: GPT) -> None:
    """torch.compile each transformer layer separately (fast compiles, one graph per layer kind)."""
    for i, layer in enumerate(model.layers):
        model.layers[i] = torch.compile(layer)


def parallelize(model: GPT, *, recompute: str, compile: bool, dist: Dist) -> nn.Module:
    """Apply recompute, then compile, then DDP when world > 1 (gradients all-reduced in buckets during backward)."""
    apply_recompute(model, recompute)
    if compile:
        apply_compile(model)
    if not dist.initialized:
        return model
    return DistributedDataParallel(
        model,
        device_ids=[dist.local_rank] if dist.device.type == "cuda" else None,
        broadcast_buffers=False,  # the only buffers are the RoPE tables, identical on every rank
        gradient_as_bucket_view=True,  # grads live in the all-reduce buckets: no copy in and out
    )


def no_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip DDP's gradient all-reduce on all micro-batches but the last of a step."""
    if isinstance(model, DistributedDataParallel) and not sync:
        return model.no_sync()
    return contextlib.nullcontext()


def unwrap(model: nn.Module) -> GPT:
    return model.module if isinstance(model, DistributedDataParallel) else model
