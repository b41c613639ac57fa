"""The MoE layer's chunked pipeline: dispatch chunks overlapped on a dispatcher stream, rows exchanged over EP.

trainer.parallelize installs a `MoEPipeline` on a `trainer.moe.MoELayer` (its `pipeline`) when the recipe asks
for chunked dispatch (`dispatch_chunk_tokens`), a dispatcher stream (`dispatch_overlap`, `dispatcher_sms`: an
ordinary side stream or a green context's, trainer.green) or expert parallelism (an `Exchange`:
trainer.expert_parallel.ExpertParallel). The layer's own `routed` computes the same thing in plain order.

Issue order (one CPU thread): with expert parallelism and data-dependent sizes (dropless, compact dropping),
every chunk's expert counts in one all-to-all (dispatcher stream) · shared experts (compute stream) · permute
chunk 0 (dispatcher) · then per chunk i: GEMMs i (compute, after permute i) · permute i+1 (dispatcher, beside
GEMMs i) · combine i (dispatcher, after GEMMs i, beside GEMMs i+1). Outputs join on the compute stream at the
end. CUDA events order the two streams; `record_stream` keeps the caching allocator from handing a buffer to one
stream while the other still reads it. With expert parallelism a chunk's all-to-alls run on the dispatcher
stream too: the send after its permutation, the receive before its combine, so chunk i+1's send and chunk i-1's
receive overlap chunk i's GEMMs. Without a dispatcher stream (the CPU, `dispatch_overlap: false`) the very same
code runs the chunks one after another.

The backward runs each op on its forward's stream, and autograd takes ready ops newest first, which interleaves
the chunks the same way: chunk i's receive-backward all-to-all and combine-backward (dispatcher) run beside
chunk i+1's expert-GEMM backward (compute), chunk i+1's send-backward beside chunk i's GEMM backward.
Device→host syncs: none here; the exchange marks its one per layer (the split sizes of dropless chunks).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

from trainer.eager import outside_compile
from trainer.moe import DispatchPlan, MoELayer, Routing, combine, dispatch, token_chunks


class Exchange(Protocol):
    """Sends a chunk's permuted rows to the ranks of their experts and brings the experts' outputs back."""

    def send(self, buf: torch.Tensor, plan: DispatchPlan) -> tuple[torch.Tensor, Any]:
        """(the rows this rank's experts compute, a batch record whose `.plan` groups them by local expert)."""
        ...

    def receive(self, y: torch.Tensor, batch: Any) -> torch.Tensor:
        """The local experts' outputs → the sending ranks' rows, in their permuted order."""
        ...

    # Optional: `exchange_counts(counts [chunks, E]) -> record`, every chunk's per-expert row counts sent at once;
    # where an exchange has it, the pipeline calls `send(buf, plan, record, chunk_index)` for data-dependent sizes.


# ---------------------------------------------------------------------------------------------
# Streams: each helper does nothing without a stream (the CPU, or no overlap).
# ---------------------------------------------------------------------------------------------


def _on(stream: Any) -> contextlib.AbstractContextManager:
    """Issue work on `stream` (None: where it is issued now: the CPU, or no overlap)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _record(stream: Any) -> Any:
    """An event marking the work issued on `stream` so far (None without a stream)."""
    return stream.record_event() if stream is not None else None


def _wait(stream: Any, event: Any) -> None:
    """Work issued on `stream` from now on waits for `event`."""
    if stream is not None:
        stream.wait_event(event)


def _used_by(stream: Any, *tensors: torch.Tensor | None) -> None:
    """Tensors made on one stream and read on `stream`: the caching allocator must not hand their memory to
    new work of the making stream before `stream`'s work queued so far is done (record_stream)."""
    if stream is not None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                t.record_stream(stream)


# ---------------------------------------------------------------------------------------------
# The pipeline.
# ---------------------------------------------------------------------------------------------


class _Permuted(NamedTuple):
    tokens: torch.Tensor  # the chunk's token rows (the moe_dispatch recompute re-gathers from them)
    plan: DispatchPlan  # the chunk's dispatch plan (over all E experts)
    buf: torch.Tensor  # the rows the experts compute: permuted, or received from the EP peers
    ready: Any  # event: `buf` is ready (None without a dispatcher stream)
    batch: Any  # the exchange's record of the received rows (None without expert parallelism)


@dataclass
class MoEPipeline:
    """Carries one MoE layer's routed tokens: chunk by chunk, on a dispatcher stream, through an exchange."""

    side: Any = None  # the dispatcher stream (torch.cuda.Stream or a green context's); None: no overlap
    exchange: Exchange | None = None  # expert parallelism: rows to their experts' ranks and back

    def __call__(
        self, layer: MoELayer, flat: torch.Tensor, routing: Routing
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(output [T, h] with the shared experts added, dropped (token, slot) pairs), as `layer.routed`."""
        if (self.side is not None and flat.is_cuda) or self.exchange is not None:
            return self._eager(layer, flat, routing)
        return self.run(layer, flat, routing, None)

    @outside_compile  # streams, events, record_stream and the EP all-to-alls run eagerly
    def _eager(
        self, layer: MoELayer, flat: torch.Tensor, routing: Routing
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.run(layer, flat, routing, self.side if flat.is_cuda else None)

    def run(
        self, layer: MoELayer, flat: torch.Tensor, routing: Routing, side: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chunks of `dispatch_chunk_tokens` tokens; with a `side` stream the dispatcher work overlaps the GEMMs."""
        main = torch.cuda.current_stream(flat.device) if side is not None else None
        parts = token_chunks(flat.shape[0], layer.cfg.dispatch_chunk_tokens)
        if side is not None:
            side.wait_stream(main)  # x and the routing are ready before the first permutation
            _used_by(side, flat, routing.experts, routing.weights)
        counts = None
        exchange_counts = getattr(self.exchange, "exchange_counts", None)  # optional in an Exchange
        if exchange_counts is not None and not layer.cfg.pad_to_capacity:  # sizes known only on the device
            with _on(side):  # one count all-to-all for every chunk, issued first; read before the first send
                counts = exchange_counts(layer.chunk_counts(routing, parts))
        shared = layer.shared(flat) if layer.shared is not None else None  # compute stream, beside permute 0
        pending = self._permute(layer, flat, routing, parts, 0, side, main, counts)
        outs, dropped = [], []
        for i in range(len(parts)):
            chunk = pending
            _wait(main, chunk.ready)
            y = self._experts(layer, chunk)
            done = _record(main)
            _used_by(side, y)
            if i + 1 < len(parts):  # beside these GEMMs
                pending = self._permute(layer, flat, routing, parts, i + 1, side, main, counts)
            outs.append(self._combine(y, chunk, done, side))
            dropped.append(chunk.plan.dropped)
            _used_by(main, outs[-1])
        if side is not None:
            main.wait_stream(side)
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        if shared is not None:
            out = out + shared
        return out, dropped[0] if len(dropped) == 1 else torch.stack(dropped).sum()

    def _permute(
        self, layer: MoELayer, flat: torch.Tensor, routing: Routing, parts: list[slice], i: int, side: Any,
        main: Any, counts: Any
    ) -> _Permuted:
        """Plan and permute chunk i on the dispatcher stream, then send its rows (EP); record when it is ready."""
        with _on(side):
            tokens = flat[parts[i]]
            plan = layer.plan(routing.rows(parts[i]))
            buf, batch = dispatch(tokens, plan), None
            if self.exchange is not None:  # rows to their experts' ranks (all-to-all on this stream)
                more = (counts, i) if counts is not None else ()
                buf, batch = self.exchange.send(buf, plan, *more)
            ready = _record(side)
        local = batch.plan if batch is not None else plan
        _used_by(main, buf, *(t for t in (*plan, *local) if isinstance(t, torch.Tensor)))
        return _Permuted(tokens, plan, buf, ready, batch)

    @staticmethod
    def _experts(layer: MoELayer, chunk: _Permuted) -> torch.Tensor:
        """The chunk's expert GEMMs, on the compute stream."""
        if chunk.batch is None:
            return layer.run_experts(chunk.buf, chunk.plan, chunk.tokens)
        # The received buffer cannot be re-made locally: moe_dispatch recompute does not apply.
        return layer.experts(chunk.buf, chunk.batch.plan)

    def _combine(self, y: torch.Tensor, chunk: _Permuted, done: Any, side: Any) -> torch.Tensor:
        """After the chunk's GEMMs (`done`): outputs back to their tokens' ranks (EP), then combined, on `side`."""
        with _on(side):
            _wait(side, done)
            if chunk.batch is not None:  # outputs back to the ranks that own the tokens
                y = self.exchange.receive(y, chunk.batch)
            return combine(y, chunk.plan)
