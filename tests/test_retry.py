"""Bounded retries with real failing processes: retryable classes get new attempts of the same cell, up to
retry.max_attempts, a retry without progress stops, a config error is never retried."""

from __future__ import annotations

import json
import sqlite3
import sys

from conftest import FAKE_MEGATRON, MEGATRON_LOG, ROOT, store_rows, wait_for

from orchestrator.run.retry import decide
from orchestrator.spec.campaign import Retry

FAKE = FAKE_MEGATRON
LOG = MEGATRON_LOG


def test_decide_rules():
    policy = Retry(max_attempts=3, on=["infra", "preempted"])
    assert decide(policy, "failed", "infra", 1, 3, None).retry
    assert decide(policy, "preempted", "preempted", 2, 5, 3).retry
    assert not decide(policy, "failed", "config", 1, 0, None).retry
    assert not decide(policy, "completed", None, 1, 15, None).retry
    assert not decide(policy, "cancelled", None, 1, 2, None).retry
    stop = decide(policy, "failed", "infra", 2, 3, 3)
    assert not stop.retry and "no progress" in (stop.why or "")
    spent = decide(policy, "failed", "infra", 3, 9, 4)
    assert not spent.retry and "3 of retry.max_attempts=3" in (spent.why or "")
    assert decide(Retry(), "failed", "infra", 1, 0, None).retry is False, "max_attempts 1: no retry"


def test_bounded_retries_with_real_failures(mbx, write_campaign, tmp_path):
    path = write_campaign(
        {
            "name": "flaky",
            "trainer": {
                "kind": "command",
                "command": [sys.executable, str(FAKE), "--replay", str(LOG), "--sleep-s", "0.01"],
                "params": {"fail_after": 3},
            },
            "sweep": {"axes": {"fail": ["infra-once", "infra-always", "infra-progress", "config"]}},
            "retry": {"max_attempts": 3, "on": ["infra", "preempted"]},
            "launchers": {"local": {"parallel": 4}},
            "wandb": {"mode": "disabled"},
        }
    )
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL 1/4 completed" in result.stdout
    assert "attempt 1 failed (infra)" in result.stdout and "retrying" in result.stdout
    # of the three failed cells only infra-progress (budget spent) is worth resuming: infra-always made no
    # progress on its retry (a real failure) and config is not retryable
    assert ("1 of them failed for a reason worth another attempt (infra): once it is fixed, "
            "`mbx campaign resume flaky` runs them again") in result.stdout, result.stdout  # fmt: skip

    db = sqlite3.connect(workspace / "mbx.sqlite")
    assert db.execute("SELECT COUNT(*) FROM cells WHERE campaign='flaky'").fetchone()[0] == 4, (
        "no duplicate cell"
    )
    status = json.loads(mbx("campaign", "status", "flaky", "--workspace", str(workspace), "--json").stdout)["cells"]
    by_mode = {cell["params"]["fail"]: cell for cell in status}
    attempts = {
        mode: db.execute(
            "SELECT attempt, state, failure_class FROM attempts WHERE cell_id=? ORDER BY attempt",
            (cell["cell_id"],),
        ).fetchall()
        for mode, cell in by_mode.items()
    }

    # fails once with an NCCL watchdog timeout, then its second attempt completes with the full log's figures
    assert attempts["infra-once"] == [(1, "failed", "infra"), (2, "completed", None)]
    once = by_mode["infra-once"]
    assert once["state"] == "completed" and once["attempt"] == 2 and once["summary"]["steps"] == 15

    # always fails at the same step: the retry made no progress, so it stops after 2 of 3 attempts
    assert attempts["infra-always"] == [(1, "failed", "infra"), (2, "failed", "infra")]
    assert "no progress" in by_mode["infra-always"]["reason"]
    assert "Watchdog caught collective operation timeout" in by_mode["infra-always"]["reason"]

    # fails one step later each time: retried up to max_attempts in total
    assert attempts["infra-progress"] == [
        (1, "failed", "infra"),
        (2, "failed", "infra"),
        (3, "failed", "infra"),
    ]
    assert "3 of retry.max_attempts=3 used" in by_mode["infra-progress"]["reason"]
    steps = [
        json.loads(
            (workspace / "flaky" / by_mode["infra-progress"]["cell_id"] / str(n) / "status.json").read_text()
        )["steps_completed"]
        for n in (1, 2, 3)
    ]
    assert steps == [3, 4, 5]

    # a configuration error is not retryable
    assert attempts["config"] == [(1, "failed", "config")]
    assert "unrecognized arguments" in by_mode["config"]["reason"]

    table = mbx("campaign", "status", "flaky", "--workspace", str(workspace))
    assert "failed (infra)" in table.stdout and "failed (config)" in table.stdout


def test_retry_budget_survives_a_killed_orchestrator(mbx, write_campaign, tmp_path):
    """SIGKILL the orchestrator while the 2nd of 3 allowed attempts runs: `resume` adopts it as the 2nd try and
    allows one more, not a fresh budget of three."""
    import os
    import signal
    import subprocess

    path = write_campaign({
        "name": "budget",
        "trainer": {"kind": "command",
                    "command": [sys.executable, str(FAKE), "--replay", str(LOG), "--sleep-s", "0.4"],
                    "params": {"fail_after": 2, "fail": "infra-progress"}},
        "retry": {"max_attempts": 3, "on": ["infra"]},
        "wandb": {"mode": "disabled"},
    })  # fmt: skip
    workspace = tmp_path / "ws"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    orchestrator = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "campaign", "run", str(path), "--workspace", str(workspace),
         "--no-report"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: store_rows(workspace / "mbx.sqlite", "SELECT job_id FROM attempts WHERE attempt=2 AND "
                                    "state='running' AND job_id IS NOT NULL"),
                 "attempt 2 to run", orchestrator)  # fmt: skip
        orchestrator.send_signal(signal.SIGKILL)
        orchestrator.wait(timeout=30)
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()

    resumed = mbx("campaign", "resume", "budget", "--workspace", str(workspace), "--no-report")
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert "adopted running attempt 2" in resumed.stdout
    db = sqlite3.connect(workspace / "mbx.sqlite")
    rows = db.execute("SELECT attempt, state, failure_class, reason FROM attempts ORDER BY attempt").fetchall()
    assert [r[:3] for r in rows] == [(1, "failed", "infra"), (2, "failed", "infra"), (3, "failed", "infra")], rows
    assert "3 of retry.max_attempts=3 used" in rows[-1][3]
