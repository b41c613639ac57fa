"""bf16 weights with fp32 master weights: trains like fp32 (to bf16 precision); both gradient modes work."""

from __future__ import annotations

import pytest
import torch
import trainer_helpers  # noqa: F401 (puts the checkout on sys.path)

from trainer.distributed import Dist
from trainer.loop import Trainer
from trainer.recipe import Recipe

RECIPE = {
    "model": {"vocab_size": 128, "hidden_size": 32, "num_layers": 2, "num_attention_heads": 2, "ffn_hidden_size": 64,
              "moe": {"num_experts": 4, "top_k": 2, "ffn_hidden_size": 32}},
    "training": {"seq_length": 32, "micro_batch_size": 2, "global_batch_size": 4, "steps": 8},
    "optimizer": {"lr": 3e-3, "warmup_steps": 2},
    "device": "cpu",
}


def losses(**optimizer) -> tuple[list[float], Trainer]:
    data = {**RECIPE, "optimizer": {**RECIPE["optimizer"], **optimizer}}
    dist = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    trainer = Trainer(Recipe.model_validate(data), dist, log=lambda line: None)
    rows: list[dict] = []
    trainer.run(rows.append)
    return [r["loss"] for r in rows], trainer


@pytest.mark.parametrize("main_grads", ["fp32", "bf16"])
def test_master_weights_track_fp32_training(main_grads):
    reference, _ = losses()
    mixed, trainer = losses(master_weights=True, main_grads=main_grads)
    assert trainer.master is not None and trainer.master.fp32_main_grads == (main_grads == "fp32")
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())
    assert all(m.dtype == torch.float32 for m in trainer.master.master)
    # bf16 weights and compute: the same trajectory to bf16 precision, and it learns
    assert mixed[-1] < mixed[0]
    assert max(abs(a - b) for a, b in zip(reference, mixed, strict=True)) < 0.05
    # the bf16 weights are exactly the rounded master weights after every step
    for param, master in zip(trainer.master.params, trainer.master.master, strict=True):
        assert torch.equal(param, master.to(torch.bfloat16))
