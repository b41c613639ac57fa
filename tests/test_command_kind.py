"""Trainer kinds as the engine uses them: launch spec, inputs, follower, finalize and planned steps."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import MEGATRON_LOG, ROOT, TINY_MOE_RECIPE

from orchestrator import trainers
from orchestrator.run.store import AttemptRow, CellRow
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.sweep import Point
from reports.parsers.follow import LogFollower
from trainer import rundir

LOG = MEGATRON_LOG


def cell_of(campaign: Campaign, point: Point) -> CellRow:
    return CellRow(campaign=campaign.name, cell_id=point.cell_id, point_id=point.point_id, repeat=point.repeat,
                   ordinal=0, label=point.label, params=point.params, recipe=point.recipe,
                   resources=point.resources, env=point.env, trainer_kind=point.trainer_kind)  # fmt: skip


def attempt_of(cell: CellRow, run_dir: Path, number: int = 1) -> AttemptRow:
    return AttemptRow(campaign=cell.campaign, cell_id=cell.cell_id, attempt=number, launcher="local",
                      run_dir=str(run_dir), state="submitted")  # fmt: skip


def command_campaign(**trainer) -> Campaign:
    return Campaign.model_validate({
        "name": "c", "resources": {"gpus_per_node": 2}, "env": {"values": {"A": "1"}, "pass": ["SECRET"]},
        "trainer": {"kind": "command", "command": ["prog", "--out", "{run_dir}", "--try", "{attempt}"], **trainer},
    })  # fmt: skip


def test_lookup_by_name_and_campaign():
    assert trainers.get("bundled").name == "bundled" and trainers.get("command").module is None
    assert trainers.for_campaign(command_campaign()).name == "command"
    with pytest.raises(KeyError, match="no such trainer kind 'ingested'; known: bundled, command"):
        trainers.get("ingested")


def test_bundled_kind_runs_the_trainer_module_on_its_recipe(tmp_path):
    campaign = Campaign.model_validate({"name": "b", "trainer": {"recipe": copy.deepcopy(TINY_MOE_RECIPE)}})
    kind = trainers.for_campaign(campaign)
    (point,) = kind.expand(campaign)
    cell = cell_of(campaign, point)
    assert point.trainer_kind == "bundled"
    spec = kind.launch_spec(campaign, cell, attempt_of(cell, tmp_path / "1"))
    assert spec.module == "trainer"
    assert spec.args == ["--recipe", str(tmp_path / "1" / "recipe.yaml"), "--out", str(tmp_path / "1")]
    kind.write_inputs(cell, spec)
    assert yaml.safe_load((tmp_path / "1" / rundir.RECIPE).read_text()) == point.recipe
    assert kind.follower(cell, tmp_path / "1") is None
    assert kind.planned_steps(cell) == point.recipe["training"]["steps"]


def test_command_kind_fills_the_attempt_and_records_what_ran(tmp_path):
    campaign = command_campaign(params={"train_iters": 15})
    kind = trainers.for_campaign(campaign)
    (point,) = kind.expand(campaign)
    cell = cell_of(campaign, point)
    run_dir = tmp_path / "2"
    spec = kind.launch_spec(campaign, cell, attempt_of(cell, run_dir, 2))
    assert spec.module is None
    assert spec.args == ["prog", "--out", str(run_dir), "--try", "2", "--train-iters", "15"]
    assert (spec.env, spec.env_pass, spec.resources.world_size) == ({"A": "1"}, ["SECRET"], 2)
    kind.write_inputs(cell, spec)
    recorded = yaml.safe_load((run_dir / rundir.RECIPE).read_text())
    assert recorded["argv"] == spec.args and recorded["env"] == {"A": "1"} and recorded["steps"] == 15
    assert kind.planned_steps(cell) == 15
    follower = kind.follower(cell, run_dir)
    assert isinstance(follower, LogFollower) and follower.update() is False


def test_command_kind_finalizes_logs_into_metrics_and_status(tmp_path):
    campaign = command_campaign(params={"train_iters": 15})
    kind = trainers.for_campaign(campaign)
    cell = cell_of(campaign, kind.expand(campaign)[0])
    run_dir = tmp_path / "1"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "rank-0.log").write_bytes(LOG.read_bytes())
    rundir.write_exit(run_dir, exit_code=0, started_at=1.0, ended_at=2.0)
    follower = kind.follower(cell, run_dir)
    follower.update()
    kind.finalize(campaign, cell, run_dir, follower)
    status = rundir.read_status(run_dir)
    assert status["state"] == "completed" and status["written_by"] == rundir.COLLECTOR
    assert not rundir.status_problems(status)
    assert len(rundir.read_metrics(run_dir)) == status["steps_logged"] == 15


def test_a_collection_problem_is_recorded_not_raised(tmp_path):
    campaign = command_campaign()
    kind = trainers.for_campaign(campaign)
    cell = cell_of(campaign, kind.expand(campaign)[0])
    run_dir = tmp_path / "1"
    run_dir.mkdir()
    (run_dir / rundir.METRICS).mkdir()  # metrics.jsonl cannot be replaced
    kind.finalize(campaign, cell, run_dir, None)
    status = rundir.read_status(run_dir)
    assert status["state"] == "failed" and status["failure_class"] == "unknown"
    assert (
        status["reason"].startswith("mbx could not collect the logs")
        and status["written_by"] == rundir.COLLECTOR
    )


def test_exit_json_stop_decides_over_the_wrapper_status(tmp_path):
    """The wrapper's time limit (exit.json) is a timeout even when its status.json only says failed."""
    from orchestrator.trainers.kinds.command import finalize_command_attempt

    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    rundir.write_exit(run_dir, exit_code=-15, started_at=1.0, ended_at=2.0, timed_out_after_s=60)
    status = finalize_command_attempt(run_dir, {"log_format": "auto"}, 1)
    assert (status["state"], status["failure_class"], status["retryable"]) == ("timeout", "timeout", False)
    assert status["reason"] == "time limit of 60 s reached"
    assert json.loads((run_dir / rundir.STATUS).read_text())["exit_code"] == -15


def test_expand_is_one_loop_for_both_kinds():
    """Points of both kinds come out of sweep.expand_points: labels, repeats and dedup behave the same."""
    campaign = command_campaign(params={"train_iters": 15})
    campaign = campaign.model_copy(update={"sweep": campaign.sweep.model_copy(
        update={"axes": {"train_iters": [15, 30]}, "cells": [{"train_iters": 15}], "repeats": 2})})  # fmt: skip
    points = trainers.expand(campaign)
    assert [p.label for p in points] == ["train_iters=15"] * 2 + ["train_iters=30"] * 2
    assert [p.repeat for p in points] == [0, 1, 0, 1] and len({p.point_id for p in points}) == 2
    assert all(p.trainer_kind == "command" for p in points)


def test_expansion_never_imports_torch():
    """Login-node code: expanding both kinds' points (the recipe schema included) leaves torch unimported."""
    code = ("import sys; from orchestrator import trainers; from orchestrator.spec.loader import load_campaign; "
            "trainers.expand(load_campaign(sys.argv[1])); assert 'torch' not in sys.modules, 'torch imported'")  # fmt: skip
    for name in ("quickstart.yaml", "megatron_bridge_moe_dispatcher.yaml"):
        done = subprocess.run([sys.executable, "-c", code, str(ROOT / "campaigns" / name)], capture_output=True,
                              text=True, cwd=ROOT)  # fmt: skip
        assert done.returncode == 0, done.stderr
