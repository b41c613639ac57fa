"""End-to-end runs of the real trainer (`python -m trainer`, `torchrun -m trainer`) on the CPU."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from trainer_helpers import explain, losses, metrics, recipe_dict, run_torchrun, run_trainer, status

from trainer import rundir

ROW_FIELDS = {
    "step", "loss", "grad_norm", "lr", "step_time_ms", "tflops_per_gpu", "tokens_per_s_per_gpu",
    "mem_allocated_gib", "mem_max_allocated_gib", "mem_reserved_gib", "mem_max_reserved_gib", "skipped", "nan",
    "aux_loss", "tokens_dropped_frac", "time",
}
STATUS_FIELDS = {
    "state", "reason", "steps_completed", "steps_planned", "skipped_iterations", "nan_iterations",
    "flops_per_step", "world_size", "device", "gpu_name", "torch_version", "params", "started_at", "ended_at",
    "written_by",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Four single-process runs: A with evaluation (twice), A without evaluation, and A with another seed."""
    base = tmp_path_factory.mktemp("trainer-runs")
    with_eval = recipe_dict(**{"training.eval_interval": 2})
    plans = {
        "a": with_eval,
        "a_again": with_eval,
        "a_no_eval": recipe_dict(),
        "other_seed": recipe_dict(**{"training.eval_interval": 2, "training.seed": 8}),
    }
    out = {}
    for name, recipe in plans.items():
        proc = run_trainer(base / name, recipe)
        assert proc.returncode == 0, explain(proc)
        out[name] = base / name
    out["proc_a_stdout"] = proc.stdout
    return out


def test_run_directory_contract(runs):
    a = runs["a"]
    rows = metrics(a)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for row in rows:
        assert ROW_FIELDS <= row.keys()
        assert row["mem_allocated_gib"] == 0.0 and row["rss_gib"] > 0  # CPU: allocator fields 0, RSS instead
        assert row["skipped"] is False and row["nan"] is False
        assert 0.0 <= row["tokens_dropped_frac"] <= 1.0 and row["aux_loss"] > 0
    assert [("eval_loss" in r) for r in rows] == [False, True, False, True, False, True]
    assert all(math.isfinite(r["eval_loss"]) for r in rows if "eval_loss" in r)
    st = status(a)
    assert set(st) == STATUS_FIELDS
    assert st["state"] == "completed" and st["reason"] is None and st["written_by"] == rundir.TRAINER
    assert rundir.status_problems(st) == []  # the one schema every writer of status.json is held to
    assert (st["steps_completed"], st["steps_planned"], st["skipped_iterations"], st["nan_iterations"]) == (6, 6, 0, 0)
    assert st["device"] == "cpu" and st["world_size"] == 1 and st["gpu_name"] is None and st["params"] > 0
    assert st["flops_per_step"] > 0 and st["ended_at"] >= st["started_at"]
    env = rundir.read_env(a)
    assert env["world_size"] == 1 and env["torch"] == st["torch_version"] and env["hostname"]
    assert yaml.safe_load((a / "recipe.yaml").read_text())["training"]["eval_interval"] == 2
    jit = json.loads((a / "logs" / "jit-cache-rank0.json").read_text())
    assert jit["rank"] == 0 and jit["torch_imported_before"] is False
    # every record the trainer wrote carries the run-dir format version (trainer/rundir.py), first
    records = (rundir.STATUS, rundir.ENV, f"{rundir.LOGS}/jit-cache-rank0.json")
    written = [json.loads((a / name).read_text()) for name in records]
    written.append(json.loads((a / rundir.METRICS).read_text().splitlines()[-1]))
    stamp = (rundir.FORMAT_KEY, rundir.FORMAT_VERSION)
    assert [next(iter(record.items())) for record in written] == [stamp] * 4
    assert "step 6/6 | loss " in runs["proc_a_stdout"] and "fp32 compute" in runs["proc_a_stdout"]


def test_same_seed_same_losses_bitwise(runs):
    a = losses(runs["a"])
    assert a == losses(runs["a_again"])
    assert [r["eval_loss"] for r in metrics(runs["a"]) if "eval_loss" in r] == [
        r["eval_loss"] for r in metrics(runs["a_again"]) if "eval_loss" in r
    ]
    assert a != losses(runs["other_seed"])


def test_evaluation_does_not_change_training(runs):
    assert losses(runs["a"]) == losses(runs["a_no_eval"])
    assert [r["grad_norm"] for r in metrics(runs["a"])] == [r["grad_norm"] for r in metrics(runs["a_no_eval"])]


def test_non_finite_step_is_skipped_and_counted(tmp_path):
    out = tmp_path / "nan"
    proc = run_trainer(out, recipe_dict(), env={"MBX_TRAINER_INJECT_NAN_STEP": "3"})
    assert proc.returncode == 0, explain(proc)
    rows = metrics(out)
    assert len(rows) == 6
    assert rows[2]["loss"] is None and rows[2]["nan"] is True and rows[2]["skipped"] is True
    assert rows[2]["grad_norm"] is None  # NaN spelled as JSON null
    assert all(r["skipped"] is False and math.isfinite(r["loss"]) for i, r in enumerate(rows) if i != 2)
    st = status(out)
    assert st["state"] == "completed"
    assert (st["skipped_iterations"], st["nan_iterations"], st["steps_completed"]) == (1, 1, 6)
    assert "SKIPPED" in proc.stdout


def test_unsupported_feature_fails_with_a_clear_status(tmp_path):
    out = tmp_path / "fp8"
    proc = run_trainer(out, recipe_dict(), "--set", "precision=fp8")  # also exercises --set
    assert proc.returncode == 1
    st = status(out)
    assert st["state"] == "failed" and st["steps_completed"] == 0
    assert st["reason"].startswith("NotSupportedError: precision: fp8 runs Transformer Engine GEMMs on a CUDA GPU")
    assert "pip install transformer-engine[pytorch]" in st["reason"]
    assert "\n" not in st["reason"]
    assert "Traceback" in proc.stderr


def test_invalid_recipe_fails_before_torch(tmp_path):
    out = tmp_path / "bad"
    proc = run_trainer(out, recipe_dict(**{"model.moe.top_k": 9}))  # top_k > num_experts
    assert proc.returncode == 2
    st = status(out)
    assert st["state"] == "failed" and "ValidationError" in st["reason"] and "top_k" in st["reason"]


def test_two_gloo_ranks_with_rank_local_jit_caches(tmp_path, runs):
    out, cache = tmp_path / "ddp", tmp_path / "cache"
    poison = str(tmp_path / "poisoned-shared-triton-cache")
    proc = run_torchrun(out, recipe_dict(), nproc=2, env={"MBX_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": poison})
    assert proc.returncode == 0, explain(proc)
    st = status(out)
    assert st["state"] == "completed" and st["world_size"] == 2 and st["steps_completed"] == 6
    records = [json.loads((out / "logs" / f"jit-cache-rank{r}.json").read_text()) for r in (0, 1)]
    dirs = [rec["env"]["TRITON_CACHE_DIR"] for rec in records]
    assert dirs == [str(cache.resolve() / "rank-0" / "triton"), str(cache.resolve() / "rank-1" / "triton")]
    for rec in records:
        assert rec["replaced"]["TRITON_CACHE_DIR"] == poison  # the inherited value was not trusted
        assert rec["torch_imported_before"] is False
        assert rec["env"]["TORCH_EXTENSIONS_DIR"] == str(cache.resolve() / "torch_extensions")  # shared
        for var in ("TORCHINDUCTOR_CACHE_DIR", "TILELANG_CACHE_DIR", "TILELANG_TMP_DIR", "CUDA_CACHE_PATH"):
            assert rec["env"][var].startswith(rec["rank_dir"])
    assert records[0]["env"]["TORCHINDUCTOR_CACHE_DIR"] != records[1]["env"]["TORCHINDUCTOR_CACHE_DIR"]
    assert not (tmp_path / "poisoned-shared-triton-cache").exists()
    # Same global batch (micro 2 × DP 2 vs micro 2 × accum 2 on one rank): same losses up to reduction order.
    two_ranks, one_rank = losses(out), losses(runs["a_no_eval"])
    assert two_ranks == pytest.approx(one_rank, rel=1e-4)


def test_dense_model_learns_the_mock_data(tmp_path):
    out = tmp_path / "dense"
    recipe = recipe_dict(**{"model.moe": None, "model.vocab_size": 64, "model.num_layers": 1,
                            "training.seq_length": 32, "training.steps": 15, "training.log_interval": 5,
                            "optimizer.lr": 1e-2})
    proc = run_trainer(out, recipe)
    assert proc.returncode == 0, explain(proc)
    rows = metrics(out)
    assert all(r["aux_loss"] is None and r["tokens_dropped_frac"] is None for r in rows)  # dense: no MoE stats
    first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-3:]) / 3
    assert first == pytest.approx(math.log(128), abs=0.3)  # uniform over the padded vocabulary (64 → 128)
    assert last < first - 0.4, [r["loss"] for r in rows]
