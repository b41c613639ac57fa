"""Kernel-name classifier: which part of a training step a GPU kernel (or a CPU op) belongs to.

Names come from profiler traces (torch.profiler/Kineto Chrome traces, nsys exports): cuBLAS/cuBLASLt
(`nvjet_*`, `sm90_xmma_gemm_*`, `cublasLt::*`), CUTLASS (`cutlass::device_kernel<...Gemm...>`), flash /
cuDNN / CUTLASS attention, NCCL (`ncclDevKernel_*`), DeepEP and Transformer Engine MoE kernels, fused
optimizers (`multi_tensor_apply_kernel`, `fused_adamw`), Triton/Inductor fusions, PyTorch's elementwise,
reduction, index/scatter/gather and sort kernels, and ATen op names (`aten::mm`) for CPU-only traces.

`classify(name, context)` looks at the name first; a kernel the name leaves generic (elementwise,
communication, copies, unknown) takes a more specific class from its context: the names of the CPU ops
and `record_function` ranges that launched it, innermost first (an elementwise kernel launched from
`aten::index_put_` is MoE permute work, one under `Optimizer.step#AdamW.step` is optimizer work, an NCCL
send/recv under `c10d::alltoall_base_` is the MoE token exchange).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

GEMM = "GEMM"
ATTENTION = "attention"
MOE_PERMUTE = "MoE permute"
MOE_EXCHANGE = "MoE dispatch/combine"
COMMUNICATION = "communication"
OPTIMIZER = "optimizer"
ELEMENTWISE = "norm/elementwise"
MEMCPY = "memcpy"
OTHER = "other"
IDLE = "idle"

#: Every class a kernel can get, in the order the report stacks them; `IDLE` is added by the trace reader.
CLASSES: tuple[str, ...] = (
    GEMM, ATTENTION, MOE_PERMUTE, MOE_EXCHANGE, COMMUNICATION, OPTIMIZER, ELEMENTWISE, MEMCPY, OTHER,
)  # fmt: skip
ALL_CLASSES: tuple[str, ...] = (*CLASSES, IDLE)


def _rx(*parts: str) -> re.Pattern[str]:
    return re.compile("|".join(parts), re.IGNORECASE)


# By name, first match wins: the order settles names that fit two rules (an NCCL AllGather is not a
# gather kernel; a CUTLASS FMHA is attention, not GEMM; a grouped GEMM of the experts is GEMM).
NAME_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (MEMCPY, _rx(r"^memcpy", r"^memset", r"\bmemcpy", r"\bmemset", r"^cudaMemcpy", r"^aten::copy_$")),
    (MOE_EXCHANGE, _rx(r"deep_?ep", r"moe_?(dispatch|combine)", r"\bdispatch(_kernel)?\b", r"\bcombine(_kernel)?\b",
                       r"notify_dispatch", r"all_?to_?all", r"alltoall")),  # fmt: skip
    (COMMUNICATION, _rx(r"nccl", r"c10d::", r"all_?reduce", r"reduce_?scatter", r"all_?gather", r"broadcast",
                        r"sendrecv", r"nvshmem", r"userbuffers", r"cross_device_reduce", r"gloo")),  # fmt: skip
    (ATTENTION, _rx(r"flash", r"fmha", r"sdpa", r"scaled_dot_product", r"attention", r"\battn", r"_attn_",
                    r"cudnn.*mha", r"softmax_?attn", r"compute_dot_do_o", r"convert_dq_to_16bits")),  # fmt: skip
    # (not "lamb" alone: every `{lambda()#1}` of a PyTorch kernel's name holds it); an Inductor fusion that
    # lerps and takes a square root is a compiled Adam update (the first moment's lerp_, the second's sqrt)
    (OPTIMIZER, _rx(r"adam", r"multi_tensor", r"_foreach_", r"fused_sgd", r"lamb(?!da)", r"optimizer", r"l2norm",
                    r"^triton_\w*lerp\w*sqrt")),  # fmt: skip
    # the embedding's backward (sort + segment sums) is index work, but not the MoE's
    (OTHER, _rx(r"embedding", r"partials_per_segment", r"partial_segment", r"compute_grad_weight",
                r"sum_and_scatter", r"segment_offsets")),  # fmt: skip
    (MOE_PERMUTE, _rx(r"permute_kernel", r"unpermute", r"moe_permute", r"row_id_map", r"index_?select",
                      r"indexSelect", r"index_?add", r"indexFunc", r"index_?put", r"index_elementwise",
                      r"indexing_backward", r"scatter", r"gather", r"sort", r"radix", r"topk", r"bincount",
                      r"histc", r"histogram", r"cumsum", r"DeviceScan", r"scan_innermost", r"scan_outer", r"masked_select", r"nonzero",
                      r"one_hot", r"^aten::index$", r"\brouter\b")),  # fmt: skip
    (GEMM, _rx(r"gemm", r"nvjet", r"xmma", r"cutlass", r"cublas", r"gemv", r"wgmma", r"matmul", r"splitKreduce",
               r"triton_tem_fused_\w*mm", r"^aten::(mm|bmm|addmm|baddbmm|linear|_grouped_mm|addmv|mv|dot)$",
               r"\bKernel2\b", r"dot_kernel")),  # fmt: skip
    (ELEMENTWISE, _rx(r"norm", r"rms", r"GammaBeta", r"elementwise", r"vectorized", r"unrolled", r"reduce", r"triton_",
                      r"softmax", r"silu", r"gelu", r"swiglu", r"glu", r"relu", r"sigmoid", r"tanh", r"cast",
                      r"transpose", r"fill", r"copy", r"\bcat\b", r"CatArray", r"rope", r"rotary", r"dropout",
                      r"cross_?entropy", r"nll_loss", r"log_softmax", r"^aten::(add|mul|div|sub|exp|log|pow|rsqrt|"
                      r"sqrt|neg|where|clamp|sum|mean|max|min|abs|sign|zero_|ones|zeros|full|arange|"
                      r"empty|to|_to_copy|contiguous|clone|expand|view|reshape|sort|lt|gt|eq|ne|le|ge)_?$")),
)  # fmt: skip

# What a kernel's context may turn each class into (a GEMM stays a GEMM wherever it is launched; an
# all-reduce under the optimizer stays communication; an index kernel of the embedding is not MoE work).
_ANY = frozenset(ALL_CLASSES)
REFINE: dict[str, frozenset[str]] = {
    ELEMENTWISE: _ANY, OTHER: _ANY, MEMCPY: _ANY,
    COMMUNICATION: frozenset({MOE_EXCHANGE}), MOE_PERMUTE: frozenset({OTHER}),
}  # fmt: skip
_EXCHANGE_CONTEXT = r"all_?to_?all|alltoall|dispatch|combine|deep_?ep|token_exchange"
_PERMUTE_CONTEXT = (
    r"permute|router|routing|topk|index_?select|index_?add|index_?put|scatter|\bgather|^aten::index$|"
    r"\bsort\b|argsort|bincount|histc|one_hot|capacity"
)
CONTEXT_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (OPTIMIZER, _rx(r"^Optimizer\.", r"optimizer", r"zero_grad", r"adam", r"clip_grad", r"_foreach_")),
    (MOE_EXCHANGE, _rx(_EXCHANGE_CONTEXT)),
    (MOE_PERMUTE, _rx(_PERMUTE_CONTEXT)),
    (OTHER, _rx(r"embedding")),
)


NAME_PREFIX = 2048  # characters of a name (or a context range) the rules read: what decides its class comes first


@lru_cache(maxsize=1 << 16)
def by_name(name: str) -> str:
    """The class of a kernel or op from its name alone (its first NAME_PREFIX characters: the rules' time is
    bounded whatever the name's length)."""
    name = name[:NAME_PREFIX]
    for cls, pattern in NAME_RULES:
        if pattern.search(name):
            return cls
    return OTHER


def classify(name: str, context: Iterable[str] = ()) -> str:
    """The class of a kernel named `name`, launched under `context` (enclosing op/range names, innermost first)."""
    return _classify(name, tuple(context))


@lru_cache(maxsize=1 << 16)
def _classify(name: str, context: tuple[str, ...]) -> str:
    cls = by_name(name)
    allowed = REFINE.get(cls)
    if not allowed:
        return cls
    for outer in context:
        refined = _by_context(outer)
        if refined in allowed:
            return refined
    return cls


@lru_cache(maxsize=1 << 16)
def _by_context(outer: str) -> str | None:
    outer = outer[:NAME_PREFIX]
    return next((r for r, pattern in CONTEXT_RULES if pattern.search(outer)), None)
