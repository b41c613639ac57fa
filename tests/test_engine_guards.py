"""What the engine must never do: let a second run of a running campaign touch its state, or append a re-run
to an earlier attempt's files."""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, TINY_MOE_RECIPE


def _store_rows(store: Path, query: str) -> list[tuple]:
    if not store.exists():
        return []
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=10)
    try:
        return list(db.execute(query))
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


def _campaign(name: str, steps: int, top_k: list[int], description: str) -> dict:
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = steps
    return {
        "name": name,
        "description": description,
        "trainer": {"recipe": recipe},
        "sweep": {"axes": {"model.moe.top_k": top_k}},
        "wandb": {"mode": "disabled"},
    }


def test_second_run_of_a_running_campaign_is_refused_before_it_writes(mbx, write_campaign, tmp_path, cache_env):
    first = write_campaign(_campaign("busy", 400, [1], "the first file"), "first.yaml")
    other = write_campaign(_campaign("busy", 4, [2, 3], "another file, same name"), "other.yaml")
    workspace = tmp_path / "ws"
    store = workspace / "mbx.sqlite"
    env = dict(os.environ, PYTHONPATH=str(ROOT), **cache_env)
    running = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "campaign", "run", str(first), "--workspace", str(workspace),
         "--no-report"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while not _store_rows(store, "SELECT state FROM attempts WHERE state='running'"):
            assert running.poll() is None and time.time() < deadline, "the first run never got going"
            time.sleep(0.1)
        spec_before = _store_rows(store, "SELECT spec_json, source_file FROM campaigns")
        cells_before = _store_rows(store, "SELECT cell_id, active FROM cells ORDER BY cell_id")

        second = mbx("campaign", "run", str(other), "--workspace", str(workspace), "--no-report", env=cache_env)
        assert second.returncode == 1, second.stdout + second.stderr
        assert "already being run" in second.stderr and "Traceback" not in second.stderr
        assert _store_rows(store, "SELECT spec_json, source_file FROM campaigns") == spec_before
        assert _store_rows(store, "SELECT cell_id, active FROM cells ORDER BY cell_id") == cells_before
        assert json.loads(spec_before[0][0])["description"] == "the first file"
    finally:
        mbx("campaign", "cancel", "busy", "--workspace", str(workspace), env=cache_env)
        running.wait(timeout=120)


def test_rerun_after_the_store_is_lost_never_appends_to_an_earlier_attempt(mbx, write_campaign, tmp_path, cache_env):
    file = write_campaign(_campaign("again", 4, [1], "re-run after losing the store"))
    workspace = tmp_path / "ws"
    run = mbx("campaign", "run", str(file), "--workspace", str(workspace), "--no-report", env=cache_env)
    assert run.returncode == 0, run.stdout + run.stderr
    (cell_dir,) = [p for p in (workspace / "again").iterdir() if p.is_dir() and "-r" in p.name]
    first_metrics = (cell_dir / "1" / "metrics.jsonl").read_bytes()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{workspace / 'mbx.sqlite'}{suffix}").unlink(missing_ok=True)

    again = mbx("campaign", "run", str(file), "--workspace", str(workspace), "--no-report", env=cache_env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (cell_dir / "1" / "metrics.jsonl").read_bytes() == first_metrics, "the re-run wrote into attempt 1"
    steps = [json.loads(line)["step"] for line in (cell_dir / "2" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert _store_rows(workspace / "mbx.sqlite", "SELECT attempt, state FROM attempts") == [(2, "completed")]
