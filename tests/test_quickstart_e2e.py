"""The quickstart campaign end to end: real trainer processes, run store rows, W&B offline runs, report page."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from conftest import ROOT


def test_quickstart_end_to_end(mbx, tmp_path, cache_env):
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(ROOT / "campaigns" / "quickstart.yaml"), "--workspace", str(workspace), env=cache_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS 4/4 completed" in result.stdout

    # store rows: 4 active cells, one completed attempt each, results with a passing verdict and real numbers
    db = sqlite3.connect(workspace / "mbx.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    cells = db.execute("SELECT cell_id, params_json FROM cells WHERE campaign='quickstart' AND active=1").fetchall()
    assert len(cells) == 4
    attempts = db.execute("SELECT cell_id, attempt, state, run_dir FROM attempts WHERE campaign='quickstart'").fetchall()
    assert sorted(a[2] for a in attempts) == ["completed"] * 4
    results = db.execute("SELECT summary_json, verdict FROM results WHERE campaign='quickstart'").fetchall()
    assert [r[1] for r in results] == ["pass"] * 4
    for summary_json, _ in results:
        summary = json.loads(summary_json)
        assert summary["window_steps"] == 10 and summary["window_first_step"] == 21 and summary["window_last_step"] == 30
        assert summary["tflops_per_gpu"] > 0 and summary["step_time_ms"] > 0
        assert summary["last_loss"] < summary["first_loss"], "the quickstart model should learn"

    # run dirs follow the contract
    for _, _, _, run_dir in attempts:
        assert not Path(run_dir).is_absolute(), f"{run_dir}: the store records run dirs relative to the workspace"
        run = workspace / run_dir
        for name in ("recipe.yaml", "launch.json", "metrics.jsonl", "status.json", "env.json"):
            assert (run / name).exists(), f"{run}/{name} missing"
        assert json.loads((run / "status.json").read_text())["state"] == "completed"
        assert any((run / "logs").iterdir())

    # W&B: one offline run per attempt, grouped by campaign, and one of the campaign's outcome (issue 31)
    offline_runs = sorted((workspace / "wandb").glob("**/offline-run-*"))
    assert len(offline_runs) == 5, offline_runs

    # report page and Markdown summary
    page = workspace / "quickstart" / "report" / "index.html"
    html = page.read_text()
    assert "quickstart" in html and all(cell_id in html for cell_id, _ in cells)
    assert (page.parent / "summary.md").exists()

    # a second run skips every completed cell and runs nothing
    again = mbx("campaign", "run", str(ROOT / "campaigns" / "quickstart.yaml"), "--workspace", str(workspace),
                "--no-wandb", env=cache_env)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "4 skipped: already completed" in again.stdout
    assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 4
