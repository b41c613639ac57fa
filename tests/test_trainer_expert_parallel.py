"""Expert parallelism on the CPU (gloo, 2 and 4 real torchrun ranks): EP = N trains exactly like EP = 1.

Same world, same global batch, same seed: only the experts' placement changes, so losses, gradient norms
and dropped-token fractions must agree (to fp32 summation-order noise: the expert GEMMs see the rows of
all EP peers at once, and the gradient sums run in another order than DDP's).
"""

from __future__ import annotations

import math

import pytest
from trainer_helpers import explain, metrics, recipe_dict, run_torchrun, status

from trainer.recipe import Recipe, launch_problems
from trainer.support import unsupported

REL = 2e-5  # fp32 reassociation across 6 steps of a tiny model


def _train(tmp_path, name: str, nproc: int, env: dict[str, str] | None = None, **overrides) -> list[dict]:
    out = tmp_path / name
    proc = run_torchrun(out, recipe_dict(**overrides), nproc=nproc, env=env)
    assert proc.returncode == 0, explain(proc)
    assert status(out)["state"] == "completed"
    return metrics(out)


def _assert_same_training(ep_rows: list[dict], base_rows: list[dict]) -> None:
    assert len(ep_rows) == len(base_rows)
    for ep, base in zip(ep_rows, base_rows, strict=True):
        assert ep["skipped"] == base["skipped"]
        if base["skipped"]:  # a non-finite step: skipped on every rank of both layouts
            assert all(v is None or not math.isfinite(v) for v in (ep["loss"], base["loss"]))  # JSON null = NaN
            continue
        assert ep["loss"] == pytest.approx(base["loss"], rel=REL), (ep["step"], ep["loss"], base["loss"])
        assert ep["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-4)
        assert ("eval_loss" in ep) == ("eval_loss" in base)
        if "eval_loss" in base:
            assert ep["eval_loss"] == pytest.approx(base["eval_loss"], rel=REL)
        assert ep["aux_loss"] == pytest.approx(base["aux_loss"], rel=REL)
        assert ep["tokens_dropped_frac"] == base["tokens_dropped_frac"]
    # the model learns: a wrong exchange (rows to the wrong expert, gradients not brought back) would not
    assert ep_rows[-1]["loss"] < ep_rows[0]["loss"]


def test_ep2_dropless_equals_ep1(tmp_path):
    """Data-dependent split sizes (counts all-to-all, host splits, regroup by local expert), with 4 micro-batches
    of accumulation, evaluation every 2 steps and a NaN injected on rank 0 at step 3 (skipped by every rank)."""
    common = {"training.micro_batch_size": 1, "training.global_batch_size": 8, "training.eval_interval": 2}
    nan = {"MBX_TRAINER_INJECT_NAN_STEP": "3"}
    base = _train(tmp_path, "ep1", 2, env=nan, **common)
    ep = _train(tmp_path, "ep2", 2, env=nan, **common, **{"parallel.expert": 2})
    _assert_same_training(ep, base)
    assert [row["skipped"] for row in ep] == [False, False, True, False, False, False]
    assert sum("eval_loss" in row for row in ep) == 3


def test_ep2_static_capacity_chunked_discrete_equals_ep1(tmp_path):
    """pad_to_capacity (equal splits, no host sync), chunked dispatch, one parameter per expert."""
    common = {"model.moe.capacity_factor": 1.0, "model.moe.pad_to_capacity": True,
              "model.moe.dispatch_chunk_tokens": 8, "model.moe.expert_weights": "discrete"}
    base = _train(tmp_path, "ep1", 2, **common)
    ep = _train(tmp_path, "ep2", 2, **common, **{"parallel.expert": 2})
    _assert_same_training(ep, base)
    assert any(row["tokens_dropped_frac"] > 0 for row in base)  # capacity 1.0 really drops here


def test_dp_times_ep_layouts_on_four_ranks(tmp_path):
    """World 4: EP 2 (two expert-data-parallel replicas of each expert) and EP 4 (one), compact dropping."""
    common = {"model.moe.capacity_factor": 1.25, "model.moe.drop_policy": "position",
              "training.micro_batch_size": 1, "training.global_batch_size": 4, "training.steps": 4}
    base = _train(tmp_path, "ep1", 4, **common)
    for ep_size in (2, 4):
        _assert_same_training(_train(tmp_path, f"ep{ep_size}", 4, **common, **{"parallel.expert": ep_size}), base)


def test_expert_parallel_pre_submit_checks():
    recipe = Recipe.model_validate(recipe_dict(**{"parallel.expert": 4, "training.micro_batch_size": 1}))
    assert launch_problems(recipe, world_size=4) == []
    assert any(p.startswith("parallel.expert: EP (4) must divide DP·CP (2)") for p in launch_problems(recipe, 2))
    te = Recipe.model_validate(recipe_dict(**{"parallel.expert": 2, "model.moe.grouped_gemm": "te"}))
    assert any(p.startswith("model.moe.grouped_gemm: te (TE GroupedLinear) is not wired for expert parallelism")
               for p in unsupported(te, world_size=2, device_type="cuda", arch=90))
    remake = Recipe.model_validate(recipe_dict(**{"parallel.expert": 2, "recompute": "selective",
                                                  "recompute_modules": ["moe_dispatch"]}))
    assert any(p.startswith("recompute_modules: moe_dispatch") for p in launch_problems(remake, 2))
