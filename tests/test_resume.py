"""Kill the orchestrator with SIGKILL mid-campaign; `mbx campaign resume` finishes, losing and repeating nothing."""

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

from conftest import ROOT, TINY_MOE_RECIPE


def _attempts(store: Path) -> list[tuple[str, int, str]]:
    if not store.exists():
        return []
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=10)
    try:
        return list(db.execute("SELECT cell_id, attempt, state FROM attempts ORDER BY cell_id, attempt"))
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


def test_sigkill_then_resume_finishes_everything_exactly_once(mbx, write_campaign, tmp_path, cache_env):
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 150
    path = write_campaign(
        {
            "name": "killme",
            "trainer": {"recipe": recipe},
            "sweep": {"axes": {"model.moe.top_k": [1, 2, 3]}},
            "launchers": {"local": {"parallel": 1}},
            "wandb": {"mode": "disabled"},
        }
    )
    workspace = tmp_path / "ws"
    env = dict(os.environ, PYTHONPATH=str(ROOT), **cache_env)
    orchestrator = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "campaign", "run", str(path), "--workspace", str(workspace), "--no-report"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    store = workspace / "mbx.sqlite"
    deadline = time.time() + 300
    while time.time() < deadline:
        states = [state for _, _, state in _attempts(store)]
        if states.count("completed") == 1 and states.count("running") == 1:
            break
        assert orchestrator.poll() is None, "orchestrator ended before it could be killed"
        time.sleep(0.1)
    else:
        raise AssertionError(f"never saw one completed and one running attempt: {_attempts(store)}")
    orchestrator.send_signal(signal.SIGKILL)
    orchestrator.wait()
    before = _attempts(store)
    running_cell = next(cell for cell, _, state in before if state == "running")

    result = mbx("campaign", "resume", "killme", "--workspace", str(workspace), "--no-wandb", env=cache_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "adopted running attempt 1 of " + running_cell in result.stdout

    after = _attempts(store)
    assert sorted(cell for cell, _, _ in after) == sorted({cell for cell, _, _ in after}), "a cell ran twice"
    assert len(after) == 3 and all(state == "completed" for _, _, state in after), after
    for cell, attempt, _ in after:
        run_dir = workspace / "killme" / cell / str(attempt)
        steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(1, 151)), f"{cell}: steps missing or repeated"
    # status shows the finished campaign and the report was written by resume
    status = mbx("campaign", "status", "killme", "--workspace", str(workspace), "--json")
    assert [c["state"] for c in json.loads(status.stdout)["cells"]] == ["completed"] * 3
    assert (workspace / "killme" / "report" / "index.html").exists()
