"""User text is never Rich markup: a campaign whose description, sweep values, labels, paths and failure reasons hold
`[/x]`, `[bold]` and `:smile:` runs, is killed and resumed (adopting its running attempt), reports and shows status
cleanly, printing every such text as it was written (real `mbx` subprocesses, the tiny recipe)."""

from __future__ import annotations

import copy
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, TINY_MOE_RECIPE, run_mbx

MARKUP = ["[/x]", "[bold]b[/bold] :smile: [red"]
OOM = "torch.OutOfMemoryError: CUDA out of memory [/x] [bold]boom[/bold]"


def _clean(result: subprocess.CompletedProcess, code: int) -> str:
    text = result.stdout + result.stderr
    assert "Traceback" not in text and "MarkupError" not in text, text
    assert result.returncode == code, text
    return text


def _states(workspace: Path) -> list[str]:
    store = workspace / "mbx.sqlite"
    if not store.exists():
        return []
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=10)
    try:
        return [r[0] for r in db.execute("SELECT state FROM attempts ORDER BY cell_id, attempt")]
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _bundled(folder: Path, name: str, steps: int) -> Path:
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = steps
    return _write(folder / f"{name}[/x].yaml", {
        "name": name, "description": "[bold]desc[/x] :smile:", "trainer": {"recipe": recipe},
        "sweep": {"axes": {"env.USER_TAG": MARKUP}}, "collect": {"window": 2},
        "launchers": {"local": {"parallel": 1}}, "wandb": {"mode": "disabled"},
    })  # fmt: skip


def test_markup_in_values_labels_paths_and_reasons(tmp_path, cache_env):
    folder = tmp_path / "dir [/x] [bold]"
    workspace = folder / "ws[/x]"
    file = _bundled(folder, "mk", 4)
    run = _clean(run_mbx("campaign", "run", str(file), "--workspace", str(workspace), env=cache_env), 0)
    for text in (*MARKUP, str(workspace)):
        assert text in run.replace("\n", ""), text
    assert "PASS 2/2 completed" in run

    failing = _write(folder / "fail[/x].yaml", {
        "name": "mkfail", "trainer": {"kind": "command", "command": [
            sys.executable, "-c", f"import sys; print({OOM!r}, file=sys.stderr); sys.exit(3)"]},
        "sweep": {"axes": {"env.USER_TAG": ["[/x]"]}}, "wandb": {"mode": "disabled"},
    })  # fmt: skip
    failed = _clean(run_mbx("campaign", "run", str(failing), "--workspace", str(workspace), env=cache_env), 1)
    assert "CUDA out of memory [/x] [bold]boom[/bold]" in failed.replace("\n", "") and "FAIL 0/1" in failed

    for name in ("mk", "mkfail"):
        status = _clean(run_mbx("campaign", "status", name, "--workspace", str(workspace)), 0)
        assert "[/x]" in status and name in status
        as_json = json.loads(_clean(run_mbx("campaign", "status", name, "--workspace", str(workspace), "--json"), 0))["cells"]
        assert any("[/x]" in cell["label"] for cell in as_json)
        report = _clean(run_mbx("report", name, "--workspace", str(workspace), "--markdown"), 0)
        assert str(workspace) in report.replace("\n", "")
    assert "CUDA out of memory" in json.dumps(as_json)
    listed = _clean(run_mbx("campaign", "list", "--workspace", str(workspace)), 0)
    assert "mk" in listed and "mkfail" in listed
    plan = _clean(run_mbx("campaign", "plan", str(file)), 0)
    assert all(text in plan for text in MARKUP) and "env.USER_TAG" in plan
    resumed = _clean(run_mbx("campaign", "resume", "mk", "--workspace", str(workspace), env=cache_env), 0)
    assert "[USER_TAG=[/x]] already completed" in resumed.replace("\n", "")
    dry = _clean(run_mbx("campaign", "run", str(file), "--workspace", str(workspace), "--dry-run"), 0)
    assert "dry run" in dry


def test_resume_adopts_an_attempt_whose_label_is_markup(tmp_path, cache_env):
    """The "adopted running attempt" line printed a label as markup (MarkupError): the campaign stayed `running`."""
    folder = tmp_path / "w[/x]"
    workspace = folder / "ws [bold]"
    file = _bundled(folder, "adopt", 150)
    env = dict(os.environ, PYTHONPATH=str(ROOT), **cache_env)
    first = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "campaign", "run", str(file), "--workspace", str(workspace),
         "--no-report"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 300
    while "running" not in _states(workspace):
        assert time.time() < deadline, "no attempt started"
        assert first.poll() is None, "the run ended before it could be killed"
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)
    first.wait()

    resumed = _clean(run_mbx("campaign", "resume", "adopt", "--workspace", str(workspace), env=cache_env), 0)
    assert "adopted running attempt 1 of" in resumed and "[USER_TAG=[/x]]" in resumed.replace("\n", "")
    assert _states(workspace) == ["completed", "completed"]
    assert "PASS 2/2 completed" in resumed
