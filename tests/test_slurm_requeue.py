"""A job Slurm requeues mid-run (`scontrol requeue`, as preemption does) is the same cell's next attempt, on a real Slurm."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

pytest_plugins = ["slurm_cluster"]
pytestmark = pytest.mark.slurm


def _running_launch(workspace: Path, campaign: str, timeout: float) -> dict:
    """launch.json of the point once its rank 0 has logged a step."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for launch in (workspace / campaign).glob("*/1/launch.json"):
            log = launch.parent / "logs" / "rank-0.log"
            try:
                data = json.loads(launch.read_text())
            except json.JSONDecodeError:
                continue
            if data.get("job_id") and log.exists() and "step 2/" in log.read_text():
                return data
        time.sleep(0.3)
    raise TimeoutError("the point never reached step 2")


def test_requeued_job_is_a_new_attempt_of_the_same_cell(
    slurm, tmp_path: Path, cache_env, write_campaign
) -> None:
    workspace = tmp_path / "ws"
    data = slurm.campaign("qs-requeue", steps=150, sweep={"axes": {"model.moe.top_k": [2]}})
    data["launchers"]["submitit"]["requeue"] = True
    file = write_campaign(data)
    env = {**os.environ, **cache_env, **slurm.env, "PYTHONPATH": str(ROOT)}
    with slurm.campaign_in_background(file, workspace, env) as proc:
        launch = _running_launch(workspace, "qs-requeue", timeout=120)
        slurm.run("scontrol", "requeue", launch["job_id"])
        requeued_at = time.time()
        # Slurm holds the requeued job back (BeginTime +2 min): release it, but only once the interrupted run has
        # left the node. squeue says PENDING while the old run is still completing; a job started then is killed
        # by Slurm ("non-startable batch job: credential revoked"), which is not what this test is about. So is a
        # job started within the same second as the requeue: slurmd compares the new credential's creation time
        # with the revocation time in whole seconds (credential revoked if ctime <= revoked), so wait 2 s more.
        deadline = time.time() + 60
        while time.time() < deadline:
            state = slurm.run("squeue", "-h", "-j", launch["job_id"], "-o", "%T", check=False).stdout.strip()
            node = slurm.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
            if state == "PENDING" and node == "idle" and time.time() - requeued_at > 2.5:
                slurm.run("scontrol", "update", f"JobId={launch['job_id']}", "StartTime=now")
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"the requeued job never waited idle: squeue {state!r}, node {node!r}")
        out, _ = proc.communicate(timeout=420)
    assert proc.returncode == 0, out
    assert "requeued by Slurm" in out and "PASS 1/1 completed" in out, out

    db = sqlite3.connect(workspace / "mbx.sqlite")
    cells = db.execute("SELECT cell_id FROM cells WHERE campaign='qs-requeue'").fetchall()
    attempts = db.execute(
        "SELECT cell_id, attempt, state, failure_class, job_id, run_dir, reason FROM attempts "
        "WHERE campaign='qs-requeue' ORDER BY attempt"
    ).fetchall()
    db.close()
    assert len(cells) == 1, "a requeue never makes a second cell"
    (cell_id,) = cells[0]
    (first, second) = attempts
    live = workspace / "qs-requeue" / cell_id / "1"  # the run dir of attempt 1, where the rerun runs too
    assert first[:5] == (cell_id, 1, "preempted", "preempted", launch["job_id"]), first
    # the store keeps run dirs relative to the workspace (a moved workspace stays readable)
    assert workspace / first[5] == live / "requeued" / "0" and "requeued by Slurm" in first[6]
    assert second[:5] == (cell_id, 2, "completed", None, launch["job_id"]), second
    assert workspace / second[5] == live and not Path(second[5]).is_absolute()

    # the interrupted run's outputs were kept apart from the rerun's
    archived = workspace / first[5]
    assert "step 2/" in (archived / "logs" / "rank-0.log").read_text()
    rerun = [json.loads(line) for line in (live / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rerun] == list(range(1, 151)), "the rerun's metrics start afresh"
    assert json.loads((live / "launch.json").read_text())["attempt"] == 2

    status = subprocess.run(
        [sys.executable, "-m", "orchestrator", "campaign", "status", "qs-requeue", "--workspace", str(workspace),
         "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    (row,) = json.loads(status.stdout)["cells"]
    assert row["state"] == "completed" and row["attempt"] == 2, row
