"""Job states on a real Slurm without accounting: scancel, mbx's time limit, Slurm's own TIMEOUT, another rank
failing, vanished jobs — the Slurm base class driven directly (LaunchSpecs built here), and one campaign."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for

from launchers.backends.submitit_slurm import SubmititLauncher, SubmititSettings
from launchers.base import JobState, LaunchSpec, Resources, Submitted
from launchers.profile import SlurmProfile
from launchers.slurm.query import SlurmQuery
from trainer import rundir

pytest_plugins = ["slurm_cluster"]
pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def native_timeout(slurm, tmp_path_factory: pytest.TempPathFactory) -> tuple[SubmititLauncher, Submitted]:
    """A 1-minute job whose command outlives Slurm's limit (mbx sets no limit of its own): Slurm kills it.

    Submitted first in this module so its ~80 s run overlaps the other tests.
    """
    workspace = tmp_path_factory.mktemp("native-timeout")
    profile = SlurmProfile.model_validate(
        {"cluster": {"gpus": False, "python": sys.executable, "sbatch_extra": {"time": 1}}}
    )
    launcher = SubmititLauncher(
        SubmititSettings(poll_interval_s=1, poll_max_interval_s=2), workspace, profile
    )
    run_dir = workspace / "native" / "cell-r0" / "1"
    spec = LaunchSpec(campaign="native", cell_id="cell-r0", attempt=1, run_dir=run_dir,
                      resources=Resources(1, 1, None), module=None, args=["sleep", "600"])  # fmt: skip
    (job,) = launcher.submit([spec])
    return launcher, job


def test_native_timeout_job_starts(native_timeout) -> None:
    launcher, job = native_timeout
    wait_for(
        lambda: launcher.poll([job])[job.job_id] != JobState.PENDING, "the job to leave PENDING", timeout=30
    )
    assert launcher.poll([job])[job.job_id] == JobState.RUNNING

    def sacct_given_up() -> bool:
        assert launcher.poll([job])[job.job_id] == JobState.RUNNING
        return not launcher.query.sacct_enabled

    # submitit's sacct watcher is given up after it answered nothing a few rounds in a row (accounting is off
    # here, squeue answers); how many rounds the job spent pending varies, so poll the running job until then.
    wait_for(
        sacct_given_up,
        "submitit's sacct watcher to be given up (the test cluster has accounting off)",
        timeout=30,
    )


def test_scancel_and_time_limit_campaign_goes_on(slurm, tmp_path: Path, cache_env, write_campaign) -> None:
    """Three points: A is scancel'ed while running, B completes, C hits its 0.25 min limit; the campaign ends."""
    workspace = tmp_path / "ws"
    data = slurm.campaign("qs-states", sweep={"zip": [{
        "training.steps": [100000, 14, 100000],
        "resources.time_limit_min": [None, None, 0.25],
    }]})  # fmt: skip
    file = write_campaign(data)
    env = {**cache_env, **slurm.env}
    with slurm.campaign_in_background(file, workspace, env) as proc:
        victim = _wait_for_running_point(workspace, "qs-states", steps=100000, timeout=120)
        slurm.run("scancel", victim["job_id"])
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    db = sqlite3.connect(workspace / "mbx.sqlite")
    rows = db.execute("SELECT c.params_json, a.state, a.reason, a.job_id FROM attempts a JOIN cells c USING "
                      "(campaign, cell_id) WHERE a.campaign='qs-states'").fetchall()  # fmt: skip
    by_point = {}
    for params, state, reason, job_id in rows:
        p = json.loads(params)
        by_point[(p["training.steps"], p["resources.time_limit_min"])] = (state, reason, job_id)
    cancelled, completed, timed_out = by_point[(100000, None)], by_point[(14, None)], by_point[(100000, 0.25)]
    assert cancelled[0] == "cancelled" and "cancelled in Slurm (scancel" in cancelled[1], cancelled
    assert cancelled[2] == victim["job_id"]
    assert completed[0] == "completed", completed
    assert timed_out[0] == "timeout" and "time limit" in timed_out[1], timed_out
    assert "1/3 completed" in out and "cancelled in Slurm" in out
    assert len({r[2].split("_")[0] for r in (cancelled, completed)}) == 1, "same shape, same array"
    assert timed_out[2].split("_")[0] != cancelled[2].split("_")[0], "another time limit, another array"


def _wait_for_running_point(workspace: Path, campaign: str, steps: int, timeout: float) -> dict:
    """launch.json of the first point with `steps` steps and no time limit whose rank 0 has finished a step."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for launch in (workspace / campaign).glob("*/1/launch.json"):
            try:
                data = json.loads(launch.read_text())
            except json.JSONDecodeError:
                continue
            log = launch.parent / "logs" / "rank-0.log"
            if (data.get("job_id") and f"steps: {steps}" in (launch.parent / "recipe.yaml").read_text()
                    and log.exists() and "step 1/" in log.read_text()
                    and _has_no_time_limit(workspace, data["cell_id"], campaign)):  # fmt: skip
                return data
        time.sleep(0.5)
    raise TimeoutError("no point reached step 1")


def _has_no_time_limit(workspace: Path, cell_id: str, campaign: str) -> bool:
    db = sqlite3.connect(workspace / "mbx.sqlite", timeout=30)
    row = db.execute(
        "SELECT resources_json FROM cells WHERE campaign=? AND cell_id=?", (campaign, cell_id)
    ).fetchone()
    db.close()
    return row is not None and json.loads(row[0]).get("time_limit_min") is None


def test_states_without_accounting(slurm, tmp_path: Path) -> None:
    """Jobs squeue does not know: a finished run dir is final; one with nothing fails after gone_after_s."""
    launcher = SubmititLauncher(SubmititSettings(gone_after_s=1.0), tmp_path)
    launcher.query = SlurmQuery(min_interval_s=0.01, max_interval_s=0.01)
    launcher.settle_s = 0.2
    done, lost = tmp_path / "done", tmp_path / "lost"
    for d in (done, lost):
        d.mkdir()
    rundir.write_status(done, {"state": "completed"}, rundir.TRAINER)
    rundir.write_exit(done, exit_code=0, started_at=0, ended_at=1)
    jobs = [
        Submitted("a", 1, "987654_0", {"run_dir": str(done)}),
        Submitted("b", 1, "987655_3", {"run_dir": str(lost)}),
    ]
    states = launcher.poll(jobs)
    assert states["987654_0"] == JobState.COMPLETED, "the status file answers first, no scheduler needed"
    deadline = time.time() + 10
    while states["987655_3"] != JobState.FAILED and time.time() < deadline:
        time.sleep(0.3)
        states = launcher.poll(jobs)
    assert states["987655_3"] == JobState.FAILED
    status = json.loads((lost / "status.json").read_text())
    assert status["state"] == "failed" and "no longer known" in status["reason"]
    assert status["written_by"] == rundir.SCHEDULER and not rundir.status_problems(status)
    assert not launcher.query.sacct_enabled and not launcher.query.errors


def _command_spec(
    workspace: Path, cell: str, argv: list[str], ranks: int = 1, minutes: float | None = None
) -> LaunchSpec:
    return LaunchSpec(campaign="direct", cell_id=cell, attempt=1, run_dir=workspace / "direct" / cell / "1",
                      resources=Resources(1, ranks, minutes), module=None, args=argv)  # fmt: skip


def test_direct_scancel_limit_rank_failure_and_completion(slurm, tmp_path: Path) -> None:
    """Four attempts submitted, polled and cancelled through the launcher itself: one scancel'ed while running,
    one stopped by mbx's 0.25 min limit, one whose rank 1 fails while rank 0 waits, one that completes."""
    workspace = tmp_path / "ws"
    profile = SlurmProfile.model_validate({"cluster": {"gpus": False, "python": sys.executable}})
    launcher = SubmititLauncher(
        SubmititSettings(poll_interval_s=0.5, poll_max_interval_s=1), workspace, profile
    )
    launcher.settle_s = 1.0
    py = sys.executable
    complete = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); "
                "import os; from trainer import rundir; "
                "rundir.write_status(os.environ['MBX_RUN_DIR'], {'state': 'completed'}, rundir.TRAINER)")  # fmt: skip
    rank_fails = "import os, sys, time; sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(120)"
    specs = [
        _command_spec(workspace, "victim", [py, "-c", "import time; time.sleep(300)"]),
        _command_spec(workspace, "limited", [py, "-c", "import time; time.sleep(300)"], minutes=0.25),
        _command_spec(workspace, "rankfail", [py, "-c", rank_fails], ranks=2),
        _command_spec(workspace, "done", [py, "-c", complete]),
    ]
    jobs = {job.cell_id: job for job in launcher.submit(specs)}
    assert len({j.job_id.split("_")[0] for j in jobs.values()}) == 3, "one array per shape"
    deadline = time.time() + 60
    while (
        launcher.poll([jobs["victim"]])[jobs["victim"].job_id] != JobState.RUNNING and time.time() < deadline
    ):
        time.sleep(0.5)
    launcher.cancel([jobs["victim"]])
    states: dict[str, JobState] = {}
    deadline = time.time() + 150
    while time.time() < deadline:
        states = launcher.poll(list(jobs.values()))
        if all(state.finished for state in states.values()):
            break
        time.sleep(1)
    by_cell = {cell: states[job.job_id] for cell, job in jobs.items()}
    assert by_cell == {"victim": JobState.CANCELLED, "limited": JobState.TIMEOUT, "rankfail": JobState.FAILED,
                       "done": JobState.COMPLETED}, by_cell  # fmt: skip
    status = {spec.cell_id: rundir.read_status(spec.run_dir) for spec in specs}
    assert "cancelled in Slurm (scancel" in status["victim"]["reason"], status["victim"]
    assert status["victim"]["attempt_wrapper"]["state"] == "cancelled"
    assert status["limited"]["state"] == "timeout" and "time limit of 15 s" in status["limited"]["reason"]
    assert "another rank failed and srun stopped the others" in status["rankfail"]["reason"], status[
        "rankfail"
    ]
    assert status["done"]["written_by"] == rundir.TRAINER
    for record in status.values():
        assert not rundir.status_problems(record), record
    assert (specs[2].run_dir / "logs" / "rank-1.log").exists() and (specs[2].run_dir / "node.json").exists()


def test_native_slurm_timeout(native_timeout) -> None:
    """Slurm's TIMEOUT (the wrapper saw only SIGTERM and wrote 'cancelled') is recorded as timeout."""
    launcher, job = native_timeout
    deadline = time.time() + 180
    state = launcher.poll([job])[job.job_id]
    while not state.finished and time.time() < deadline:
        time.sleep(1)
        state = launcher.poll([job])[job.job_id]
    assert state == JobState.TIMEOUT, state
    status = json.loads((Path(job.info["run_dir"]) / "status.json").read_text())
    assert status["state"] == "timeout" and "DUE TO TIME LIMIT" in status["reason"], status
    assert status["slurm_state"] == "TIMEOUT" and status["attempt_wrapper"]["state"] == "cancelled"
    assert status["written_by"] == rundir.SCHEDULER and not rundir.status_problems(status)
