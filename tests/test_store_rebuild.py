"""A lost or damaged run store comes back from the run directories: `mbx store rebuild` after a real
`mbx campaign run`, with every result and attempt number as they were, and the damaged file kept aside."""

from __future__ import annotations

import copy
import json
import shutil
import sqlite3
import sys
from pathlib import Path

from conftest import FAKE_MEGATRON, MEGATRON_LOG, TINY_MOE_RECIPE

from orchestrator.run.store import STORE_FILE

FAKE = FAKE_MEGATRON
LOG = MEGATRON_LOG


def _attempts(workspace: Path) -> list[tuple]:
    db = sqlite3.connect(workspace / STORE_FILE)
    try:
        return db.execute(
            "SELECT a.campaign, a.cell_id, a.attempt, a.state, a.failure_class, a.job_id, r.summary_json, r.verdict, "
            "a.job_info_json "
            "FROM attempts a LEFT JOIN results r USING (campaign, cell_id, attempt) ORDER BY 1, 2, 3"
        ).fetchall()
    finally:
        db.close()


def _status(mbx, workspace: Path, name: str) -> list[dict]:
    result = mbx("campaign", "status", name, "--workspace", str(workspace), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)["cells"]


def test_rebuild_brings_back_results_and_attempt_numbers(mbx, write_campaign, cache_env, tmp_path):
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 4
    bundled = write_campaign(
        {"name": "tiny", "trainer": {"kind": "bundled", "recipe": recipe}, "collect": {"window": 2},
         "wandb": {"mode": "disabled"}},
        "tiny.yaml",
    )  # fmt: skip
    command = write_campaign(
        {"name": "flaky",
         "trainer": {"kind": "command", "params": {"fail_after": 3},
                     "command": [sys.executable, str(FAKE), "--replay", str(LOG), "--sleep-s", "0.01"]},
         "sweep": {"axes": {"fail": ["infra-once", "none"]}},
         "retry": {"max_attempts": 2, "on": ["infra"]},
         "launchers": {"local": {"parallel": 2}},
         "wandb": {"mode": "disabled"}},
        "flaky.yaml",
    )  # fmt: skip
    workspace = tmp_path / "ws"
    for path in (bundled, command):
        run = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report", env=cache_env)
        assert run.returncode == 0, run.stdout + run.stderr
    before = _attempts(workspace)
    assert sorted((c, n, s) for c, _, n, s, *_ in before) == [
        ("flaky", 1, "completed"), ("flaky", 1, "failed"), ("flaky", 2, "completed"), ("tiny", 1, "completed")
    ]  # fmt: skip
    status = {name: _status(mbx, workspace, name) for name in ("tiny", "flaky")}

    # the store is cut in half: every command that reads it says so, names the file and the way out
    store = workspace / STORE_FILE
    data = store.read_bytes()
    store.write_bytes(data[: len(data) // 2])
    broken = mbx("campaign", "status", "flaky", "--workspace", str(workspace))
    assert broken.returncode == 1 and "Traceback" not in broken.stderr
    assert str(store) in broken.stderr and f"mbx store rebuild --workspace {workspace}" in broken.stderr

    rebuilt = mbx("store", "rebuild", "--workspace", str(workspace))
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    aside = list(workspace.glob(f"{STORE_FILE}.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == data[: len(data) // 2], "the damaged file is kept"

    after = _attempts(workspace)
    assert [row[:6] for row in after] == [row[:6] for row in before], "same attempts, numbers, states, jobs"
    for old, new in zip(before, after, strict=True):
        assert json.loads(new[6] or "null") == json.loads(old[6] or "null") and new[7] == old[7], old[:3]
        assert json.loads(new[8]) == json.loads(old[8]), "the launcher's job info (pid, argv) comes back whole"
    assert {name: _status(mbx, workspace, name) for name in ("tiny", "flaky")} == status

    # the rebuilt store drives the campaign on: nothing is run again
    again = mbx("campaign", "run", str(command), "--workspace", str(workspace), "--no-report", env=cache_env)
    assert again.returncode == 0 and "2 skipped" in again.stdout, again.stdout + again.stderr


def test_rebuild_of_a_lost_store(mbx, write_campaign, tmp_path):
    """No mbx.sqlite at all (deleted): the rebuild starts from the campaign.json files alone."""
    path = write_campaign(
        {"name": "replay", "trainer": {"kind": "command", "command": [sys.executable, str(FAKE), "--replay", str(LOG)]},
         "wandb": {"mode": "disabled"}}
    )  # fmt: skip
    workspace = tmp_path / "ws"
    run = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report")
    assert run.returncode == 0, run.stdout + run.stderr
    status = _status(mbx, workspace, "replay")
    (workspace / STORE_FILE).unlink()
    shutil.copytree(workspace / "replay", workspace / "replay.bak")  # a user's copy: not a second source of rows
    rebuilt = mbx("store", "rebuild", "--workspace", str(workspace))
    assert rebuilt.returncode == 0 and "replay: 1 cell(s), 1 attempt(s)" in rebuilt.stdout, rebuilt.stdout
    assert "records campaign 'replay' but lies in replay.bak/ (a copy?), skipped" in rebuilt.stdout + rebuilt.stderr
    assert _status(mbx, workspace, "replay") == status


def test_rebuild_without_campaign_records_is_a_usage_error(mbx, tmp_path):
    result = mbx("store", "rebuild", "--workspace", str(tmp_path / "empty"))
    assert result.returncode == 2 and "campaign.json" in result.stderr and "Traceback" not in result.stderr


def test_rebuild_reads_requeued_running_unsubmitted_and_exit_only_run_dirs(tmp_path):
    """Without the engine: run dirs written by hand as each kind of program leaves them."""
    from orchestrator.run.rebuild import rebuild
    from orchestrator.run.store import MANIFEST, CellRow, Store
    from trainer import rundir

    def cell(cell_id: str, ordinal: int) -> CellRow:
        return CellRow(campaign="syn", cell_id=cell_id, point_id=cell_id[:1], repeat=0, ordinal=ordinal,
                       label=cell_id, params={}, recipe={}, resources={"nodes": 1}, env={})  # fmt: skip

    spec = {
        "name": "syn",
        "trainer": {"kind": "bundled", "recipe": TINY_MOE_RECIPE},
        "collect": {"window": 2},
    }
    with Store(tmp_path) as store:
        store.register_campaign(
            "syn", "syn.yaml", spec, "submitit", [cell(c, i) for i, c in enumerate("abcd")]
        )
    (tmp_path / STORE_FILE).unlink()
    assert (tmp_path / "syn" / MANIFEST).exists()

    def run_dir(cell_id: str, n: int, launch: dict | None = None) -> Path:
        path = tmp_path / "syn" / cell_id / str(n)
        path.mkdir(parents=True)
        if launch is not None:
            rundir.write_launch(path, {"launcher": "submitit", "attempt": n, "written_at": 5.0, **launch})
        return path

    # a: job 77 requeued twice by Slurm (attempts 1 and 2 archived), its third run completed in the live dir
    live = run_dir(
        "a", 1, {"job_id": "77", "attempt": 3, "requeue_of": [1, 2], "try_number": 2, "steps_before": 4}
    )
    for index in (0, 1):
        (live / rundir.REQUEUED / str(index)).mkdir(parents=True)
    rundir.write_metrics(live, [{"step": s, "step_time_ms": 10.0, "loss": 2.0 - s / 10} for s in (1, 2, 3)])
    rundir.write_status(live, {"state": "completed", "reason": None, "steps_completed": 3}, rundir.TRAINER)
    run_dir("b", 1, {"job_id": "88"})  # submitted, nothing written yet: still running as far as anyone knows
    run_dir("c", 1)  # reserved, never submitted
    exited = run_dir("d", 1, {"job_id": "99"})  # the process died before the trainer wrote a status
    rundir.write_exit(exited, exit_code=1, started_at=1.0, ended_at=2.0)

    done = rebuild(tmp_path)
    assert done.campaigns == [("syn", 4, 6)] and done.kept_aside == [] and done.problems == []
    with Store(tmp_path) as store:
        rows = {(a.cell_id, a.attempt): a for a in store.attempts("syn")}
        assert sorted(rows) == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1), ("d", 1)]
        for number, index in ((1, 0), (2, 1)):
            archived = rows[("a", number)]
            assert (archived.state, archived.failure_class) == ("preempted", "preempted")
            assert archived.run_dir == str(live / rundir.REQUEUED / str(index)) and archived.job_id == "77"
        third = rows[("a", 3)]
        assert (third.state, third.run_dir, third.job_id, third.launcher) == (
            "completed",
            str(live),
            "77",
            "submitit",
        )
        assert (third.try_number, third.steps_before) == (2, 4)
        assert store.result("syn", "a", 3).summary["steps"] == 3 and store.result("syn", "a", 1) is None
        assert (rows[("b", 1)].state, rows[("b", 1)].job_id) == ("running", "88")
        assert store.result("syn", "b", 1) is None
        assert (rows[("c", 1)].state, rows[("c", 1)].reason) == ("failed", "never submitted")
        assert rows[("d", 1)].state == "failed" and "exited with code 1" in rows[("d", 1)].reason
        assert store.result("syn", "d", 1).verdict == "fail"
        assert [c.cell_id for c in store.cells("syn")] == list("abcd")
        assert store.campaign("syn")["source_file"] == "syn.yaml"
    assert rundir.read_status(exited)["written_by"] == rundir.WRAPPER, "the resolved state is settled on disk"
