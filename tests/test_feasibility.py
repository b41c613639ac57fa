"""Feasibility before submission (orchestrator/run/feasibility.py): each point's memory estimate against its GPU,
infeasible points (a layout rule broken, an estimate over the GPU's memory) recorded with the reason and skipped
while the rest run (the real bundled trainer on CPU, a real command trainer), `--strict` refusing instead, the
plan and dry run showing estimate and headroom, the `estimates` store table, the headroom gate and freeze."""

from __future__ import annotations

import copy
import json
import shutil
import sys

import pytest
from conftest import FAKE_MEGATRON, MEGATRON_LOG, ROOT, TINY_MOE_RECIPE

from orchestrator.errors import ConfigError
from orchestrator.run.feasibility import GPU_MEMORY_GIB, assess, gpu_memory_gib
from orchestrator.run.store import Store
from orchestrator.spec.campaign import Campaign
from orchestrator.trainers import expand, memory_estimate
from trainer.memory import estimate
from trainer.recipe import Recipe

FAKE_PEAK_GIB = 20306.24 / 1024  # the replayed Megatron log's peak allocated memory
HUGE = 32768  # a hidden size whose estimate (~151 GiB) is over an H200's 139.8 GiB


def bundled_campaign(**over) -> dict:
    """TINY_MOE_RECIPE on the CPU: hidden size × TP, one point fits an H200, one is too big, two break TP = 1."""
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 4
    recipe["device"] = "cpu"
    data = {
        "name": "feas",
        "trainer": {"kind": "bundled", "recipe": recipe},
        "resources": {"gpu": "H200"},
        "sweep": {"axes": {"model.hidden_size": [32, HUGE], "parallel.tensor": [1, 2]}},
        "wandb": {"mode": "disabled"},
    }
    data.update(over)
    return data


def command_campaign(**over) -> dict:
    """The fake Megatron (replays a real log: peak 19.8 GiB) with TP×PP 1×1 (fits) and 4×4 (world of 1)."""
    data = {
        "name": "mega",
        "trainer": {
            "kind": "command",
            "command": [sys.executable, str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0"],
            "params": {
                "num_layers": 4,
                "hidden_size": 1024,
                "num_attention_heads": 16,
                "seq_length": 2048,
                "vocab_size": 32000,
                "micro_batch_size": 1,
                "global_batch_size": 8,
                "bf16": True,
            },  # fmt: skip
            "log_format": "megatron-lm",
        },
        "resources": {"gpu": "H100-80GB"},
        "sweep": {"zip": [{"tensor_model_parallel_size": [1, 4], "pipeline_model_parallel_size": [1, 4]}]},
        "gates": {"headroom_gib_min": 10},
        "wandb": {"mode": "disabled"},
    }
    data.update(over)
    return data


def test_gpu_table_names_and_sizes():
    assert gpu_memory_gib("H200") == 139.8 and gpu_memory_gib("H100-80GB") == 79.6
    assert gpu_memory_gib("A100-80GB") == 79.2 and 183 <= gpu_memory_gib("GB200") <= 186
    assert 175 <= gpu_memory_gib("B200") <= 182
    assert gpu_memory_gib("nvidia h200") == 139.8 and gpu_memory_gib("NVIDIA H100 80GB") == 79.6
    assert gpu_memory_gib("44.5GiB") == 44.5
    with pytest.raises(ConfigError) as err:
        gpu_memory_gib("K80")
    assert "unknown GPU 'K80'" in str(err.value) and all(name in str(err.value) for name in GPU_MEMORY_GIB)


def test_assessment_matches_the_estimate_and_marks_each_reason():
    campaign = Campaign.model_validate(bundled_campaign())
    points = expand(campaign, strict=False)
    result = assess(points, memory_estimate, "H200")
    by_label = {row.label: row for row in result.rows}
    fits = by_label["hidden_size=32, tensor=1"]
    assert fits.feasible and fits.reason is None and fits.gpu == "H200" and fits.gpu_gib == 139.8
    want = estimate(Recipe.model_validate(points[0].recipe), 1, gpu=True)
    assert fits.estimate_gib == round(want.peak_gib, 3)
    assert fits.headroom_gib == pytest.approx(139.8 - want.peak_gib, abs=1e-3)
    big = by_label[f"hidden_size={HUGE}, tensor=1"]
    assert not big.feasible and big.estimate_gib > 139.8 and big.headroom_gib < 0
    assert big.reason.startswith("memory: estimated peak") and "exceeds the H200's 139.8 GiB" in big.reason
    tp = by_label["hidden_size=32, tensor=2"]
    assert not tp.feasible and tp.estimate_gib is None
    assert "parallel.tensor: the bundled trainer supports only tensor = 1 (got 2)" in tp.reason
    assert not tp.reason.startswith("point [")  # the row names its point; its reason does not repeat it
    assert [p.label for p in result.runnable] == ["hidden_size=32, tensor=1"]
    # on an 80 GiB part of a bigger GPU the huge point stays out, on a 200 GiB one it fits
    assert len(assess(points, memory_estimate, "200GiB").runnable) == 2


def test_store_estimates_upsert_and_an_old_store_gets_the_table(tmp_path):
    shutil.copy(ROOT / "tests" / "data" / "store_schema1.sqlite", tmp_path / "mbx.sqlite")
    with Store(tmp_path) as store:  # schema 1, migrated; the estimates table is added beside
        assert store.estimates("anything") == []
        rows = [{"point_id": "a", "label": "x=1", "feasible": True, "reason": None, "estimate_gib": 1.5},
                {"point_id": "b", "label": "x=2", "feasible": False, "reason": "memory: too big"}]  # fmt: skip
        store.record_estimates("c", rows)
        store.record_estimates("c", [{"point_id": "a", "label": "x=1", "feasible": False, "reason": "now"}])
        got = store.estimates("c")
        assert [(r["point_id"], r["feasible"], r["reason"]) for r in got] == [("a", False, "now"),
                                                                            ("b", False, "memory: too big")]  # fmt: skip
        store.record_estimates("c", rows[1:], replace=True)
        assert [r["point_id"] for r in store.estimates("c")] == ["b"]


def test_plan_shows_estimates_headroom_and_why_points_are_skipped(mbx, write_campaign):
    path = write_campaign(bundled_campaign())
    result = mbx("campaign", "plan", str(path))
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[1]
    assert all(col in header for col in ("est GiB", "gpu", "headroom", "feasible"))
    assert result.stdout.count("INFEASIBLE") == 3 and "3 of 4 point(s) infeasible, skipped" in result.stdout
    assert f"point [hidden_size={HUGE}, tensor=1]: memory: estimated peak" in result.stdout
    assert (
        "point [hidden_size=32, tensor=2]: parallel.tensor: the bundled trainer supports only tensor = 1"
        in result.stdout
    )

    cells = json.loads(mbx("campaign", "plan", str(path), "--json", "--gpu", "B200").stdout)
    assert [c["estimate"]["feasible"] for c in cells] == [
        True,
        False,
        True,
        False,
    ]  # the huge point fits a B200
    assert cells[2]["estimate"]["gpu"] == "B200" and cells[2]["estimate"]["headroom_gib"] > 0

    strict = mbx("campaign", "plan", str(path), "--strict")
    assert strict.returncode == 2 and "Traceback" not in strict.stderr
    assert "parallel.tensor: the bundled trainer supports only tensor = 1 (got 2)" in strict.stderr
    unknown = mbx("campaign", "plan", str(path), "--gpu", "K80")
    assert unknown.returncode == 2 and "unknown GPU 'K80'" in unknown.stderr and "H200" in unknown.stderr


def test_run_skips_infeasible_points_records_them_and_freeze_names_them(
    mbx, write_campaign, tmp_path, cache_env
):
    path = write_campaign(bundled_campaign())
    workspace = tmp_path / "ws"
    dry = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "memory estimate per GPU" in dry.stdout and dry.stdout.count("INFEASIBLE") == 3
    assert "1 attempt(s) rendered" in dry.stdout and not workspace.exists()

    strict = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--gpu", "H200", "--strict")
    assert strict.returncode == 2 and not workspace.exists(), strict.stderr

    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report", env=cache_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 of 4 point(s) infeasible, skipped (not run)" in result.stdout
    assert "PASS 1/1 completed" in result.stdout
    with Store(workspace) as store:
        cells = store.cells("feas")
        rows = store.estimates("feas")
    assert [c.label for c in cells] == ["hidden_size=32, tensor=1"]
    assert [r["feasible"] for r in rows] == [True, False, False, False]
    assert rows[0]["cells"] == [cells[0].cell_id] and rows[0]["estimate_gib"] > 0
    assert rows[1]["estimate_gib"] is None and rows[2]["estimate_gib"] > 139.8

    frozen = mbx("freeze", "feas", "--workspace", str(workspace), "--out", str(tmp_path / "frozen"))
    assert frozen.returncode == 0, frozen.stdout + frozen.stderr
    text = (tmp_path / "frozen" / "FROZEN.md").read_text()
    assert "infeasible: memory: estimated peak" in text
    assert "infeasible: parallel.tensor: the bundled trainer supports only tensor = 1" in text


def test_every_point_infeasible_refuses_the_campaign(mbx, write_campaign, tmp_path):
    data = bundled_campaign(sweep={"axes": {"model.hidden_size": [HUGE]}})
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(write_campaign(data)), "--workspace", str(workspace))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "every point of the campaign is infeasible" in result.stderr and not workspace.exists()


def test_command_trainer_layout_headroom_gate_and_regate(mbx, write_campaign, tmp_path):
    path = write_campaign(command_campaign())
    workspace = tmp_path / "ws"
    strict = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--strict")
    assert strict.returncode == 2 and not workspace.exists()
    assert "world size 1 is not divisible by TP·PP·CP = 4·4·1" in strict.stderr

    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 of 2 point(s) infeasible" in result.stdout and "PASS 1/1 completed" in result.stdout
    with Store(workspace) as store:
        rows = store.estimates("mega")
        (cell,) = store.cells("mega")
        (attempt,) = store.attempts("mega")
        gate = store.result("mega", cell.cell_id, attempt.attempt).gate
    assert rows[0]["source"] == "command" and 0 < rows[0]["estimate_gib"] < 79.6
    assert not rows[1]["feasible"] and "TP·PP·CP = 4·4·1" in rows[1]["reason"]
    (check,) = [c for c in gate["checks"] if c["gate"] == "headroom_gib_min"]
    assert check["ok"] and check["value"] == pytest.approx(79.6 - FAKE_PEAK_GIB)

    stricter = copy.deepcopy(command_campaign())
    stricter["gates"]["headroom_gib_min"] = 70
    regated = mbx("campaign", "regate", "mega", "--workspace", str(workspace), "--file",
                  str(write_campaign(stricter, "stricter.yaml")))  # fmt: skip
    assert regated.returncode == 1, regated.stdout + regated.stderr
    assert f"headroom_gib_min: {79.6 - FAKE_PEAK_GIB:.4g} GiB is below the minimum 70 GiB" in regated.stdout


def test_headroom_gate_on_cpu_is_inconclusive_not_a_pass(mbx, write_campaign, tmp_path, cache_env):
    data = bundled_campaign(sweep={"axes": {"model.hidden_size": [32]}}, gates={"headroom_gib_min": 1})
    result = mbx("campaign", "run", str(write_campaign(data)), "--workspace", str(tmp_path / "ws"), "--no-report",
                 env=cache_env)  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr
    assert "headroom_gib_min: no GPU peak allocated memory was measured" in result.stdout
    with Store(tmp_path / "ws") as store:
        gates = store.campaign("feas")["spec"]["gates"]
    assert gates["gpu_memory_gib"] == 139.8  # filled from resources.gpu, stored for regate and resume
