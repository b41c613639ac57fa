"""The MoE pipeline applied from outside (trainer.parallelize): it computes what the bare layer computes, on the CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import trainer_helpers  # noqa: F401 (puts the checkout on sys.path)

from trainer.expert_parallel import ExpertParallel, LocalBatch
from trainer.model import MLP
from trainer.moe import DispatchPlan, MoELayer
from trainer.moe_pipeline import MoEPipeline
from trainer.parallelize import apply_expert_parallel, attach_dispatcher
from trainer.recipe import MoEConfig, RouterConfig


def _layer(shared: bool = True, **moe: Any) -> MoELayer:
    torch.manual_seed(3)
    cfg = MoEConfig(num_experts=4, top_k=2, ffn_hidden_size=16, **moe)
    mlp = MLP(8, 16, "swiglu", 0.3, 0.3) if shared else None
    return MoELayer(8, "swiglu", cfg, init_std=0.3, output_std=0.3, shared=mlp)


def _run(layer: MoELayer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Output, dropped pairs and the gradients of (input, every parameter) for a fixed upstream gradient."""
    x = x.clone().requires_grad_()
    out, aux, dropped = layer(x)
    upstream = torch.linspace(-1, 1, out.numel()).view_as(out)
    grads = torch.autograd.grad((out * upstream).sum() + aux, [x, *layer.parameters()])
    return out.detach(), dropped, list(grads)


def _assert_same(a: tuple, b: tuple) -> None:
    assert torch.equal(a[0], b[0]) and int(a[1]) == int(b[1])  # outputs bitwise, same drops
    for i, (u, v) in enumerate(zip(a[2], b[2], strict=True)):
        torch.testing.assert_close(u, v, atol=1e-6, rtol=1e-5, msg=lambda m, i=i: f"gradient {i}: {m}")


def test_attach_dispatcher_installs_the_pipeline_only_where_needed():
    plain, chunked = _layer(), _layer(dispatch_chunk_tokens=4)
    # The default path stays the layer's own; a chunked layer gets the pipeline (without a stream on the CPU).
    assert attach_dispatcher(plain, None) == 1 and plain.pipeline is None
    assert attach_dispatcher(chunked, None) == 1 and chunked.pipeline == MoEPipeline()
    stream = object()  # a dispatcher stream's stand-in: only stored here
    attach_dispatcher(plain, stream)
    assert plain.pipeline == MoEPipeline(side=stream)
    attach_dispatcher(plain, None)
    assert plain.pipeline is None


@pytest.mark.parametrize(
    "moe",
    [
        {"dispatch_chunk_tokens": 4},
        {"dispatch_chunk_tokens": 5, "grouped_gemm": "loop"},
        {
            "dispatch_chunk_tokens": 4,
            "capacity_factor": 0.5,
            "drop_policy": "position",
            "router": RouterConfig(force_balance=True),
        },
        {"dispatch_chunk_tokens": 4, "capacity_factor": 1.0, "pad_to_capacity": True},
    ],
)
def test_pipeline_equals_the_layers_own_chunk_loop(moe):
    x = torch.randn(2, 7, 8)  # 14 tokens
    ref = _run(_layer(**moe), x)
    piped = _layer(**moe)
    attach_dispatcher(piped, None)
    assert piped.pipeline is not None
    _assert_same(ref, _run(piped, x))


def test_recompute_dispatch_through_the_pipeline_equals_without():
    x = torch.randn(2, 7, 8)
    ref = _run(_layer(dispatch_chunk_tokens=4), x)
    piped = _layer(dispatch_chunk_tokens=4)
    piped.recompute_dispatch = True
    attach_dispatcher(piped, None)
    _assert_same(ref, _run(piped, x))


class Loopback:
    """An exchange to oneself (EP = 1's all-to-all): the rows stay, every call is counted."""

    def __init__(self) -> None:
        self.sent = self.received = 0

    def send(self, buf: torch.Tensor, plan: DispatchPlan) -> tuple[torch.Tensor, LocalBatch]:
        self.sent += 1
        return buf * 1, LocalBatch(plan, None, None, None)

    def receive(self, y: torch.Tensor, batch: LocalBatch) -> torch.Tensor:
        self.received += 1
        return y * 1


@pytest.mark.parametrize("chunk", [None, 4])
def test_pipeline_with_an_exchange_sends_and_receives_each_chunk(chunk):
    x = torch.randn(2, 7, 8)
    ref = _run(_layer(dispatch_chunk_tokens=chunk), x)
    piped, loopback = _layer(dispatch_chunk_tokens=chunk), Loopback()
    piped.pipeline = MoEPipeline(exchange=loopback)
    got = _run(piped, x)
    chunks = 4 if chunk else 1  # 14 tokens: 4, 4, 4, 2
    assert loopback.sent == loopback.received == chunks
    _assert_same(ref, got)


@pytest.mark.parametrize("weights", ["single", "discrete"])
def test_apply_expert_parallel_keeps_this_ranks_experts_and_installs_the_exchange(weights):
    full, layer = _layer(expert_weights=weights), _layer(expert_weights=weights)
    ep = ExpertParallel(size=2, rank=1, dp=2, group=None, expert_dp_group=None)
    params = apply_expert_parallel(layer, ep)
    assert layer.experts.num_experts == 2 and layer.pipeline == MoEPipeline(exchange=ep)
    w1 = torch.stack(list(layer.experts.w1)) if weights == "discrete" else layer.experts.w1
    ref = torch.stack(list(full.experts.w1)) if weights == "discrete" else full.experts.w1
    assert torch.equal(w1, ref[2:4])  # rank 1 of EP 2 holds experts 2 and 3
    assert {id(p) for p in params} == {id(p) for p in layer.experts.parameters()}


def test_the_pipeline_traces_under_torch_compile():
    x = torch.randn(2, 7, 8)
    layer = _layer(dispatch_chunk_tokens=4)
    attach_dispatcher(layer, None)
    ref = layer(x)[0]
    torch._dynamo.reset()
    got = torch.compile(layer, backend="eager")(x)[0]
    assert torch.equal(ref, got)
