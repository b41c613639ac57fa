"""The MoE permutation's hand-written backward equals autograd through plain indexing, in every dispatch mode."""

from __future__ import annotations

import pytest
import torch
import trainer_helpers  # noqa: F401 (puts the checkout on sys.path)

from trainer.moe import Routing, combine, dispatch, expert_capacity, plan_dispatch


def reference(x: torch.Tensor, weights: torch.Tensor, plan, expert_scale: torch.Tensor) -> torch.Tensor:
    """The same computation through plain indexing (autograd's own index/index_put backward)."""
    source = torch.cat([x, x.new_zeros(1, x.shape[1])]) if plan.padded else x
    y = source[plan.rows] * expert_scale  # a stand-in "expert": row-wise scale, so gradients differ per row
    num_tokens, top_k = weights.shape
    per_pair = y[plan.pair_rows].view(num_tokens, top_k, -1)
    return torch.einsum("tk,tkh->th", weights, per_pair)


@pytest.mark.parametrize(
    "capacity_factor, pad, policy",
    [(None, False, "probs"), (0.75, False, "probs"), (0.75, False, "position"), (0.75, True, "probs"), (2.0, True, "position")],
)
def test_custom_backward_matches_plain_indexing(capacity_factor, pad, policy):
    torch.manual_seed(0)
    tokens, experts, top_k, hidden = 24, 4, 2, 8
    logits = torch.randn(tokens, experts, dtype=torch.float64)
    chosen = logits.topk(top_k, dim=-1).indices
    raw_weights = torch.randn(tokens, top_k, dtype=torch.float64).softmax(-1)
    capacity = None if capacity_factor is None else expert_capacity(tokens, top_k, experts, capacity_factor)
    plan = plan_dispatch(Routing(chosen, raw_weights, torch.zeros(())), experts, capacity, policy, pad)
    if capacity_factor == 0.75:
        assert int(plan.dropped) > 0, "the case must actually drop tokens"
    scale = torch.rand(plan.rows.shape[0], 1, dtype=torch.float64) + 0.5
    x = torch.randn(tokens, hidden, dtype=torch.float64)
    upstream = torch.randn(tokens, hidden, dtype=torch.float64)

    weights_a = plan.weights.clone().requires_grad_(True)
    x_a = x.clone().requires_grad_(True)
    out_a = combine(dispatch(x_a, plan) * scale, plan._replace(weights=weights_a))
    out_a.backward(upstream)

    weights_b = plan.weights.clone().requires_grad_(True)
    x_b = x.clone().requires_grad_(True)
    out_b = reference(x_b, weights_b, plan, scale)
    out_b.backward(upstream)

    torch.testing.assert_close(out_a, out_b)
    torch.testing.assert_close(x_a.grad, x_b.grad)
    torch.testing.assert_close(weights_a.grad * (plan.weights != 0), weights_b.grad * (plan.weights != 0))
