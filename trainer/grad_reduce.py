"""Gradients DDP does not reduce: expert-parallel experts and gradient-accumulation-fused weights, reduced here.

DDP learns from autograd that a gradient is ready; two kinds of parameters never tell it:
- expert-parallel experts (trainer.expert_parallel): each EP rank holds other experts, so their gradients are
  summed over the expert-data-parallel group (the ranks holding the same experts) only;
- fused weights (trainer.grad_accum): their weight-gradient GEMMs add into `main_grad` (which is also `.grad`)
  and return nothing to autograd.
Both stay out of DDP (`trainer.parallelize`) and are reduced here, after the step's last micro-batch, into the
average DDP would have made: summed over their group, divided by the data-parallel size.

A fused weight's all-reduce starts from inside the last micro-batch's backward, as soon as the last fused GEMM
reading it has accumulated (grad_accum tells `used` in each forward and `accumulated` in each backward; when the
counts match, nothing more will add into it), so it overlaps the rest of that backward, as DDP's buckets do. What
never started (non-fused experts, TE layers, a weight whose forward ran again inside the backward under full
recompute) is all-reduced at `finish`, one flat all-reduce per group and dtype. A group of one rank (EP = DP:
expert-data-parallel size 1) is no collective at all; the division by the data-parallel size stays.

On the GPU the all-reduces run on NCCL's stream; `finish` makes the current stream wait for them (no host sync).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer import grad_accum


@dataclass
class Reduction:
    """Parameters reduced together: summed over `group` (None: one replica, nothing to sum), ÷ `divisor`."""

    params: list[nn.Parameter]
    group: Any
    divisor: float
    overlap: set[int] = field(default_factory=set)  # ids of the fused weights whose reduce may start in backward


class OutsideDDP:
    """Reduces the `Reduction`s after the last micro-batch; fused weights start theirs inside its backward."""

    def __init__(self, reductions: list[Reduction], fused: list[nn.Parameter]):
        self.reductions = [r for r in reductions if r.params]
        fused_ids = {id(p) for p in fused}
        self._group_of: dict[int, Reduction] = {}
        for r in self.reductions:
            for p in r.params:
                self._group_of[id(p)] = r
                if id(p) in fused_ids and r.group is not None:
                    r.overlap.add(id(p))
                    grad_accum.watch(p, _used(self), _accumulated(self))
        self._armed = False
        self._uses: dict[int, int] = {}
        self._started: dict[int, Any] = {}  # id(weight) → its all-reduce's work
        self.collectives = 0  # all-reduces issued so far (a group of one rank issues none)
        self.overlapped = 0  # of which started inside a backward

    @property
    def params(self) -> list[nn.Parameter]:
        return [p for r in self.reductions for p in r.params]

    def arm(self) -> None:
        """Before the last micro-batch's forward: count the fused GEMMs' uses from now on."""
        self._armed, self._uses, self._started = True, {}, {}

    def used(self, weight: nn.Parameter) -> None:
        if self._armed and id(weight) in self._group_of:
            self._uses[id(weight)] = self._uses.get(id(weight), 0) + 1

    def accumulated(self, weight: nn.Parameter) -> None:
        key = id(weight)
        if not self._armed or key not in self._uses or key in self._started:
            return
        self._uses[key] -= 1
        if self._uses[key] == 0:  # the last accumulation into it: start its all-reduce beside the backward
            group = self._group_of[key].group
            self._started[key] = dist.all_reduce(weight.main_grad, group=group, async_op=True)
            self.collectives += 1
            self.overlapped += 1

    def finish(self) -> None:
        """After the last backward: wait for the started all-reduces, all-reduce the rest, divide."""
        self._armed = False
        for r in self.reductions:
            rest = [p.grad for p in r.params if p.grad is not None and id(p) not in self._started]
            if r.group is not None and rest:
                self.collectives += _all_reduce_flat(rest, r.group)
        for work in self._started.values():
            work.wait()
        self._started, self._uses = {}, {}
        for r in self.reductions:
            grads = [p.grad for p in r.params if p.grad is not None]
            if grads and r.divisor != 1:
                torch._foreach_div_(grads, float(r.divisor))


def data_parallel_group(world_size: int) -> Any:
    """A process group of every rank (TP = PP = CP = 1: all are data-parallel ranks), its own communicator: the
    fused weights' all-reduces start from inside the backward, beside DDP's on the default group."""
    return dist.new_group(list(range(world_size)))


def _used(reducer: OutsideDDP):
    return lambda weight: reducer.used(weight)


def _accumulated(reducer: OutsideDDP):
    return lambda weight: reducer.accumulated(weight)


def _all_reduce_flat(grads: list[torch.Tensor], group: Any) -> int:
    """Sum `grads` over `group`: one all-reduce per dtype of their concatenation, copied back; returns how many."""
    dtypes = {g.dtype for g in grads}
    for dtype in dtypes:
        same = [g for g in grads if g.dtype == dtype]
        if len(same) == 1:
            dist.all_reduce(same[0], group=group)
            continue
        flat = torch.cat([g.reshape(-1) for g in same])
        dist.all_reduce(flat, group=group)
        torch._foreach_copy_(same, [f.view_as(g) for f, g in zip(flat.split([g.numel() for g in same]), same,
                                                                   strict=True)])
    return len(dtypes)
