"""Seed 001 in campaigns: `parity.checkpoint` (save with single expert weights, reload as discrete, continue ==
straight through) with the bundled trainer, and `parity.eval_check` for a command trainer through
`trainer.eval_interval_param`; each as a real `mbx campaign run` on the CPU, with a planted bug that must FAIL."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import yaml
from conftest import ROOT

SHIPPED = ROOT / "campaigns" / "seed001_checkpoint_parity.yaml"
FAKE_EVAL = ROOT / "tests" / "fixtures_cmd" / "fake_megatron_eval.py"


def stored_parity(workspace: Path, name: str) -> list[dict]:
    with sqlite3.connect(workspace / "mbx.sqlite") as db:
        rows = db.execute("SELECT detail_json FROM parity WHERE campaign=? ORDER BY ordinal", (name,)).fetchall()
    return [json.loads(r[0]) for r in rows]


def test_shipped_checkpoint_campaign_passes_and_lr_on_the_loading_side_fails(tmp_path, mbx, write_campaign,
                                                                              cache_env):
    done = mbx("campaign", "run", str(SHIPPED), "-w", str(tmp_path / "ws"), "--no-report", env=cache_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("PASS 4/4 completed") and "parity PASS: 2 of 2" in done.stdout
    pairs = stored_parity(tmp_path / "ws", "seed001-checkpoint-parity")
    assert [p["kind"] for p in pairs] == ["checkpoint", "checkpoint"]
    assert pairs[0]["title"] == ('save at step 4, reload with {"model.moe.expert_weights": "discrete"} vs '
                                 "straight through")
    loss = next(m for m in pairs[0]["metrics"] if m["metric"] == "loss")
    assert (loss["verdict"], loss["steps"], loss["max_abs"]) == ("pass", 10, 0.0)

    # Planted: the loading side continues at 1.5× the learning rate (one point: 2 cells).
    data = yaml.safe_load(SHIPPED.read_text())
    data["parity"]["checkpoint"]["load_with"]["optimizer.lr"] = 4.5e-3
    del data["sweep"]
    bad = mbx("campaign", "run", str(write_campaign(data)), "-w", str(tmp_path / "bad"), "--no-report",
              env=cache_env)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "parity FAIL save at step 4, reload with" in bad.stdout
    (pair,) = stored_parity(tmp_path / "bad", "seed001-checkpoint-parity")
    loss = next(m for m in pair["metrics"] if m["metric"] == "loss")
    # Step 5 (the first after the reload) updates with the higher lr; its loss was computed before that update.
    assert pair["verdict"] == "fail" and loss["first_exceeded"] == 6


def command_campaign(name: str, **params: object) -> dict:
    return {
        "name": name,
        "trainer": {"kind": "command", "command": [sys.executable, str(FAKE_EVAL)],
                    "params": {"train_iters": 8, "eval_interval": 3, **params},
                    "eval_interval_param": "eval_interval", "log_format": "megatron-lm", "seq_length": 16},
        "parity": {"eval_check": True},
        "launchers": {"local": {"parallel": 2}},
        "wandb": {"mode": "disabled"},
    }  # fmt: skip


def test_command_trainer_eval_check_passes_and_catches_a_spike_after_eval(tmp_path, mbx, write_campaign):
    plan = mbx("campaign", "plan", str(write_campaign(command_campaign("cmd-eval"))), "--json")
    assert plan.returncode == 0, plan.stderr
    assert sorted(str(p["params"]["params.eval_interval"]) for p in json.loads(plan.stdout)) == ["3", "None"]
    done = mbx("campaign", "run", str(write_campaign(command_campaign("cmd-eval"))), "-w", str(tmp_path / "ok"),
               "--no-report")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "parity PASS train-eval-train vs train-only" in done.stdout
    spiked = write_campaign(command_campaign("cmd-eval", spike_after_eval=True))
    bad = mbx("campaign", "run", str(spiked), "-w", str(tmp_path / "bad"), "--no-report")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    (pair,) = stored_parity(tmp_path / "bad", "cmd-eval")
    grad_norm = next(m for m in pair["metrics"] if m["metric"] == "grad_norm")
    assert pair["verdict"] == "fail" and grad_norm["first_exceeded"] == 4  # the step after the eval at 3


def test_kind_dependent_parity_checks_refused_where_the_kind_lacks_them(mbx, write_campaign):
    undeclared = command_campaign("c1")
    del undeclared["trainer"]["eval_interval_param"]
    typo = command_campaign("c2")
    typo["trainer"]["eval_interval_param"] = "eval_intervall"
    checkpoint = command_campaign("c3")
    checkpoint["parity"] = {"checkpoint": {"save_at": 2}}
    for data, message in ((undeclared, "parity.eval_check: name the command's evaluation-interval param in "
                                       "trainer.eval_interval_param"),
                          (typo, "trainer.eval_interval_param: 'eval_intervall' is not a param (declared: "
                                 "eval_interval, train_iters)"),
                          (checkpoint, "parity.checkpoint: a command trainer cannot be told to save and reload")):
        file = write_campaign(data, name=f"{data['name']}.yaml")
        done = mbx("campaign", "validate", str(file))
        assert done.returncode == 2 and message in done.stderr and str(file) in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_a_load_with_typo_exits_2_naming_the_key(mbx, write_campaign):
    data = yaml.safe_load(SHIPPED.read_text())
    data["parity"]["checkpoint"]["load_with"] = {"model.moe.expert_weightz": "discrete"}
    file = write_campaign(data)
    done = mbx("campaign", "validate", str(file))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert (f"{file}: point [" in done.stderr and "trainer.recipe: checkpoint.reload_with: model.moe.expert_weightz: "
            "Extra inputs are not permitted" in done.stderr), done.stderr
