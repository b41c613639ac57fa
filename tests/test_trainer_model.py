"""Model, loss, recompute and mock data on the CPU: equivalences that later GPU paths must keep."""

from __future__ import annotations

import pytest
import torch
import trainer_helpers  # noqa: F401 (puts the checkout on sys.path)

from trainer.data import MockData
from trainer.distributed import Dist
from trainer.loss import cross_entropy
from trainer.model import GPT
from trainer.parallelize import parallelize
from trainer.recipe import ModelConfig, MoEConfig

CFG = ModelConfig(vocab_size=100, hidden_size=32, num_layers=2, num_attention_heads=4, num_query_groups=2,
                  ffn_hidden_size=64, moe=MoEConfig(num_experts=4, top_k=2, ffn_hidden_size=16, layer_freq=2,
                                                    num_shared_experts=1, capacity_factor=1.0))
CPU = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 100, (2, 17), generator=g)
    return rows[:, :-1], rows[:, 1:]


def _loss_and_grads(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    out = model(*_batch())
    (out.loss + out.aux_loss).backward()
    # Names differ once wrapped (layers.0.inner....): compare in parameter order.
    return out.loss.detach(), {str(i): p.grad.clone() for i, p in enumerate(model.parameters())}


def _gpt(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(CFG, seq_length=16, padded_vocab_size=128, **kw)


def test_vocab_is_padded_and_loss_starts_near_uniform():
    model = _gpt()
    assert model.embedding.weight.shape[0] == 128 and model.output.weight.shape[0] == 128
    loss = model(*_batch()).loss.item()
    assert abs(loss - torch.log(torch.tensor(128.0)).item()) < 0.5


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_gives_the_same_loss_and_grads(mode):
    ref_loss, ref_grads = _loss_and_grads(_gpt())
    model = parallelize(_gpt(), recompute=mode, compile=False, dist=CPU)
    loss, grads = _loss_and_grads(model)
    assert torch.equal(loss, ref_loss)
    assert ref_grads.keys() == grads.keys()
    for k in ref_grads:
        assert torch.allclose(grads[k], ref_grads[k], atol=1e-6), k


def test_fused_cross_entropy_matches_native():
    torch.manual_seed(0)
    hidden = torch.randn(2, 16, 32, requires_grad=True)
    weight = torch.randn(128, 32, requires_grad=True)
    targets = torch.randint(0, 100, (2, 16))
    native = cross_entropy(hidden, weight, targets, "native")
    gh, gw = torch.autograd.grad(native * 3.0, (hidden, weight))
    fused = cross_entropy(hidden, weight, targets, "fused")
    fh, fw = torch.autograd.grad(fused * 3.0, (hidden, weight))
    assert fused.item() == pytest.approx(native.item(), rel=1e-6)
    assert torch.allclose(fh, gh, atol=1e-6) and torch.allclose(fw, gw, atol=1e-6)


def test_fused_cross_entropy_in_chunks(monkeypatch):
    import trainer.loss

    torch.manual_seed(1)
    hidden, weight = torch.randn(1, 10, 8), torch.randn(64, 8)
    targets = torch.randint(0, 64, (1, 10))
    whole = cross_entropy(hidden, weight, targets, "fused")
    monkeypatch.setattr(trainer.loss, "FUSED_CHUNK_BYTES", 3 * 64 * 4)  # 3 tokens per chunk: 4 chunks
    chunked = cross_entropy(hidden, weight, targets, "fused")
    assert chunked.item() == pytest.approx(whole.item(), rel=1e-6)


def test_mock_data_slices_are_distinct_deterministic_and_layout_free():
    def rows(rank: int, dp: int, accum: int, step: int, micro: int) -> torch.Tensor:
        inputs, targets = MockData(5, 100, 16, 2, rank, dp, accum).train_batch(step, micro)
        assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the inputs shifted by one
        return inputs

    a, b = rows(0, 2, 1, 3, 0), rows(1, 2, 1, 3, 0)
    assert not torch.equal(a, b)  # each DP rank its own slice
    assert torch.equal(a, rows(0, 2, 1, 3, 0))  # deterministic
    # The global batch of a step does not depend on the layout: DP 2 × accum 1 = DP 1 × accum 2.
    assert torch.equal(torch.cat([a, b]), torch.cat([rows(0, 1, 2, 3, 0), rows(0, 1, 2, 3, 1)]))
    held_out = MockData(5, 100, 16, 2, 0, 2, 1).eval_batch(0)[0]
    assert not torch.equal(held_out, a)
    assert int(a.max()) < 100
