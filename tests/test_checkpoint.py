"""Bundled-trainer checkpoints (trainer/checkpoint.py): save at step k, continue to n, in either expert layout.

- Save at k with `expert_weights: single`, continue to n == the uninterrupted run to n, bitwise (loss, grad
  norm, aux loss at every step k+1..n), for each optimizer path: fused AdamW on the weights, on fp32 master
  weights (fp32 main grads), the precision-aware AdamW (bf16 main grads; bf16 moments).
- Save with single, load as discrete (and the reverse), continue == continue in the saving layout: also bitwise
  on the CPU. The stated tolerance is zero because single and discrete train bitwise equal here
  (tests/test_trainer_parity.py: the grad norm splits a single weight per expert, AdamW is elementwise); the
  per-expert slices of a single weight and its moments are exactly the discrete tensors.
- A checkpoint without its AdamW moments continues differently (what the equality above would catch).
- `checkpoint.reload_with` through `python -m trainer`: save at 3 with single, reload as discrete in the same run
  == the straight run, bitwise.
- Two ranks (spawned gloo ranks through the trainer's entry point, the straight run then the reloading one in
  the same processes): rank 0 saves, both load after a barrier; == the straight DP-2 run, bitwise.
- A bad `checkpoint.load_from` (missing directory, another model's shape) exits 2 with one line naming the key.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import trainer_helpers
from trainer_helpers import run_trainer

from trainer import rundir
from trainer.checkpoint import STATE, CheckpointError
from trainer.distributed import Dist
from trainer.loop import Trainer
from trainer.recipe import Recipe, launch_problems

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one intra-op thread for every test here
CPU = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
STEPS, SAVE_AT = 6, 3
COMPARED = ("step", "loss", "grad_norm", "aux_loss", "tokens_dropped_frac", "lr")
DISCRETE = {"model.moe.expert_weights": "discrete"}
SINGLE = {"model.moe.expert_weights": "single"}


def _recipe(**overrides: object) -> Recipe:
    return Recipe.model_validate(trainer_helpers.recipe_dict(**{"training.steps": STEPS, **overrides}))


def _rows(out: Path, **overrides: object) -> list[dict]:
    rows: list[dict] = []
    Trainer(_recipe(**overrides), CPU, log=lambda line: None).run(rows.append, out)
    return rows


def _assert_bitwise(a: list[dict], b: list[dict]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b] and a
    for x, y in zip(a, b, strict=True):
        for key in COMPARED:
            assert x.get(key) == y.get(key), f"step {x['step']}: {key} {x.get(key)!r} != {y.get(key)!r}"


OPTIMIZERS = {
    "fused-adamw": {},
    "fp32-masters": {"precision": "bf16", "optimizer.master_weights": True},
    "precision-aware": {"precision": "bf16", "optimizer.master_weights": True, "optimizer.main_grads": "bf16"},
    "bf16-moments": {"optimizer.moments": "bf16"},
}


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_save_then_continue_equals_uninterrupted(tmp_path, optimizer):
    knobs = {**OPTIMIZERS[optimizer], **SINGLE}
    full = _rows(tmp_path / "a", **knobs, **{"checkpoint.save_at": SAVE_AT})
    saved = rundir.checkpoint_dir(tmp_path / "a", SAVE_AT)
    assert sorted(p.name for p in saved.parent.iterdir()) == [saved.name]  # no temporary directory left
    assert (saved / rundir.CHECKPOINT_META).is_file() and (saved / STATE).is_file()
    continued = _rows(tmp_path / "b", **knobs, **{"checkpoint.load_from": str(saved)})
    _assert_bitwise(continued, full[SAVE_AT:])


@pytest.mark.parametrize(("saved_as", "loaded_as"), [(SINGLE, DISCRETE), (DISCRETE, SINGLE)], ids=["s2d", "d2s"])
@pytest.mark.parametrize("optimizer", ["fused-adamw", "precision-aware"])
def test_load_in_the_other_expert_layout(tmp_path, saved_as, loaded_as, optimizer):
    knobs = OPTIMIZERS[optimizer]
    full = _rows(tmp_path / "a", **knobs, **saved_as, **{"checkpoint.save_at": SAVE_AT})
    saved = str(rundir.checkpoint_dir(tmp_path / "a", SAVE_AT))
    same = _rows(tmp_path / "same", **knobs, **saved_as, **{"checkpoint.load_from": saved})
    other = _rows(tmp_path / "other", **knobs, **loaded_as, **{"checkpoint.load_from": saved})
    _assert_bitwise(same, full[SAVE_AT:])
    _assert_bitwise(other, same)


def test_canonical_names_cross_wrappers(tmp_path):
    """Saved under full recompute (parameters named `layers.<i>.inner.…`), loaded without it, as discrete."""
    full = _rows(tmp_path / "a", recompute="full", **{"checkpoint.save_at": SAVE_AT})
    state = torch.load(rundir.checkpoint_dir(tmp_path / "a", SAVE_AT) / STATE, weights_only=True)
    assert not any(".inner." in name for name in state["weights"])
    assert {"layers.0.mlp.experts.w1.0", "layers.0.mlp.experts.w2.3"} <= set(state["weights"])
    assert "layers.0.mlp.experts.w1" not in state["weights"]  # per expert, whatever the saving layout
    continued = _rows(tmp_path / "b", **DISCRETE, **{"checkpoint.load_from": str(tmp_path / "a")})  # a run dir
    _assert_bitwise(continued, full[SAVE_AT:])


def test_dropping_the_moments_changes_the_continuation(tmp_path):
    full = _rows(tmp_path / "a", **{"checkpoint.save_at": SAVE_AT})
    saved = rundir.checkpoint_dir(tmp_path / "a", SAVE_AT)
    state = torch.load(saved / STATE, weights_only=True)
    state["exp_avg"], state["exp_avg_sq"] = {}, {}
    torch.save(state, saved / STATE)
    continued = _rows(tmp_path / "b", **{"checkpoint.load_from": str(saved)})
    assert continued[0]["loss"] == full[SAVE_AT]["loss"]  # the weights are there
    assert continued[-1]["loss"] != full[-1]["loss"]


def test_entry_point_reloads_as_discrete_in_one_run(tmp_path):
    """`python -m trainer` with checkpoint.reload_with: save at 3 with single, a fresh trainer loads it as
    discrete and trains steps 4-5 == the straight run that saved at 3 (all rows bitwise)."""
    recipe = trainer_helpers.recipe_dict(**{"training.steps": 5, "checkpoint.save_at": 3})
    a = run_trainer(tmp_path / "a", recipe)
    assert a.returncode == 0, a.stderr
    reload = {**recipe, "checkpoint": {"save_at": 3, "reload_with": {"model.moe.expert_weights": "discrete"}}}
    b = run_trainer(tmp_path / "b", reload)
    assert b.returncode == 0, b.stderr
    assert "checkpoint saved: " in b.stdout and "continuing from " in b.stdout and "after step 3" in b.stdout
    rows_a, rows_b = trainer_helpers.metrics(tmp_path / "a"), trainer_helpers.metrics(tmp_path / "b")
    assert [r["step"] for r in rows_b] == [1, 2, 3, 4, 5]
    _assert_bitwise(rows_b, rows_a)
    assert rundir.read_status(tmp_path / "b")["steps_completed"] == 5


def _refused(tmp_path: Path, name: str, load_from: str, **overrides: object) -> str:
    recipe = trainer_helpers.recipe_dict(**{"checkpoint.load_from": load_from, **overrides})
    proc = run_trainer(tmp_path / name, recipe)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    status = rundir.read_status(tmp_path / name)
    assert status["state"] == "failed" and status["reason"] == lines[0].removeprefix("error: ")
    return lines[0]


def test_bad_load_from_exits_2_naming_the_key(tmp_path):
    missing = _refused(tmp_path, "missing", str(tmp_path / "nowhere"))
    assert missing.startswith("error: checkpoint.load_from: ") and "no such directory" in missing
    _rows(tmp_path / "a", **{"checkpoint.save_at": 2})
    other = _refused(tmp_path, "shape", str(tmp_path / "a"), **{"model.hidden_size": 64})
    assert other.startswith("error: checkpoint.load_from: ") and "model.hidden_size = 32 there, 64 here" in other


def test_checks_before_anything_is_built(tmp_path):
    _rows(tmp_path / "a", **{"checkpoint.save_at": 2})
    with pytest.raises(CheckpointError, match=r"^checkpoint.load_from: .*model.moe.num_experts = 4 there, 8 here"):
        Trainer(_recipe(**{"checkpoint.load_from": str(tmp_path / "a"), "model.moe.num_experts": 8}), CPU)
    with pytest.raises(CheckpointError, match=r"^checkpoint.save_at \(2\) must come after .* step \(2\)"):
        Trainer(_recipe(**{"checkpoint.load_from": str(tmp_path / "a"), "checkpoint.save_at": 2}), CPU)
    with pytest.raises(CheckpointError, match=r"^checkpoint.load_from: .*global batch of 4 .* this run's is 2"):
        Trainer(_recipe(**{"checkpoint.load_from": str(tmp_path / "a"), "training.global_batch_size": 2}), CPU)
    with pytest.raises(ValueError, match=r"checkpoint.save_at \(9\) must be ≤ training.steps \(6\)"):
        _recipe(**{"checkpoint.save_at": 9})
    with pytest.raises(ValueError, match=r"checkpoint.reload_with needs checkpoint.save_at before training.steps"):
        _recipe(**{"checkpoint.reload_with": {}})
    with pytest.raises(ValueError, match=r"checkpoint.reload_with: model.hidden_size cannot change"):
        _recipe(**{"checkpoint.save_at": 2, "checkpoint.reload_with": {"model.hidden_size": 64}})
    with pytest.raises(ValueError, match=r"checkpoint.reload_with: model.moe.expert_weights: Input should be"):
        _recipe(**{"checkpoint.save_at": 2, "checkpoint.reload_with": {"model.moe.expert_weights": "stacked"}})
    ep = _recipe(**{"checkpoint.save_at": 2, "parallel.expert": 2})
    assert any(p.startswith("checkpoint.save_at: ") and "parallel.expert" in p for p in launch_problems(ep, 2))


def test_two_ranks_reload_waits_for_rank_0s_checkpoint(tmp_path):
    """DP 2 over gloo: global rank 0 saves, both ranks load after a barrier; == the straight DP-2 run."""
    recipe = trainer_helpers.recipe_dict(**{"training.steps": 4, "checkpoint.save_at": 2})
    reloading = copy.deepcopy(recipe)
    reloading["checkpoint"]["reload_with"] = {"model.moe.expert_weights": "discrete"}
    runs = trainer_helpers.train_on_ranks(tmp_path, 2, {"a": (recipe, {}), "b": (reloading, {})})
    _assert_bitwise(runs["b"], runs["a"])
    assert rundir.checkpoint_steps(tmp_path / "b") == [2]
