"""What a card carries (issue 23): the alternatives that lost with freeze's reasons, and the command of the frozen
campaign (the point alone, with repeats and portable gates) rather than the whole sweep; and freeze refuses to write
a secret. One real CPU campaign: a bf16 point that runs and an fp8 point the trainer refuses on a CPU."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from conftest import TINY_MOE_RECIPE, run_mbx

from orchestrator.errors import UsageError
from orchestrator.judge.freeze import freeze
from orchestrator.judge.freeze_out import write_frozen


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(workspace, the bf16 point's id) after one real run of the two-point campaign."""
    tmp = tmp_path_factory.mktemp("cards")
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 13
    data = {"name": "cardpick", "description": "two precisions of a tiny MoE", "trainer": {"recipe": recipe},
            "collect": {"window": 10}, "wandb": {"mode": "disabled"}, "launchers": {"local": {"parallel": 1}},
            "env": {"values": {"OMP_NUM_THREADS": "1"}},
            "sweep": {"repeats": 1, "cells": [{"precision": "bf16"}, {"precision": "fp8"}]}}  # fmt: skip
    path = tmp / "cardpick.yaml"
    path.write_text(yaml.safe_dump(data))
    workspace = tmp / "ws"
    env = {"MBX_CACHE_DIR": str(tmp / "cache"), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    run = run_mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report", env=env)
    assert run.returncode == 1, run.stdout + run.stderr  # the fp8 point fails on a CPU
    points = json.loads(run_mbx("campaign", "status", "cardpick", "--workspace", str(workspace), "--json").stdout)["cells"]
    (bf16,) = [p["point_id"] for p in points if "bf16" in p["label"]]
    return workspace, bf16


def test_card_carries_the_rejected_list_and_the_frozen_campaigns_command(mbx, campaign, tmp_path: Path) -> None:
    workspace, point = campaign
    card_file = tmp_path / "cardpick.card.yaml"
    exported = mbx("card", "export", "cardpick", "--point", point, "--workspace", str(workspace), "-o", str(card_file))
    assert exported.returncode == 0, exported.stderr
    (body,) = yaml.safe_load(card_file.read_text())["items"]["pretrain_performance"].values()

    (rejected,) = body["rejected"]  # the fp8 point, with freeze's kind and reason
    assert rejected["kind"] == "failed" and "fp8" in rejected["label"] and rejected["why"]
    assert str(workspace) not in card_file.read_text()

    frozen = body["campaign"]  # the frozen campaign: this point alone, repeated, with portable gates
    assert body["command"] == "mbx campaign run cardpick-frozen.yaml" and frozen["name"] == "cardpick-frozen"
    assert frozen["sweep"] == {"repeats": 3} and frozen["trainer"]["recipe"]["precision"] == "bf16"
    assert frozen["gates"]["tflops_per_gpu_min"] == body["thresholds"]["last_10_steps_model_tflops_per_gpu_avg"]["min"]
    assert "launchers" not in frozen and "wandb" not in frozen
    reproduce = tmp_path / "cardpick-frozen.yaml"
    reproduce.write_text(yaml.safe_dump(frozen))
    assert mbx("campaign", "validate", str(reproduce)).returncode == 0
    assert mbx("card", "validate", str(card_file)).returncode == 0


def test_freeze_refuses_to_write_a_secret_and_writes_nothing(campaign, tmp_path: Path) -> None:
    workspace, point = campaign
    frozen = freeze(workspace, "cardpick", point=point)
    values = frozen.spec.setdefault("env", {}).setdefault("values", {})
    values["NOTE"] = "rerun with WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567"
    out = tmp_path / "frozen"
    with pytest.raises(UsageError) as refused:
        write_frozen(frozen, out)
    message = "\n".join(refused.value.lines())
    assert "campaign.yaml: env.values.NOTE: contains a credential (WANDB_API_KEY=<redacted>)" in message
    assert "0123456789abcdef" not in message and not out.exists()

    values["NOTE"] = "no secrets: [/x] and git sha 6cee5e81ee83917806bbde320786a8fb61efebee"
    assert {p.name for p in write_frozen(frozen, out)} == {"campaign.yaml", "FROZEN.md", "frozen.json", "recipe.yaml"}
