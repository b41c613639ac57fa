"""Mixture-of-experts MLP: top-k router, token dispatch (argsort permutation, capacity, drops), grouped experts.

Routing (which experts a token goes to, with what weight) is kept apart from dispatch
(where each token's row goes in the permuted buffer) and from expert computation
(grouped GEMMs over that buffer), so that expert parallelism, chunked dispatch and other
GEMM back-ends can replace one piece without touching the others.

Device→host syncs: none in the default (dropless, grouped_mm) path. Two opt-in paths
sync, each marked where it happens: capacity dropping without `pad_to_capacity`
(the compact buffer's size is data-dependent) and the `loop` GEMM fallback.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from trainer.recipe import MoEConfig, RouterConfig


def activate(h: torch.Tensor, kind: str) -> torch.Tensor:
    """MLP activation; for SwiGLU `h` holds [gate | up] along the last dim."""
    if kind == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up
    if kind == "squared_relu":
        return F.relu(h).square()
    raise ValueError(f"unknown activation {kind!r}")


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


@torch.compiler.disable
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


def expert_capacity(num_tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Megatron's `get_capacity`: ceil(T·k / E · factor) rows per expert."""
    return math.ceil(num_tokens * top_k / num_experts * capacity_factor)


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
                            padded=True, row_pairs=row_pairs[:slots], keep=keep.view(num_tokens, top_k))

    # Compact buffer of kept pairs only: its length is data dependent.
    num_kept = int(kept_counts.sum())  # SYNC: the kept count sizes the buffer (pad_to_capacity avoids it)
    kept_order = order[torch.argsort((~keep_sorted).to(torch.int8), stable=True)[:num_kept]]
    pair_rows = torch.zeros_like(order)  # dropped pairs read row 0 with weight 0
    pair_rows[kept_order] = torch.arange(num_kept, device=dev)
    return DispatchPlan(kept_order // top_k, kept_counts, kept_counts.cumsum(0).to(torch.int32), pair_rows,
                        weights, dropped, padded=False, row_pairs=kept_order, keep=keep.view(num_tokens, top_k))


class _Dispatch(torch.autograd.Function):
    """x[rows] → the expert-grouped buffer. Backward gathers each token's k row gradients through
    `pair_rows` and sums them: no scatter, no atomics, deterministic (plain indexing's backward is an
    accumulating index_put, a sort plus atomics)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
        ctx.plan, ctx.num_tokens = plan, x.shape[0]
        if plan.padded:
            x = torch.cat([x, x.new_zeros(1, x.shape[1])])
        return x.index_select(0, plan.rows)

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
    `gemm="torch"`: torch.nn.functional.grouped_mm (one kernel per projection); "loop": one matmul per expert.
    """

    def __init__(self, num_experts: int, hidden_size: int, ffn_hidden_size: int, activation: str,
                 init_std: float, output_std: float, expert_weights: str = "single", gemm: str = "torch"):
        super().__init__()
        if gemm not in ("torch", "loop"):
            raise NotImplementedError(f"model.moe.grouped_gemm={gemm!r} is not implemented yet (use torch or loop)")
        if gemm == "torch" and (hidden_size % 8 or ffn_hidden_size % 8):
            raise ValueError(
                f"grouped_mm needs 16-byte row strides in bf16: hidden_size ({hidden_size}) and the expert "
                f"ffn_hidden_size ({ffn_hidden_size}) must be multiples of 8; or use grouped_gemm: loop"
            )
        self.activation, self.gemm, self.num_experts = activation, gemm, num_experts
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

    def forward(self, x: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
        dtype = compute_dtype(x)
        x = x.to(dtype)
        if self.gemm == "torch":
            w1, w2 = self._stacked(dtype)
            h = grouped_mm(x, w1.transpose(-2, -1), plan.offs)
            return grouped_mm(activate(h, self.activation), w2.transpose(-2, -1), plan.offs)
        sizes = plan.counts.tolist()  # SYNC: the loop needs the group sizes on the host
        outs = []
        for e, xe in enumerate(x.split(sizes)):
            h = xe @ self.w1[e].to(dtype).t()
            outs.append(activate(h, self.activation) @ self.w2[e].to(dtype).t())
        return torch.cat(outs)


class MoELayer(nn.Module):
    """Router → dispatch → grouped experts → combine, plus optional shared experts on every token.

    With `dispatch_chunk_tokens`, tokens are dispatched, computed and combined chunk by chunk (capacity is
    then per chunk). The chunks run one after another for now: overlapping chunk i+1's permutation with
    chunk i's GEMMs (a second stream, or a green context of `dispatcher_sms` SMs) slots in at this loop.
    """

    def __init__(self, hidden_size: int, activation: str, cfg: MoEConfig, init_std: float, output_std: float,
                 shared: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        self.router = Router(hidden_size, cfg.num_experts, cfg.top_k, cfg.router, init_std)
        self.experts = GroupedExperts(cfg.num_experts, hidden_size, cfg.ffn_hidden_size, activation, init_std,
                                      output_std, cfg.expert_weights, cfg.grouped_gemm)
        self.shared = shared

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, S, h] → (output [B, S, h], aux loss, dropped (token, slot) pairs)."""
        flat = x.reshape(-1, x.shape[-1])
        routing = self.router(flat)  # one router GEMM and one aux loss over all tokens, chunked or not
        chunk = self.cfg.dispatch_chunk_tokens or flat.shape[0]
        outs, dropped = [], []
        for start in range(0, flat.shape[0], chunk):
            part = slice(start, start + chunk)
            out, drop = self._routed(flat[part], Routing(routing.experts[part], routing.weights[part], routing.aux_loss))
            outs.append(out)
            dropped.append(drop)
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view_as(x), routing.aux_loss, dropped[0] if len(dropped) == 1 else torch.stack(dropped).sum()

    def _routed(self, flat: torch.Tensor, routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
        """Dispatch → experts → combine for one chunk of tokens (capacity counts this chunk's tokens)."""
        cfg = self.cfg
        capacity = None
        if cfg.capacity_factor is not None:
            capacity = expert_capacity(flat.shape[0], cfg.top_k, cfg.num_experts, cfg.capacity_factor)
        plan = plan_dispatch(routing, cfg.num_experts, capacity, cfg.drop_policy, cfg.pad_to_capacity)
        return combine(self.experts(dispatch(flat, plan), plan), plan), plan.dropped
