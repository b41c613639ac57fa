"""Gradient-accumulation fusion: weight-gradient GEMMs add into the weight's gradient in their own epilogue.

Without it, every micro-batch after the first makes a fresh weight gradient and autograd adds it to
`param.grad`: one extra pass reading two tensors and writing one, per weight, per micro-batch (on the
H200's MoE proxy 53.8 ms of a 885 ms step, 413 bf16 add kernels). With `optimizer.grad_accumulation_fusion`
the gradient buffer exists before the first micro-batch (`prepare`: zeroed once per step) and is also the
weight's `main_grad`, which the fused GEMMs accumulate into (GEMM with beta = 1), as Megatron-LM's
`--gradient-accumulation-fusion` does:

- the output layer (logits GEMM): `linear` below, cuBLAS `addmm_` into the gradient;
- Transformer Engine `Linear` / `GroupedLinear` layers: their own `fuse_wgrad_accumulation`;
- grouped-GEMM experts with `model.moe.expert_wgrad: te`: `grouped_mm` below, whose weight gradient is
  Transformer Engine's grouped GEMM with accumulate (CUTLASS on Hopper); with `torch` the experts keep
  autograd's accumulation (torch's grouped_mm has no accumulating form).

The fused functions return no gradient for the weight, so autograd never touches `param.grad`; this needs
the gradients on the weights (not fp32 main grads filled by hooks; `trainer.recipe` refuses that). DDP learns
that a gradient is ready from autograd, so with more than one rank the fused weights stay out of DDP and
`trainer.grad_reduce` all-reduces their main_grad: `watch` gives a weight two callbacks, told when a fused GEMM
reading it runs forward (`used`) and when its backward has accumulated into main_grad (`accumulated`), so the
reduction of a weight starts as soon as the last micro-batch's last accumulation into it is done (Megatron's DDP
learns the same from a hook on the weight's gradient accumulator).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from trainer.eager import outside_compile


def fused_weights(model: nn.Module, expert_backend: str | None, compute_dtype: torch.dtype) -> list[nn.Parameter]:
    """The weights whose gradient GEMMs accumulate: the output layer (unless the fused cross entropy makes its
    gradient), the TE layers built with fuse_wgrad_accumulation, and (given a backend) the single-parameter
    grouped_mm experts, which it marks; the torch ones only when stored in the compute dtype (bf16 weights).
    Experts are found by their `wgrad_backend` slot (trainer/moe.py's GroupedExperts; no import back into moe)."""
    weights = []
    if getattr(model, "cross_entropy", "native") != "fused" and model.output.weight.dtype == compute_dtype:
        weights.append(model.output.weight)
    for module in model.modules():
        if getattr(module, "fuse_wgrad_accumulation", False):
            weights += list(module.parameters(recurse=False))
        if (hasattr(module, "wgrad_backend") and expert_backend and module.gemm == "torch"
                and not module.discrete and module.w1.dtype == compute_dtype):
            module.wgrad_backend = expert_backend
            weights += [module.w1, module.w2]
    unique = {id(w): w for w in weights if w.requires_grad}
    return list(unique.values())


def has_main_grad(weight: torch.Tensor) -> bool:
    """True when `weight`'s gradient is accumulated by the fused GEMMs (prepare() gave it a main_grad)."""
    return getattr(weight, "main_grad", None) is not None


def prepare(params: Iterable[nn.Parameter]) -> None:
    """Before a step's first micro-batch: each fused weight's gradient zeroed (allocated once), = main_grad."""
    for p in params:
        buf = getattr(p, "main_grad", None)
        if buf is None:
            buf = torch.zeros_like(p)
        else:
            buf.zero_()
        p.grad = p.main_grad = buf  # a step starts from zero whatever an earlier step left


def watch(weight: nn.Parameter, used: Callable[[nn.Parameter], None],
          accumulated: Callable[[nn.Parameter], None]) -> None:
    """Tell `used(weight)` when a fused GEMM reading `weight` runs forward, `accumulated(weight)` when its backward
    has added into weight.main_grad (plain functions, not bound methods: a deep copy of the model shares them)."""
    weight.mbx_fused_hooks = (used, accumulated)


def _tell(weight: torch.Tensor, which: int) -> None:
    hooks = getattr(weight, "mbx_fused_hooks", None)
    if hooks is not None:
        hooks[which](weight)


def release(params: Iterable[nn.Parameter]) -> None:
    """Drop the main_grad buffers (the memory goes back when the gradients are dropped too)."""
    for p in params:
        p.main_grad = None


class _LinearAccumulating(torch.autograd.Function):
    """y = x · wᵀ; the backward adds xᵀ·dy into w.main_grad in the GEMM (beta = 1) and returns no dw."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.weight = weight  # the leaf itself: an unpacked saved tensor need not be the same object
        _tell(weight, 0)
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        dx = grad @ weight if ctx.needs_input_grad[0] else None
        g2 = grad.reshape(-1, grad.shape[-1]).to(weight.dtype)
        ctx.weight.main_grad.addmm_(g2.t(), x.reshape(-1, x.shape[-1]).to(weight.dtype))
        _tell(ctx.weight, 1)
        return dx, None


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) (no bias); the weight gradient accumulates in the GEMM when it has a main_grad."""
    if not has_main_grad(weight) or not torch.is_grad_enabled():
        return F.linear(x, weight)
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    if weight.dtype != dtype:  # an fp32 weight under bf16 autocast: the gradient GEMM would not match it
        return F.linear(x, weight)
    with torch.autocast(x.device.type, enabled=False):
        return _LinearAccumulating.apply(x.to(dtype), weight)


class _GroupedMMAccumulating(torch.autograd.Function):
    """x [M, in] · w[e]ᵀ per group of rows (w [E, out, in]); the backward accumulates w's gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor,
                accumulate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]], None]
                ) -> torch.Tensor:
        ctx.save_for_backward(x, weight, offs)
        ctx.weight = weight  # the leaf itself: an unpacked saved tensor need not be the same object
        ctx.accumulate = accumulate
        ctx.splits = _host_splits(offs) if x.is_cuda else None
        _tell(weight, 0)
        return F.grouped_mm(x, weight.transpose(-2, -1), offs=offs)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, offs = ctx.saved_tensors
        grad = grad.contiguous()
        dx = F.grouped_mm(grad, weight, offs=offs) if ctx.needs_input_grad[0] else None
        splits = ctx.splits.result() if ctx.splits is not None else _splits_now(offs)
        ctx.accumulate(ctx.weight.main_grad, x, grad, offs, splits)
        _tell(ctx.weight, 1)
        return dx, None, None, None


class _PendingSplits:
    """Group sizes copied to pinned host memory without waiting; read in the backward (long done by then)."""

    def __init__(self, offs: torch.Tensor):
        self.host = torch.empty(offs.shape, dtype=offs.dtype, pin_memory=True)
        self.host.copy_(offs, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record(torch.cuda.current_stream(offs.device))

    def result(self) -> list[int]:
        if not self.event.query():  # long done by the backward: a query, not a cudaEventSynchronize call
            self.event.synchronize()
        ends = self.host.tolist()
        return [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def _host_splits(offs: torch.Tensor) -> _PendingSplits:
    return _PendingSplits(offs)


def _splits_now(offs: torch.Tensor) -> list[int]:
    ends = offs.tolist()
    return [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def accumulate_with_torch(main_grad: torch.Tensor, x: torch.Tensor, grad: torch.Tensor, offs: torch.Tensor,
                          splits: list[int]) -> None:
    """The reference: torch's grouped weight-gradient GEMM into a new buffer, then added (what autograd does)."""
    main_grad.add_(F.grouped_mm(grad.t(), x, offs=offs))


def accumulate_with_te(main_grad: torch.Tensor, x: torch.Tensor, grad: torch.Tensor, offs: torch.Tensor,
                       splits: list[int]) -> None:
    """Transformer Engine's grouped GEMM, layout NT, accumulating into each expert's gradient in place."""
    from transformer_engine.pytorch.cpp_extensions import general_grouped_gemm

    # An expert without rows adds nothing: leave it out of the grouped GEMM (no zero-row GEMM asked of TE).
    kept = [e for e, rows in enumerate(splits) if rows]
    if not kept:
        return
    xs, grads, outs = x.split(splits), grad.split(splits), main_grad.unbind(0)
    general_grouped_gemm(A=[xs[e] for e in kept], B=[grads[e] for e in kept], out=[outs[e] for e in kept],
                         quantization_params=[None] * len(kept), out_dtype=main_grad.dtype, layout="NT",
                         m_splits=[splits[e] for e in kept], grad=True, accumulate=True)


def check_te_accumulate(device: torch.device) -> None:
    """Run accumulate_with_te once on a tiny problem against torch's result; raise RuntimeError naming what
    differs (an interface this code does not know, or a wrong result) before any training step."""
    dtype = torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)
    counts = torch.tensor([64, 0, 128], dtype=torch.int32, device=device)  # an empty expert too
    offs = counts.cumsum(0).to(torch.int32)
    x = torch.randn(192, 64, device=device, dtype=dtype, generator=gen)
    dy = torch.randn(192, 32, device=device, dtype=dtype, generator=gen)
    base = torch.randn(3, 32, 64, device=device, dtype=dtype, generator=gen)
    ref, got = base.clone(), base.clone()
    accumulate_with_torch(ref, x, dy, offs, counts.tolist())
    accumulate_with_te(got, x, dy, offs, counts.tolist())
    err = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())
    if err > 0.02:  # the two round the sum to bf16 at different points: a bf16 ulp or two (~0.4% each) apart
        raise RuntimeError(f"TE grouped GEMM with accumulate differs from torch's by up to {err:.2%} of the largest")


ACCUMULATORS = {"torch": accumulate_with_torch, "te": accumulate_with_te}


@outside_compile  # the backward writes a tensor outside the graph (the weight's main_grad)
def grouped_mm(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, backend: str) -> torch.Tensor:
    """x · weight[e]ᵀ per group (weight [E, out, in], a leaf); dW accumulated into its main_grad by `backend`
    (plain grouped_mm when the weight has no main_grad: prepare() was not called)."""
    if not has_main_grad(weight):
        return F.grouped_mm(x, weight.transpose(-2, -1), offs=offs)
    return _GroupedMMAccumulating.apply(x, weight, offs, ACCUMULATORS[backend])
