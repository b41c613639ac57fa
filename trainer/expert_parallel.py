"""Expert parallelism: experts sharded over an EP group, tokens sent to their experts' ranks by all-to-all.

Layout (Megatron's default order with TP = PP = CP = 1): EP groups are runs of `EP` consecutive ranks,
expert-data-parallel groups are the ranks with the same EP rank ({j, j+EP, j+2·EP, ...}). Every rank
routes its own tokens with the replicated router and drops over-capacity pairs locally (capacity counts
its own tokens, as in Megatron), so routing and dropping are those of EP = 1; then

    dispatch:  permuted rows [expert e, row]  →  all-to-all (expert e lives on rank e // E_local)
               →  received rows [source rank, local expert, row]  →  regroup to [local expert, source, row]
    combine:   the inverse, row for row.

With `pad_to_capacity` every (rank, expert) block is `capacity` rows: equal splits, the regroup is a
transpose, and nothing syncs with the host. Dropless or compact dropping needs the split sizes on the host:
the pipeline exchanges the per-expert counts of ALL the layer's chunks in one all-to-all right after routing
(`exchange_counts`), copies the split sizes to pinned host memory without waiting, and reads them once, just
before the first chunk's rows go out (one host sync per layer and micro-batch, in the forward only: the
backward reuses the splits), while the GPU still has the first chunk's permutation queued.

Gradients: expert parameters are outside DDP; after the last micro-batch their gradients (which already
hold every EP peer's tokens, brought back by the all-to-all's backward) are summed over the
expert-data-parallel group and divided by DP (trainer.grad_reduce), which equals DDP's average over all ranks
for EP = 1; with EP = DP that group is one rank and there is no collective. The global gradient norm adds the
experts' squares summed over the EP group.
On a GPU with `dispatcher_sms`, the EP group's NCCL communicator is limited to that many CTAs (NCCL's
max_ctas), as the permutation work is limited to the green context's SMs. That caps how many SMs the all-to-all
takes; whether its kernels also run inside the green context depends on torch issuing them on the current
stream (recent torch does for blocking collectives; older releases use NCCL's own stream).

Applied from outside: trainer.parallelize.apply_expert_parallel shards every MoE layer's experts
(`ExpertParallel.shard`) and gives the layer's pipeline (trainer.moe_pipeline) this object as its exchange
(`send`, `receive`), which it calls on the dispatcher stream, chunk by chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.moe import DispatchPlan, GroupedExperts


def _exchange(x: torch.Tensor, group: Any, out_splits: list[int] | None, in_splits: list[int] | None
              ) -> torch.Tensor:
    """One all_to_all_single of the rows of `x` (splits None = equal), outside autograd."""
    rows = sum(out_splits) if out_splits is not None else x.shape[0]
    out = x.new_empty((rows, *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """Rows to the ranks of the group (splits None = equal); the backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, out_splits: list[int] | None, in_splits: list[int] | None):
        ctx.group, ctx.out_splits, ctx.in_splits = group, out_splits, in_splits
        return _exchange(x, group, out_splits, in_splits)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _exchange(grad, ctx.group, ctx.in_splits, ctx.out_splits), None, None, None


class _Permute(torch.autograd.Function):
    """x[order] with a gather for the backward too (grad[inverse]): no index_put, no atomics."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor):
        ctx.save_for_backward(order, inverse)
        return x.index_select(0, order)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        order, inverse = ctx.saved_tensors
        return _Permute.apply(grad, inverse, order), None, None


def _inverse(order: torch.Tensor) -> torch.Tensor:
    """The inverse permutation of `order` (a scatter)."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


class ChunkCounts:
    """Every chunk's split sizes of one MoE layer, exchanged at once: `received` [chunk, src, local expert] rows
    on the device, the host splits copied without waiting and read on first use (`splits`)."""

    def __init__(self, received: torch.Tensor, sizes: torch.Tensor):
        self.received = received  # [n_chunks, EP·local]: rows each source rank sends my experts, per chunk
        self._sizes = sizes  # [n_chunks, 2, EP]: (rows I send each rank, rows I get from each rank)
        self._host: list | None = None
        self._event = None
        if sizes.is_cuda:
            self._pinned = torch.empty(sizes.shape, dtype=sizes.dtype, pin_memory=True)
            self._pinned.copy_(sizes, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(sizes.device))

    def splits(self, chunk: int) -> tuple[list[int], list[int]]:
        """(in_splits: rows sent to each rank, out_splits: rows received from each) of chunk `chunk`."""
        if self._host is None:
            if self._event is not None:
                self._event.synchronize()  # SYNC: once per layer and micro-batch (all_to_all_single takes host splits)
                self._host = self._pinned.tolist()
            else:
                self._host = self._sizes.tolist()  # the CPU: already there
        send, recv = self._host[chunk]
        return send, recv


class LocalBatch:
    """The rows this rank's experts compute, and how to send their outputs back."""

    def __init__(self, plan: DispatchPlan, splits: tuple[list[int], list[int]] | None,
                 order: torch.Tensor | None, inverse: torch.Tensor | None):
        self.plan, self.splits, self.order, self.inverse = plan, splits, order, inverse


@dataclass
class ExpertParallel:
    """This rank's place in the EP layout, and the exchange of one MoE layer's rows."""

    size: int
    rank: int  # rank inside the EP group
    dp: int  # data-parallel size (the gradient average is over DP ranks)
    group: Any  # the EP process group
    expert_dp_group: Any  # the ranks holding the same experts (None when DP == EP)
    count_exchanges: int = 0  # count all-to-alls issued (dropless / compact dropping: one per layer and micro-batch)

    def local_experts(self, num_experts: int) -> slice:
        """The experts this rank holds: a run of E / EP consecutive ones."""
        per = num_experts // self.size
        return slice(self.rank * per, (self.rank + 1) * per)

    def shard(self, experts: GroupedExperts) -> list[nn.Parameter]:
        """Keep only this rank's slice of `experts` (drawn in full first, so every EP layout starts from the
        weights EP = 1 has); returns the kept parameters."""
        part = self.local_experts(experts.num_experts)
        if experts.discrete:
            experts.w1 = nn.ParameterList(list(experts.w1)[part])
            experts.w2 = nn.ParameterList(list(experts.w2)[part])
            params = list(experts.w1) + list(experts.w2)
        else:
            experts.w1 = nn.Parameter(experts.w1.detach()[part].clone())
            experts.w2 = nn.Parameter(experts.w2.detach()[part].clone())
            params = [experts.w1, experts.w2]
        experts.num_experts = part.stop - part.start
        return params

    # -- the exchange ----------------------------------------------------------------------------------

    def exchange_counts(self, counts: torch.Tensor) -> ChunkCounts:
        """One all-to-all of every chunk's per-expert row counts ([n_chunks, E], this rank's pairs kept per chunk):
        what each rank will receive, and the split sizes of every chunk's row exchange."""
        chunks, num_experts = counts.shape
        local = num_experts // self.size
        self.count_exchanges += 1
        by_rank = counts.view(chunks, self.size, local).transpose(0, 1).contiguous()  # [dest, chunk, local]
        got = _exchange(by_rank, self.group, None, None)  # [src, chunk, local]: rows src sends my experts
        received = got.transpose(0, 1).reshape(chunks, self.size * local)
        sizes = torch.stack([by_rank.sum(2).t(), got.sum(2).t()], dim=1)  # [chunk, (send, recv), rank]
        return ChunkCounts(received, sizes)

    def send(self, buf: torch.Tensor, plan: DispatchPlan, counts: ChunkCounts | None = None, chunk: int = 0
             ) -> tuple[torch.Tensor, LocalBatch]:
        """Permuted rows of all E experts → the rows of this rank's experts, grouped by local expert.

        `counts` (dropless or compact dropping): the layer's counts from `exchange_counts`, `chunk` this chunk's
        index in them; None exchanges this chunk's counts here (one count all-to-all and a host sync)."""
        num_experts = plan.counts.shape[0]
        local = num_experts // self.size
        if plan.capacity is not None:  # static shapes: equal splits, a transpose
            cap = plan.capacity
            got = _AllToAll.apply(buf, self.group, None, None)  # [src, local expert, cap]
            rows = got.view(self.size, local, cap, -1).transpose(0, 1).reshape(-1, buf.shape[-1])
            counts = torch.full((local,), self.size * cap, dtype=torch.long, device=buf.device)
            local_plan = plan._replace(counts=counts, offs=counts.cumsum(0).to(torch.int32),
                                       capacity=self.size * cap)
            return rows, LocalBatch(local_plan, None, None, None)
        # Data-dependent sizes: the per-expert counts (exchanged for the whole layer, or here), then the rows.
        if counts is None:
            counts, chunk = self.exchange_counts(plan.counts.unsqueeze(0)), 0
        received = counts.received[chunk]  # [src · local]: rows src sends my experts
        in_splits, out_splits = counts.splits(chunk)
        got = _AllToAll.apply(buf, self.group, out_splits, in_splits)  # [src, local expert, row]
        expert_of_block = torch.arange(self.size * local, device=buf.device) % local
        expert_of_row = torch.repeat_interleave(expert_of_block, received, output_size=sum(out_splits))
        order = torch.argsort(expert_of_row, stable=True)  # [local expert, src, row]
        inverse = _inverse(order)
        counts = received.view(self.size, local).sum(0)
        local_plan = plan._replace(counts=counts, offs=counts.cumsum(0).to(torch.int32), capacity=None)
        return _Permute.apply(got, order, inverse), LocalBatch(local_plan, (out_splits, in_splits), order, inverse)

    def receive(self, y: torch.Tensor, batch: LocalBatch) -> torch.Tensor:
        """The local experts' outputs → back to the ranks that sent the rows, in their permuted order."""
        if batch.splits is None:
            local = batch.plan.counts.shape[0]
            cap = batch.plan.capacity // self.size
            rows = y.view(local, self.size, cap, -1).transpose(0, 1).reshape(-1, y.shape[-1])
            return _AllToAll.apply(rows, self.group, None, None)
        out_splits, in_splits = batch.splits
        rows = _Permute.apply(y, batch.inverse, batch.order)
        return _AllToAll.apply(rows, self.group, in_splits, out_splits)

    # -- gradients -------------------------------------------------------------------------------------

    def global_norm(self, dense: list[torch.Tensor], experts: list[torch.Tensor]) -> torch.Tensor:
        """L2 norm over all parameters: replicated ones once, each EP rank's experts added."""
        device = (dense or experts)[0].device
        dense_sq = _norm_sq(dense, device)
        expert_sq = _norm_sq(experts, device)
        dist.all_reduce(expert_sq, group=self.group)
        return (dense_sq + expert_sq).sqrt().float()


def _norm_sq(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Σ g² in fp64 (a squared fp32 norm would overflow above ~1.8e19 and skip a step EP = 1 takes)."""
    if not grads:
        return torch.zeros((), dtype=torch.float64, device=device)
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=None).double().square()


def build(ep_size: int, world_size: int, rank: int, device: torch.device, dispatcher_sms: int | None = None
          ) -> ExpertParallel | None:
    """Create the EP and expert-DP process groups (every rank creates every group, in the same order)."""
    if ep_size == 1:
        return None
    if not dist.is_initialized():
        raise RuntimeError(f"parallel.expert={ep_size} needs torch.distributed (run under torchrun)")
    mine = expert_dp = None
    options = _nccl_options(dispatcher_sms) if device.type == "cuda" else None
    for first in range(0, world_size, ep_size):
        ranks = list(range(first, first + ep_size))
        group = dist.new_group(ranks, pg_options=options) if options is not None else dist.new_group(ranks)
        if rank in ranks:
            mine = group
    dp = world_size  # TP = PP = CP = 1: every rank is a data-parallel rank
    if world_size > ep_size:
        for j in range(ep_size):
            ranks = list(range(j, world_size, ep_size))
            group = dist.new_group(ranks)
            if rank in ranks:
                expert_dp = group
    return ExpertParallel(ep_size, rank % ep_size, dp, mine, expert_dp)


def _nccl_options(dispatcher_sms: int | None) -> Any:
    """NCCL communicator config limiting the EP all-to-all to `dispatcher_sms` CTAs (None: NCCL's default)."""
    if dispatcher_sms is None:
        return None
    try:
        options = dist.ProcessGroupNCCL.Options()
        options.config.max_ctas = dispatcher_sms
    except (AttributeError, RuntimeError) as err:  # a torch built without NCCL, or an NCCL without config
        print(f"model.moe.dispatcher_sms: the EP all-to-all is not limited to {dispatcher_sms} CTAs here ({err})",
              flush=True)
        return None
    return options
