"""Mixture-of-experts MLP: top-k router, token dispatch (argsort permutation, capacity, drops), grouped experts.

Read top to bottom: activations and the recompute hook, routing (which experts a token goes to, with
what weight), dispatch (where each token's row goes in the expert-grouped buffer, and back), the expert
MLPs (grouped GEMMs over that buffer), and the layer, which runs them in that order on this device.

How the rows travel is not this module's business: trainer.parallelize installs trainer.moe_pipeline on
a layer to overlap its chunks on a dispatcher stream (CUDA streams, events, green contexts) and to send
rows to other ranks' experts (trainer.expert_parallel); `MoELayer.routed` is what that pipeline computes.

Device→host syncs: none in the default (dropless, grouped_mm) path. Three opt-in paths
sync, each marked where it happens: capacity dropping without `pad_to_capacity`
(the compact buffer's size is data-dependent), the `loop` GEMM fallback and TE GroupedLinear experts
without `pad_to_capacity` (both need the group sizes on the host).

Selective recompute of `moe_dispatch` (the permuted buffer, the first expert GEMM's input) and `moe_act`
(the activation's output, the second expert GEMM's input): saved-tensor hooks keep a recipe instead of
the tensor and the backward re-makes it (a gather, an activation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from trainer import grad_accum
from trainer.capacity import expert_capacity
from trainer.eager import outside_compile
from trainer.recipe import MoEConfig, RouterConfig


def activate(h: torch.Tensor, kind: str) -> torch.Tensor:
    """MLP activation; for SwiGLU `h` holds [gate | up] along the last dim."""
    if kind == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up
    if kind == "squared_relu":
        return F.relu(h).square()
    raise ValueError(f"unknown activation {kind!r}")


def activate_with_remake(h: torch.Tensor, kind: str) -> tuple[torch.Tensor, Callable[[], torch.Tensor]]:
    """activate(h) and a function that recomputes it from tensors the activation's backward keeps anyway
    (SwiGLU: the gate/up halves of h; squared ReLU: relu(h), not h, which relu's backward does not keep)."""
    if kind == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up, lambda: F.silu(gate) * up
    if kind == "squared_relu":
        r = F.relu(h)
        return r.square(), lambda: r.square()
    raise ValueError(f"unknown activation {kind!r}")


class _Remake(NamedTuple):
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


@contextlib.contextmanager
def saved_as_recompute(target: torch.Tensor, remake: Callable[[], torch.Tensor] | None) -> Iterator[None]:
    """Inside: autograd keeps no tensor that aliases `target`; the backward calls `remake()` (no grad) instead.

    Selective recompute for one tensor (Megatron's --recompute-modules moe_act and the like): every saved
    tensor sharing `target`'s storage (the tensor itself, or views such as a loop GEMM's per-expert
    slices) is packed as its view geometry, and unpacked as that view of one re-made tensor. Other
    saved tensors pass through. `remake=None`, or a target that does not own its whole storage (a view
    of something bigger), is a no-op.
    """
    if remake is None:
        yield
        return
    storage = target.untyped_storage()
    if not (target.is_contiguous() and target.storage_offset() == 0
            and storage.nbytes() == target.numel() * target.element_size()):
        yield
        return
    # The hooks live as long as the graph: they must not hold `target` itself, or nothing is saved.
    ptr, device, dtype = storage.data_ptr(), target.device, target.dtype
    made: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> Any:
        try:
            same = t.device == device and t.dtype == dtype and t.untyped_storage().data_ptr() == ptr
        except (RuntimeError, NotImplementedError):  # tensors without storage (fake, quantized wrappers)
            same = False
        return _Remake(t.size(), t.stride(), t.storage_offset()) if same else t

    def unpack(packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Remake):
            return packed
        if not made:
            with torch.no_grad():
                made.append(remake())
        full = made[0]
        return full.as_strided(packed.size, packed.stride, full.storage_offset() + packed.offset)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype GEMMs run in here: the autocast dtype when autocast is on, else the input's."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """x [M, K] · w [E, K, N] per group of rows ending at offs → [M, N]."""
    if x.dtype == torch.bfloat16:
        return F.grouped_mm(x, w, offs=offs)
    return _grouped_mm_outside_compile(x, w, offs)


@outside_compile
def _grouped_mm_outside_compile(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    # Eager grouped_mm runs fp32 (CPU tests), but torch.compile's meta kernel accepts only bf16 (torch 2.13).
    return F.grouped_mm(x, w, offs=offs)


# ---------------------------------------------------------------------------------------------
# Routing: which experts each token goes to.
# ---------------------------------------------------------------------------------------------


class Routing(NamedTuple):
    experts: torch.Tensor  # [T, k] int64: the experts of each token
    weights: torch.Tensor  # [T, k] fp32: combine weights (softmax over the k chosen logits)
    aux_loss: torch.Tensor  # scalar fp32, already × aux_loss_coeff (0 outside training)

    def rows(self, part: slice) -> Routing:
        """The routing of the tokens in `part` (views; the aux loss stays the whole batch's)."""
        return Routing(self.experts[part], self.weights[part], self.aux_loss)


def load_balancing_loss(logits: torch.Tensor, experts: torch.Tensor, top_k: int, coeff: float) -> torch.Tensor:
    """Switch-Transformer auxiliary loss as Megatron's `switch_load_balancing_loss_func` computes it.

    aux = coeff · E / (k · T²) · Σ_e (Σ_t p_te) · n_e, with p = softmax over all E logits and n_e the
    (token, slot) pairs routed to e before any capacity drop; n_e carries no gradient.
    Balanced routing gives aux = coeff.
    """
    num_tokens, num_experts = logits.shape
    probs = torch.softmax(logits.float(), dim=-1)
    flat = experts.reshape(-1)
    tokens_per_expert = torch.zeros(num_experts, device=logits.device).scatter_add_(
        0, flat, torch.ones(flat.shape, device=logits.device)
    )
    scale = num_experts * coeff / (top_k * num_tokens * num_tokens)
    return (probs.sum(dim=0) * tokens_per_expert).sum() * scale


def round_robin_experts(num_tokens: int, top_k: int, num_experts: int, device: torch.device) -> torch.Tensor:
    """Forced balance: token t goes to experts (t·k + j) mod E, j < k (distinct since k ≤ E)."""
    token = torch.arange(num_tokens, device=device).unsqueeze(1)
    return (token * top_k + torch.arange(top_k, device=device)) % num_experts


class Router(nn.Module):
    """Top-k softmax router in fp32 (a [E, h] GEMM; its FLOPs are not counted, as in Megatron)."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, cfg: RouterConfig, init_std: float):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.force_balance, self.aux_loss_coeff = cfg.force_balance, cfg.aux_loss_coeff
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size).normal_(0.0, init_std))

    def forward(self, x: torch.Tensor) -> Routing:
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.float(), self.weight.float())  # [T, E]
        if self.force_balance:
            experts = round_robin_experts(x.shape[0], self.top_k, self.num_experts, x.device)
        else:
            experts = logits.topk(self.top_k, dim=-1).indices
        # Softmax over the k chosen logits = top-k of the full softmax, renormalised (Megatron's default
        # topk-then-softmax; Qwen3's norm_topk_prob).
        weights = torch.softmax(logits.gather(1, experts), dim=-1)
        if self.training and torch.is_grad_enabled() and self.aux_loss_coeff > 0:
            aux = load_balancing_loss(logits, experts, self.top_k, self.aux_loss_coeff)
        else:
            aux = logits.new_zeros(())
        return Routing(experts, weights, aux)


# ---------------------------------------------------------------------------------------------
# Dispatch: where each (token, slot) pair's row goes in the expert-grouped buffer, and back.
# ---------------------------------------------------------------------------------------------


class DispatchPlan(NamedTuple):
    rows: torch.Tensor  # [M] token index of each permuted row (T = an appended zero row, in padded mode)
    counts: torch.Tensor  # [E] int64 rows per expert group
    offs: torch.Tensor  # [E] int32 cumulative group ends (grouped_mm's `offs`)
    pair_rows: torch.Tensor  # [T·k] permuted row of each (token, slot) pair (any row when dropped)
    weights: torch.Tensor  # [T, k] combine weights; dropped pairs are 0
    dropped: torch.Tensor  # scalar int64: (token, slot) pairs dropped by capacity
    padded: bool  # rows index x with a zero row appended
    row_pairs: torch.Tensor  # [M] (token, slot) pair of each permuted row; T·k for an empty padded slot
    keep: torch.Tensor | None  # [T, k] bool, pairs that kept their expert (None: dropless, all kept)
    capacity: int | None = None  # rows per expert when padded to capacity (group sizes known on the host)


def _positions(order: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse permutation: where each pair landed in `order` (a scatter, not a second sort)."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(n, device=order.device)
    return inverse


def plan_dispatch(routing: Routing, num_experts: int, capacity: int | None = None,
                  drop_policy: str = "probs", pad_to_capacity: bool = False) -> DispatchPlan:
    """Sort (token, slot) pairs by expert; with a capacity, keep the first `capacity` of each expert.

    drop_policy "probs" keeps an over-full expert's highest-weight pairs, "position" its earliest tokens
    (Megatron's moe_token_drop_policy). Ties keep token order (stable sorts), so plans are deterministic.
    """
    experts, weights = routing.experts, routing.weights
    num_tokens, top_k = experts.shape
    n = num_tokens * top_k
    dev = experts.device
    flat = experts.reshape(-1)
    # Token counts per expert via scatter_add: torch.bincount would sync (it reads the max on the host).
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    zero = torch.zeros((), dtype=torch.long, device=dev)

    if capacity is None:  # dropless
        order = torch.argsort(flat, stable=True)  # pairs grouped by expert, token order inside a group
        return DispatchPlan(order // top_k, counts, counts.cumsum(0).to(torch.int32), _positions(order, n),
                            weights, zero, padded=False, row_pairs=order, keep=None)

    if drop_policy == "probs":
        by_weight = torch.argsort(weights.reshape(-1), descending=True, stable=True)
        order = by_weight[torch.argsort(flat[by_weight], stable=True)]  # by expert, then by weight
    elif drop_policy == "position":
        order = torch.argsort(flat, stable=True)
    else:
        raise ValueError(f"unknown drop_policy {drop_policy!r}")
    sorted_experts = flat[order]
    group_start = counts.cumsum(0) - counts
    rank = torch.arange(n, device=dev) - group_start[sorted_experts]  # position inside the expert's group
    keep_sorted = rank < capacity
    kept_counts = counts.clamp(max=capacity)
    dropped = n - kept_counts.sum()
    keep = torch.empty_like(keep_sorted)
    keep[order] = keep_sorted
    weights = weights * keep.view(num_tokens, top_k)

    if pad_to_capacity:  # static shapes: every expert gets exactly `capacity` rows, empty ones are zeros
        slots = num_experts * capacity
        slot = torch.where(keep_sorted, sorted_experts * capacity + rank, slots)  # dropped → a dump slot
        rows = torch.full((slots + 1,), num_tokens, dtype=torch.long, device=dev)  # T = the zero row
        rows[slot] = order // top_k
        row_pairs = torch.full((slots + 1,), n, dtype=torch.long, device=dev)  # n = no pair (empty slot)
        row_pairs[slot] = order
        pair_rows = torch.empty_like(order)
        pair_rows[order] = slot.clamp(max=slots - 1)  # dropped pairs read any row with weight 0
        full = torch.full((num_experts,), capacity, dtype=torch.long, device=dev)
        return DispatchPlan(rows[:slots], full, full.cumsum(0).to(torch.int32), pair_rows, weights, dropped,
                            padded=True, row_pairs=row_pairs[:slots], keep=keep.view(num_tokens, top_k),
                            capacity=capacity)

    # Compact buffer of kept pairs only: its length is data dependent.
    num_kept = int(kept_counts.sum())  # SYNC: the kept count sizes the buffer (pad_to_capacity avoids it)
    kept_order = order[torch.argsort((~keep_sorted).to(torch.int8), stable=True)[:num_kept]]
    pair_rows = torch.zeros_like(order)  # dropped pairs read row 0 with weight 0
    pair_rows[kept_order] = torch.arange(num_kept, device=dev)
    return DispatchPlan(kept_order // top_k, kept_counts, kept_counts.cumsum(0).to(torch.int32), pair_rows,
                        weights, dropped, padded=False, row_pairs=kept_order, keep=keep.view(num_tokens, top_k))


def gather_rows(x: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    """The permuted buffer x[rows] (a zero row appended first in padded mode), outside autograd."""
    if plan.padded:
        x = torch.cat([x, x.new_zeros(1, x.shape[1])])
    return x.index_select(0, plan.rows)


class _Dispatch(torch.autograd.Function):
    """x[rows] → the expert-grouped buffer. Backward gathers each token's k row gradients through
    `pair_rows` and sums them: no scatter, no atomics, deterministic (plain indexing's backward is an
    accumulating index_put, a sort plus atomics)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
        ctx.plan, ctx.num_tokens = plan, x.shape[0]
        return gather_rows(x, plan)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        plan: DispatchPlan = ctx.plan
        top_k = plan.weights.shape[1]
        per_pair = grad.index_select(0, plan.pair_rows).view(ctx.num_tokens, top_k, grad.shape[-1])
        if plan.keep is not None:  # dropped pairs point at some row but must receive nothing
            per_pair = per_pair * plan.keep.unsqueeze(-1).to(per_pair.dtype)
        return per_pair.sum(1), None


class _Combine(torch.autograd.Function):
    """Σ_j w[t, j] · y[pair_rows[t, j]] for every token. Backward: each row's gradient is its pair's weight
    times its token's output gradient (a gather); the weights' gradient is a row-wise dot product."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, weights: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
        num_tokens, top_k = weights.shape
        per_pair = y.index_select(0, plan.pair_rows).view(num_tokens, top_k, y.shape[-1])
        ctx.plan = plan
        ctx.save_for_backward(y, weights)
        return torch.bmm(weights.to(y.dtype).unsqueeze(1), per_pair).squeeze(1)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        y, weights = ctx.saved_tensors
        plan: DispatchPlan = ctx.plan
        num_tokens, top_k = weights.shape
        grad_y = grad_weights = None
        if ctx.needs_input_grad[0]:
            pair_weight = torch.cat([weights.reshape(-1), weights.new_zeros(1)]).to(grad_out.dtype)
            source = torch.cat([grad_out, grad_out.new_zeros(1, grad_out.shape[1])]) if plan.padded else grad_out
            grad_y = source.index_select(0, plan.rows) * pair_weight.index_select(0, plan.row_pairs).unsqueeze(1)
        if ctx.needs_input_grad[1]:
            per_pair = y.index_select(0, plan.pair_rows).view(num_tokens, top_k, y.shape[-1])
            grad_weights = torch.bmm(per_pair, grad_out.unsqueeze(-1)).squeeze(-1).to(weights.dtype)
        return grad_y, grad_weights, None


def dispatch(x: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    """Gather token rows into expert-grouped order: [T, h] → [M, h]."""
    return _Dispatch.apply(x, plan)


def combine(y: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    """Weighted sum of each token's k expert outputs: [M, h] → [T, h] (gathers and a batched GEMV; no atomics)."""
    return _Combine.apply(y, plan.weights, plan)


# ---------------------------------------------------------------------------------------------
# Experts: E MLPs over the grouped buffer.
# ---------------------------------------------------------------------------------------------


class GroupedExperts(nn.Module):
    """E expert MLPs. Weights: w1 [E, up, h] (up = 2·ffn for SwiGLU: gate|up), w2 [E, h, ffn].

    `expert_weights="single"` keeps one parameter per projection, "discrete" one per expert (stacked for
    grouped_mm on every call). Both start from the same values for the same seed.
    `gemm="torch"`: torch.nn.functional.grouped_mm (one kernel per projection); "loop": one matmul per expert;
    "te": the same initial weights, to be replaced by `GroupedLinearExperts` on TE's GroupedLinear
    (`trainer.te_support.prepare_model` does that; this module refuses to run with gemm "te").
    `recompute_act` (set by selective recompute's moe_act) keeps the activation's output out of the saved
    tensors; `forward(..., remake_input=f)` (moe_dispatch) does the same for the input buffer.
    """

    def __init__(self, num_experts: int, hidden_size: int, ffn_hidden_size: int, activation: str,
                 init_std: float, output_std: float, expert_weights: str = "single", gemm: str = "torch"):
        super().__init__()
        if gemm not in ("torch", "loop", "te"):
            raise ValueError(f"model.moe.grouped_gemm: unknown {gemm!r} (torch, loop or te)")
        if gemm == "torch" and (hidden_size % 8 or ffn_hidden_size % 8):
            raise ValueError(
                f"grouped_mm needs 16-byte row strides in bf16: hidden_size ({hidden_size}) and the expert "
                f"ffn_hidden_size ({ffn_hidden_size}) must be multiples of 8; or use grouped_gemm: loop"
            )
        self.activation, self.gemm, self.num_experts = activation, gemm, num_experts
        self.recompute_act = False
        self.wgrad_backend: str | None = None  # set by trainer.grad_accum users: dW accumulated by "te"/"torch"
        up = 2 * ffn_hidden_size if activation == "swiglu" else ffn_hidden_size
        w1 = torch.empty(num_experts, up, hidden_size).normal_(0.0, init_std)
        w2 = torch.empty(num_experts, hidden_size, ffn_hidden_size).normal_(0.0, output_std)
        self.discrete = expert_weights == "discrete"
        if self.discrete:
            self.w1 = nn.ParameterList([nn.Parameter(w.clone()) for w in w1.unbind(0)])
            self.w2 = nn.ParameterList([nn.Parameter(w.clone()) for w in w2.unbind(0)])
        else:
            self.w1, self.w2 = nn.Parameter(w1), nn.Parameter(w2)

    def _stacked(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.discrete:
            return torch.stack(list(self.w1)).to(dtype), torch.stack(list(self.w2)).to(dtype)
        return self.w1.to(dtype), self.w2.to(dtype)

    def _stacked_dtype(self) -> torch.dtype:
        return (self.w1[0] if self.discrete else self.w1).dtype

    def forward(self, x: torch.Tensor, plan: DispatchPlan, remake_input: Callable | None = None) -> torch.Tensor:
        dtype = compute_dtype(x)
        x = x.to(dtype)
        if self.recompute_act or remake_input is not None:
            return self._forward_recomputing(x, plan, remake_input)
        if self.gemm == "torch":
            w1, w2 = self._weights(dtype)
            h = self._project(x, w1, plan.offs)
            return self._project(activate(h, self.activation), w2, plan.offs)
        self._refuse_te()
        sizes = plan.counts.tolist()  # SYNC: the loop needs the group sizes on the host
        outs = []
        for e, xe in enumerate(x.split(sizes)):
            h = xe @ self.w1[e].to(dtype).t()
            outs.append(activate(h, self.activation) @ self.w2[e].to(dtype).t())
        return torch.cat(outs)

    def _fused(self, dtype: torch.dtype) -> bool:
        """Gradient-accumulation fusion applies: a backend, one leaf per projection already in `dtype`, training."""
        return (self.wgrad_backend is not None and not self.discrete and self.w1.dtype == dtype
                and torch.is_grad_enabled())

    def _weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The [E, out, in] weights in `dtype`: the parameters themselves when fused (their main_grad is the target)."""
        return (self.w1, self.w2) if self._fused(dtype) else self._stacked(dtype)

    def _project(self, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        """x · w[e]ᵀ per group; with gradient-accumulation fusion dW goes into the weight's main_grad."""
        if self._fused(x.dtype):
            return grad_accum.grouped_mm(x, w, offs, self.wgrad_backend)
        return grouped_mm(x, w.transpose(-2, -1), offs)

    def _refuse_te(self) -> None:
        if self.gemm == "te":
            raise RuntimeError("model.moe.grouped_gemm: te runs on TE GroupedLinear experts; build the model "
                               "through the Trainer (trainer.te_support.prepare_model swaps them in)")

    @outside_compile  # saved-tensor hooks run eagerly
    def _forward_recomputing(self, x: torch.Tensor, plan: DispatchPlan, remake_input: Callable | None
                             ) -> torch.Tensor:
        """The same GEMMs, with the input buffer and/or the activation output re-made in the backward."""
        self._refuse_te()
        dtype = x.dtype
        if self.gemm == "torch":
            w1, w2 = self._weights(dtype)

            def project(inp: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
                return self._project(inp, w, plan.offs)
        else:
            sizes = plan.counts.tolist()  # SYNC: the loop needs the group sizes on the host
            w1, w2 = self.w1, self.w2

            def project(inp: torch.Tensor, w: Any) -> torch.Tensor:
                return torch.cat([xe @ w[e].to(dtype).t() for e, xe in enumerate(inp.split(sizes))])
        with saved_as_recompute(x, remake_input):
            h = project(x, w1)
        a, remake_a = activate_with_remake(h, self.activation)
        with saved_as_recompute(a, remake_a if self.recompute_act else None):
            return project(a, w2)


def stacked_expert_weights(model: nn.Module) -> set[int]:
    """ids of the single [E, ...] expert parameters of `model` (`expert_weights: single`).

    A norm over the gradients must split these per expert (`per_expert_grads`): reduced as one tensor, a
    stacked gradient sums its elements in another order than E separate ones, so `single` and `discrete`
    would differ by an ulp of the grad norm, hence of the clip factor, and the runs drift apart.
    """
    return {
        id(w)
        for m in model.modules()
        if isinstance(m, GroupedExperts) and not m.discrete
        for w in (m.w1, m.w2)
    }


def per_expert_grads(
    pairs: list[tuple[nn.Parameter, torch.Tensor | None]], stacked: set[int]
) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """(parameter, gradient) pairs with every stacked expert gradient as its E per-expert views (no copy),
    in expert order, exactly where `discrete` weights list their E parameters; None gradients left out."""
    out: list[tuple[nn.Parameter, torch.Tensor]] = []
    for param, grad in pairs:
        if grad is None:
            continue
        if id(param) in stacked:
            out += [(param, g) for g in grad.unbind(0)]
        else:
            out.append((param, grad))
    return out


class GroupedLinearExperts(nn.Module):
    """The expert MLPs of a GroupedExperts on a GroupedLinear class with Transformer Engine's interface:
    cls(num_gemms, in_features, out_features, bias=, params_dtype=, device=), parameters
    weight0..weight{E-1} [out, in], forward(x, m_splits: list[int]). Same weights, same maths; TE's class
    comes in from `trainer.te_support` (this module never imports TE)."""

    def __init__(self, experts: GroupedExperts, grouped_linear_cls: Any, device: Any = None):
        super().__init__()
        self.activation, self.num_experts = experts.activation, experts.num_experts
        self.recompute_act = experts.recompute_act
        w1, w2 = experts._stacked(experts._stacked_dtype())  # [E, up, h], [E, h, ffn]
        self.fc1 = grouped_linear_cls(self.num_experts, w1.shape[2], w1.shape[1], bias=False,
                                      params_dtype=w1.dtype, device=device)
        self.fc2 = grouped_linear_cls(self.num_experts, w2.shape[2], w2.shape[1], bias=False,
                                      params_dtype=w2.dtype, device=device)
        with torch.no_grad():
            for e in range(self.num_experts):
                getattr(self.fc1, f"weight{e}").copy_(w1[e])
                getattr(self.fc2, f"weight{e}").copy_(w2[e])

    def forward(self, x: torch.Tensor, plan: DispatchPlan, remake_input: Callable | None = None) -> torch.Tensor:
        x = x.to(compute_dtype(x))
        if plan.capacity is not None:  # pad_to_capacity: every group holds `capacity` rows, known on the host
            splits = [plan.capacity] * self.num_experts
        else:
            splits = plan.counts.tolist()  # SYNC: GroupedLinear takes the group sizes as a host list
        with saved_as_recompute(x, remake_input):
            h = self.fc1(x, splits)
        a, remake_a = activate_with_remake(h, self.activation)
        with saved_as_recompute(a, remake_a if self.recompute_act else None):
            return self.fc2(a, splits)


# ---------------------------------------------------------------------------------------------
# The layer: route, then dispatch → experts → combine chunk after chunk, then the shared experts.
# ---------------------------------------------------------------------------------------------


def token_chunks(num_tokens: int, chunk_tokens: int | None) -> list[slice]:
    """The token ranges of chunks of `chunk_tokens` tokens (None: one chunk of all tokens); the last may be shorter."""
    chunk = chunk_tokens or num_tokens
    return [slice(start, min(start + chunk, num_tokens)) for start in range(0, num_tokens, chunk)]


class TokenPipeline(Protocol):
    """What may carry a layer's routed tokens instead of `MoELayer.routed` (trainer.moe_pipeline.MoEPipeline)."""

    def __call__(self, layer: MoELayer, flat: torch.Tensor, routing: Routing) -> tuple[torch.Tensor, torch.Tensor]: ...


class MoELayer(nn.Module):
    """Router → dispatch → grouped experts → combine, plus optional shared experts on every token.

    All on this device, in order (`routed`): one dispatch, one pair of grouped GEMMs and one combine, or, with
    `dispatch_chunk_tokens`, one of each per chunk of that many tokens (capacity is then counted per chunk).
    `pipeline` is None here; trainer.parallelize installs one (trainer.moe_pipeline) where chunks overlap on a
    dispatcher stream or rows go to other ranks' experts; it computes what `routed` computes.
    `recompute_dispatch` (selective recompute's moe_dispatch) re-makes the permuted buffer in the backward.
    """

    def __init__(self, hidden_size: int, activation: str, cfg: MoEConfig, init_std: float, output_std: float,
                 shared: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        self.router = Router(hidden_size, cfg.num_experts, cfg.top_k, cfg.router, init_std)
        self.experts = GroupedExperts(cfg.num_experts, hidden_size, cfg.ffn_hidden_size, activation, init_std,
                                      output_std, cfg.expert_weights, cfg.grouped_gemm)
        self.shared = shared
        self.recompute_dispatch = False
        self.pipeline: TokenPipeline | None = None  # set from outside (trainer.parallelize)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, S, h] → (output [B, S, h], aux loss, dropped (token, slot) pairs)."""
        flat = x.reshape(-1, x.shape[-1])
        routing = self.router(flat)  # one router GEMM and one aux loss over all tokens, chunked or not
        if self.pipeline is not None:
            out, dropped = self.pipeline(self, flat, routing)
        else:
            out, dropped = self.routed(flat, routing)
        return out.view_as(x), routing.aux_loss, dropped

    def routed(self, flat: torch.Tensor, routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
        """Every chunk in turn (all tokens at once by default), then the shared experts on every token."""
        if self.cfg.dispatch_chunk_tokens is None:
            out, dropped = self.route_chunk(flat, routing)
        else:
            parts = token_chunks(flat.shape[0], self.cfg.dispatch_chunk_tokens)
            done = [self.route_chunk(flat[part], routing.rows(part)) for part in parts]
            out, dropped = torch.cat([y for y, _ in done]), torch.stack([d for _, d in done]).sum()
        if self.shared is not None:
            out = out + self.shared(flat)
        return out, dropped

    def route_chunk(self, tokens: torch.Tensor, routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
        """Dispatch → experts → combine of one chunk: (its output, its dropped pairs)."""
        plan = self.plan(routing)
        return combine(self.run_experts(dispatch(tokens, plan), plan, tokens), plan), plan.dropped

    def capacity(self, num_tokens: int) -> int | None:
        """Rows per expert of a chunk of `num_tokens` tokens (None: dropless)."""
        cfg = self.cfg
        if cfg.capacity_factor is None:
            return None
        return expert_capacity(num_tokens, cfg.top_k, cfg.num_experts, cfg.capacity_factor)

    def plan(self, routing: Routing) -> DispatchPlan:
        """Capacity (counted over this chunk's tokens) and the permutation of one chunk."""
        cfg = self.cfg
        capacity = self.capacity(routing.experts.shape[0])
        return plan_dispatch(routing, cfg.num_experts, capacity, cfg.drop_policy, cfg.pad_to_capacity)

    def chunk_counts(self, routing: Routing, parts: list[slice]) -> torch.Tensor:
        """[chunks, E] int64: the rows each chunk's plan gives each expert (its `plan(...).counts`: pairs routed
        there, at most the chunk's capacity), for all chunks at once (one scatter, no host sync)."""
        experts, num_experts = routing.experts, self.cfg.num_experts
        num_tokens, top_k = experts.shape
        size = parts[0].stop - parts[0].start  # every chunk but the last has this many tokens
        chunk = torch.arange(num_tokens, device=experts.device) // size
        index = (chunk.unsqueeze(1) * num_experts + experts).reshape(-1)
        counts = torch.zeros(len(parts) * num_experts, dtype=torch.long, device=experts.device)
        counts = counts.scatter_add_(0, index, torch.ones_like(index)).view(len(parts), num_experts)
        capacities = [self.capacity(part.stop - part.start) for part in parts]
        if capacities[0] is None:
            return counts
        limit = torch.full((len(parts), 1), capacities[0], dtype=torch.long, device=experts.device)
        limit[-1].fill_(capacities[-1])  # a fill, not a host→device copy (that would wait for the stream)
        return torch.minimum(counts, limit)

    def run_experts(self, buf: torch.Tensor, plan: DispatchPlan, tokens: torch.Tensor) -> torch.Tensor:
        """The experts over the permuted buffer `buf` of `tokens`; with moe_dispatch recompute the backward re-gathers it."""
        if self.recompute_dispatch:
            return self.experts(buf, plan, lambda: gather_rows(tokens, plan).to(buf.dtype))
        return self.experts(buf, plan)
