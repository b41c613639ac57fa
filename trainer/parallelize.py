"""What wraps the model from outside: the MoE pipeline and expert parallelism, recompute, torch.compile, DDP."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from trainer.distributed import Dist
from trainer.eager import install as install_outside_compile
from trainer.expert_parallel import ExpertParallel
from trainer.model import GPT
from trainer.moe import MoELayer
from trainer.moe_pipeline import MoEPipeline
from trainer.recipe import RECOMPUTE_MODULES


class Recompute(nn.Module):
    """Drop the wrapped module's activations after the forward and recompute them in the backward."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        # preserve_rng_state=False: the model draws no random numbers (no dropout, deterministic routing).
        return checkpoint(self.inner, *args, use_reentrant=False, preserve_rng_state=False)


def apply_recompute(model: GPT, mode: str, modules: frozenset[str] | None = None) -> None:
    """full: every transformer layer (Megatron --recompute-granularity full, uniform, 1 layer per chunk);
    selective: the `modules` (default all of RECOMPUTE_MODULES, as Megatron's --recompute-modules):
    core_attn wraps softmax(QKᵀ)V in a checkpoint; moe_act and moe_dispatch keep the expert activation's
    output and the permuted token buffer out of the saved tensors (trainer.moe.saved_as_recompute)."""
    if mode == "none":
        return
    if mode not in ("full", "selective"):
        raise ValueError(f"unknown recompute mode {mode!r}")
    modules = frozenset(RECOMPUTE_MODULES) if modules is None else modules
    for i, layer in enumerate(model.layers):
        if mode == "full":
            model.layers[i] = Recompute(layer)
            continue
        if "core_attn" in modules:
            layer.attn.core = Recompute(layer.attn.core)
        if isinstance(layer.mlp, MoELayer):
            layer.mlp.recompute_dispatch = "moe_dispatch" in modules
            layer.mlp.experts.recompute_act = "moe_act" in modules


def moe_layers(model: nn.Module) -> list[MoELayer]:
    """Every MoE layer of `model` (or `model` itself when it is one)."""
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def _install_pipeline(layer: MoELayer, **fields: Any) -> None:
    """Set `fields` of the layer's pipeline; a layer that neither chunks, overlaps nor exchanges keeps none."""
    pipeline = dataclasses.replace(layer.pipeline or MoEPipeline(), **fields)
    needed = (pipeline.side is not None or pipeline.exchange is not None
              or layer.cfg.dispatch_chunk_tokens is not None)
    layer.pipeline = pipeline if needed else None


def attach_dispatcher(model: nn.Module, stream: object) -> int:
    """Give every MoE layer the chunked pipeline (trainer.moe_pipeline) on dispatcher stream `stream` (None = no
    overlap) where it chunks its tokens or has a stream; returns how many MoE layers there are."""
    layers = moe_layers(model)
    for layer in layers:
        _install_pipeline(layer, side=stream)
    return len(layers)


def apply_expert_parallel(model: nn.Module, ep: ExpertParallel) -> list[nn.Parameter]:
    """Keep this rank's experts of every MoE layer and send its rows to their experts' ranks through `ep`'s
    all-to-all (in the layer's pipeline, on its dispatcher stream if any). Returns the expert parameters."""
    params: list[nn.Parameter] = []
    for layer in moe_layers(model):
        params += ep.shard(layer.experts)
        _install_pipeline(layer, exchange=ep)
    return params


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The routed experts' parameters of every MoE layer (grouped_mm experts, or TE GroupedLinear ones swapped in
    after sharding): what expert parallelism shards and keeps out of DDP."""
    return [p for layer in moe_layers(model) for p in layer.experts.parameters() if p.requires_grad]


def apply_compile(model: GPT) -> None:
    """torch.compile each transformer layer separately (fast compiles, one graph per layer kind)."""
    install_outside_compile()  # the functions marked outside_compile become torch.compiler.disable'd first
    for i, layer in enumerate(model.layers):
        model.layers[i] = torch.compile(layer)


def parallelize(model: GPT, *, recompute: str, compile: bool, dist: Dist,
                recompute_modules: frozenset[str] | None = None,
                outside_ddp: list[nn.Parameter] | None = None) -> nn.Module:
    """Apply recompute, then compile, then DDP when world > 1 (gradients all-reduced in buckets during backward).

    `outside_ddp` parameters (expert-parallel experts, gradient-accumulation-fused weights) stay out of DDP:
    trainer.grad_reduce reduces them.
    """
    apply_recompute(model, recompute, recompute_modules)
    if compile:
        apply_compile(model)
    if not dist.initialized:
        return model
    if outside_ddp:
        ids = {id(p) for p in outside_ddp}
        names = [name for name, p in model.named_parameters() if id(p) in ids]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
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
    """The model inside DDP (or the model itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model
