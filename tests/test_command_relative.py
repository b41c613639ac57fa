"""Issue 31: a relative trainer command (`command: [python, ./train.py]`) resolves against the campaign file's folder
at plan time (the trainer runs in its run directory), while the campaign and a card keep it relative; a log that
says "can't open file" is a bad command (class config), not "unknown"."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import yaml
from conftest import ROOT

from reports.failures import classify_failure

FAKE = ROOT / "tests" / "fixtures_cmd" / "fake_megatron.py"
LM_LOG = ROOT / "tests" / "data" / "megatron" / "logs" / "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"


PYTHON = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # `python`: this one


def _campaign(folder: Path, name: str, script: str) -> Path:
    """A command campaign whose argv is portable: `python`, a script and a log beside the file, both relative."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(LM_LOG, folder / "run.log")
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "wandb": {"mode": "disabled"},
        "trainer": {"kind": "command", "command": ["python", script, "--replay", "./run.log", "--sleep-s", "0"]},
    }, sort_keys=False))  # fmt: skip
    return path


def test_a_relative_script_runs_from_the_campaign_folder_and_the_card_keeps_it_relative(mbx, tmp_path: Path) -> None:
    folder = tmp_path / "project"
    file = _campaign(folder, "relcmd", "./train.py")
    shutil.copy(FAKE, folder / "train.py")
    plan = mbx("campaign", "plan", str(file), "--json")  # from the repository's folder, not the campaign's
    assert plan.returncode == 0, plan.stderr
    (point,) = json.loads(plan.stdout)
    argv = point["recipe"]["argv"]  # resolved at plan time
    assert argv[1] == str((folder / "train.py").resolve()) and argv[3] == str((folder / "run.log").resolve())
    ws = tmp_path / "ws"
    run = mbx("campaign", "run", str(file), "-w", str(ws), env=PYTHON)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(mbx("campaign", "status", "relcmd", "-w", str(ws), "--json").stdout)["verdict"] == "pass"

    # the same file elsewhere is the same point (the id comes from the command as written)
    moved = _campaign(tmp_path / "elsewhere", "relcmd", "./train.py")
    assert json.loads(mbx("campaign", "plan", str(moved), "--json").stdout)[0]["point_id"] == point["point_id"]

    card = mbx("card", "export", "relcmd", "-p", point["point_id"], "-w", str(ws), "--out", str(tmp_path / "c.card.yaml"))
    assert card.returncode == 0, card.stdout + card.stderr
    item = next(iter(yaml.safe_load((tmp_path / "c.card.yaml").read_text())["items"].values()))
    body = next(iter(item.values()))
    assert body["campaign"]["trainer"]["command"][:4] == ["python", "./train.py", "--replay", "./run.log"]
    assert str(folder) not in (tmp_path / "c.card.yaml").read_text()


def test_a_missing_script_is_a_bad_command(mbx, tmp_path: Path) -> None:
    file = _campaign(tmp_path / "project", "missing", "./nowhere.py")
    ws = tmp_path / "ws"
    run = mbx("campaign", "run", str(file), "-w", str(ws), env=PYTHON)
    assert run.returncode == 1, run.stdout + run.stderr
    (cell,) = json.loads(mbx("campaign", "status", "missing", "-w", str(ws), "--json").stdout)["cells"]
    assert cell["state"] == "failed" and cell["failure_class"] == "config", cell
    assert "bad command" in cell["reason"] and "can't open file" in cell["reason"], cell["reason"]


def test_the_classifier_names_a_bad_command(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    for text, code in (("python: can't open file '/w/c/0/train.py': [Errno 2] No such file or directory\n", 2),
                       ("cannot start 'pretrain': No such file or directory\n", 127),
                       ("bash: pretrain.sh: command not found\n", 127)):  # fmt: skip
        log.write_text(text)
        found = classify_failure([str(log)], exit_codes=[code])
        assert found.failure_class == "config" and "bad command" in found.reason, (text, found)
