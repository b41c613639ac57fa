"""MoE routing, dispatch and experts on the CPU: capacity and drops, aux loss by hand, GEMM back-ends, weights."""

from __future__ import annotations

import math

import pytest
import torch
import trainer_helpers  # noqa: F401 (puts the checkout on sys.path)

from trainer.moe import (
    GroupedExperts,
    MoELayer,
    Router,
    Routing,
    combine,
    dispatch,
    expert_capacity,
    load_balancing_loss,
    plan_dispatch,
)
from trainer.recipe import MoEConfig, RouterConfig


def _routing(experts: list[list[int]], weights: list[list[float]]) -> Routing:
    return Routing(torch.tensor(experts), torch.tensor(weights), torch.zeros(()))


def test_capacity_is_megatrons():
    assert expert_capacity(num_tokens=6, top_k=1, num_experts=2, capacity_factor=1.0) == 3
    assert expert_capacity(num_tokens=10, top_k=2, num_experts=4, capacity_factor=1.25) == 7  # ceil(6.25)


def test_drop_policy_position_keeps_earliest_tokens():
    # 6 tokens, top-1, 2 experts; five tokens want expert 0, capacity ceil(6/2 · 1.0) = 3.
    r = _routing([[0], [0], [1], [0], [0], [0]], [[0.1], [0.9], [1.0], [0.8], [0.2], [0.7]])
    plan = plan_dispatch(r, num_experts=2, capacity=3, drop_policy="position")
    assert int(plan.dropped) == 2
    assert plan.counts.tolist() == [3, 1]
    assert plan.offs.tolist() == [3, 4]
    assert plan.rows.tolist() == [0, 1, 3, 2]  # expert 0 keeps tokens 0, 1, 3; expert 1 has token 2
    assert plan.weights.squeeze(1).tolist() == pytest.approx([0.1, 0.9, 1.0, 0.8, 0.0, 0.0])


def test_drop_policy_probs_keeps_highest_weights():
    r = _routing([[0], [0], [1], [0], [0], [0]], [[0.1], [0.9], [1.0], [0.8], [0.2], [0.7]])
    plan = plan_dispatch(r, num_experts=2, capacity=3, drop_policy="probs")
    assert int(plan.dropped) == 2
    assert plan.counts.tolist() == [3, 1]
    assert sorted(plan.rows[:3].tolist()) == [1, 3, 5]  # weights 0.9, 0.8, 0.7 survive; 0.1 and 0.2 dropped
    assert plan.weights.squeeze(1).tolist() == pytest.approx([0.0, 0.9, 1.0, 0.8, 0.0, 0.7])


def test_pad_to_capacity_has_static_shapes_and_zero_rows():
    r = _routing([[0], [0], [1], [0], [0], [0]], [[0.1], [0.9], [1.0], [0.8], [0.2], [0.7]])
    plan = plan_dispatch(r, num_experts=2, capacity=3, drop_policy="position", pad_to_capacity=True)
    assert plan.counts.tolist() == [3, 3] and plan.offs.tolist() == [3, 6]
    assert plan.rows.tolist() == [0, 1, 3, 2, 6, 6]  # 6 = T: the appended zero row fills expert 1's empty slots
    x = torch.randn(6, 4)
    buf = dispatch(x, plan)
    assert torch.equal(buf[4:], torch.zeros(2, 4))
    assert int(plan.dropped) == 2


def test_dropless_keeps_everything_top2():
    r = _routing([[0, 1], [1, 2], [2, 0]], [[0.5, 0.5], [0.6, 0.4], [0.7, 0.3]])
    plan = plan_dispatch(r, num_experts=3)
    assert int(plan.dropped) == 0
    assert plan.counts.tolist() == [2, 2, 2]
    x = torch.randn(3, 5)
    y = dispatch(x, plan)  # identity "experts": combine gives Σ_k w_k · x = x (weights sum to 1)
    assert torch.allclose(combine(y, plan), x, atol=1e-6)


def test_aux_loss_matches_hand_computation():
    # logits [[2, 0], [1, 0]]: both tokens pick expert 0 (top-1), so n = [2, 0].
    router = Router(hidden_size=2, num_experts=2, top_k=1, cfg=RouterConfig(aux_loss_coeff=0.01), init_std=0.02)
    with torch.no_grad():
        router.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 0.0]]))
    x = torch.tensor([[1.0, 0.0], [0.5, 0.0]])
    routing = router.train()(x)
    assert routing.experts.squeeze(1).tolist() == [0, 0]
    p00 = math.exp(2) / (math.exp(2) + 1)  # softmax([2, 0])[0]
    p10 = math.exp(1) / (math.exp(1) + 1)  # softmax([1, 0])[0]
    # aux = coeff · E / (k · T²) · Σ_e (Σ_t p_te) · n_e = 0.01 · 2 / (1 · 4) · (p00 + p10) · 2
    expected = 0.01 * 2 / 4 * (p00 + p10) * 2
    assert routing.aux_loss.item() == pytest.approx(expected, rel=1e-6)
    assert routing.weights.squeeze(1).tolist() == pytest.approx([1.0, 1.0])  # softmax over k = 1 logit
    # Balanced routing gives exactly the coefficient.
    logits = torch.randn(8, 4)
    balanced = torch.arange(8).remainder(4).unsqueeze(1)
    assert load_balancing_loss(logits, balanced, 1, 0.01).item() == pytest.approx(0.01, rel=1e-6)
    assert router.eval()(x).aux_loss.item() == 0.0  # no aux loss outside training


def test_force_balance_routes_round_robin():
    router = Router(8, num_experts=4, top_k=2, cfg=RouterConfig(force_balance=True), init_std=0.02)
    routing = router(torch.randn(8, 8))
    assert routing.experts.tolist()[:3] == [[0, 1], [2, 3], [0, 1]]
    assert torch.bincount(routing.experts.flatten(), minlength=4).tolist() == [4, 4, 4, 4]


def _experts(gemm: str, weights: str, activation: str = "swiglu") -> GroupedExperts:
    torch.manual_seed(0)
    return GroupedExperts(4, 8, 16, activation, init_std=0.5, output_std=0.5, expert_weights=weights, gemm=gemm)


def _run_experts(experts: GroupedExperts, x: torch.Tensor, plan) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = x.clone().requires_grad_()
    y = experts(x, plan)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    return y.detach(), [x.grad, *(p.grad for p in experts.parameters())]


@pytest.mark.parametrize("activation", ["swiglu", "squared_relu"])
def test_grouped_mm_equals_loop(activation):
    torch.manual_seed(1)
    r = _routing(torch.randint(0, 4, (10, 2)).tolist(), torch.full((10, 2), 0.5).tolist())
    r = r._replace(experts=torch.where(r.experts == 3, 2, r.experts))  # expert 3 gets no tokens
    plan = plan_dispatch(r, num_experts=4)
    x = dispatch(torch.randn(10, 8), plan)
    y_torch, g_torch = _run_experts(_experts("torch", "single", activation), x, plan)
    y_loop, g_loop = _run_experts(_experts("loop", "single", activation), x, plan)
    assert torch.allclose(y_torch, y_loop, atol=1e-6)
    for a, b in zip(g_torch, g_loop, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert torch.count_nonzero(g_torch[1][3]) == 0  # expert 3's weights got a zero gradient, not None


@pytest.mark.parametrize("gemm", ["torch", "loop"])
def test_single_equals_discrete_weights(gemm):
    single, discrete = _experts(gemm, "single"), _experts(gemm, "discrete")
    assert torch.equal(single.w1, torch.stack(list(discrete.w1)))
    r = _routing(torch.randint(0, 4, (12, 2), generator=torch.Generator().manual_seed(2)).tolist(),
                 torch.full((12, 2), 0.5).tolist())
    plan = plan_dispatch(r, num_experts=4)
    x = dispatch(torch.randn(12, 8), plan)
    y_s, g_s = _run_experts(single, x, plan)
    y_d, g_d = _run_experts(discrete, x, plan)
    assert torch.equal(y_s, y_d)
    assert torch.equal(g_s[0], g_d[0])  # input grad
    assert torch.equal(g_s[1], torch.stack(g_d[1:5]))  # w1 grads, per expert
    assert torch.equal(g_s[2], torch.stack(g_d[5:9]))  # w2 grads


def _layer(**moe) -> MoELayer:
    torch.manual_seed(3)
    cfg = MoEConfig(num_experts=4, top_k=2, ffn_hidden_size=16, **moe)
    return MoELayer(8, "swiglu", cfg, init_std=0.3, output_std=0.3)


def test_large_capacity_equals_dropless():
    x = torch.randn(2, 5, 8)
    dropless = _layer()(x)[0]
    # capacity = ceil(10 · 2 / 4 · 4) = 20 ≥ all pairs: nothing dropped, in either buffer layout.
    for pad in (False, True):
        out, _, dropped = _layer(capacity_factor=4.0, pad_to_capacity=pad)(x)
        assert int(dropped) == 0
        assert torch.allclose(out, dropless, atol=1e-6)


@pytest.mark.parametrize("policy", ["probs", "position"])
def test_padded_equals_compact_when_dropping(policy):
    x = torch.randn(2, 8, 8, requires_grad=True)
    outs = []
    for pad in (False, True):
        layer = _layer(capacity_factor=0.5, drop_policy=policy, pad_to_capacity=pad)
        out, aux, dropped = layer(x)
        assert int(dropped) > 0
        (grad,) = torch.autograd.grad((out * out).sum() + aux, x)
        outs.append((out.detach(), grad, int(dropped)))
    assert outs[0][2] == outs[1][2]
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-6)
    assert torch.allclose(outs[0][1], outs[1][1], atol=1e-6)


def test_chunked_dispatch_equals_unchunked_when_dropless():
    x = torch.randn(2, 7, 8, requires_grad=True)
    ref, ref_aux, _ = _layer()(x)
    (ref_grad,) = torch.autograd.grad(ref.square().sum() + ref_aux, x)
    out, aux, dropped = _layer(dispatch_chunk_tokens=4)(x)  # 14 tokens: chunks of 4, 4, 4, 2
    (grad,) = torch.autograd.grad(out.square().sum() + aux, x)
    assert int(dropped) == 0 and torch.equal(aux, ref_aux)
    assert torch.allclose(out, ref, atol=1e-6) and torch.allclose(grad, ref_grad, atol=1e-6)


def test_chunked_dispatch_counts_capacity_per_chunk():
    layer = _layer(dispatch_chunk_tokens=4, capacity_factor=1.0, router=RouterConfig(force_balance=True))
    # Round-robin routing of 4 tokens × top-2 over 4 experts fills each expert exactly: nothing dropped.
    assert int(layer(torch.randn(1, 12, 8))[2]) == 0
    skewed = _layer(dispatch_chunk_tokens=4, capacity_factor=0.5, router=RouterConfig(force_balance=True))
    # capacity per chunk = ceil(4 · 2 / 4 · 0.5) = 1 of the 2 pairs each expert gets: half of 24 pairs dropped.
    assert int(skewed(torch.randn(1, 12, 8))[2]) == 12
