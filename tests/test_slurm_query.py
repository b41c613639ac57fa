"""Scheduler queries and job states without a cluster: one batched sacct, squeue for the rest, backoff, and the
Slurm base class settling status.json through rundir.resolve_state."""

from __future__ import annotations

import subprocess
from pathlib import Path

from launchers.backends.submitit_slurm import SubmititLauncher
from launchers.base import JobState, Submitted
from launchers.node.rank import archive_previous_run
from launchers.slurm.query import SlurmQuery
from trainer import rundir

SACCT = """\
100_0|COMPLETED|0:0
100_1|CANCELLED by 0|0:15
100_[2-4%2]|PENDING|0:0
101|TIMEOUT|0:0
102|FAILED|1:0
"""


class FakeSlurm:
    """Answers sacct/squeue like Slurm 22.05 would, and records every call."""

    def __init__(self, sacct: str | None = SACCT, squeue: str = ""):
        self.sacct, self.squeue = sacct, squeue
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        if argv[0] == "sacct":
            if self.sacct is None:
                return subprocess.CompletedProcess(argv, 1, "", "Slurm accounting storage is disabled\n")
            return subprocess.CompletedProcess(argv, 0, self.sacct, "")
        return subprocess.CompletedProcess(argv, 0, self.squeue, "")


def launcher_with(fake: FakeSlurm, workspace: Path) -> SubmititLauncher:
    launcher = SubmititLauncher(None, workspace)
    launcher.query = SlurmQuery(fake, min_interval_s=0.0)
    launcher.settle_s = 0.0
    return launcher


def test_one_batched_sacct_for_all_jobs() -> None:
    fake = FakeSlurm()
    query = SlurmQuery(fake, min_interval_s=0.0)
    ids = ["100_0", "100_1", "100_3", "101", "102"]
    assert query.refresh(ids)
    assert [c[0] for c in fake.calls] == ["sacct"], "everything answered by one sacct: no squeue"
    assert fake.calls[0][-1] == ",".join(ids)
    states = {k: (v.state, v.reason) for k, v in query.states.items()}
    assert states["100_0"] == ("COMPLETED", "")
    assert states["100_1"] == ("CANCELLED", "by 0 exit 0:15")
    assert states["100_3"] == ("PENDING", "")  # a pending array range, expanded
    assert states["101"][0] == "TIMEOUT" and states["102"] == ("FAILED", "exit 1:0")


def test_accounting_disabled_falls_back_to_squeue_for_good() -> None:
    fake = FakeSlurm(sacct=None, squeue="7_0|RUNNING|None\n7_1|PENDING|Priority\n")
    query = SlurmQuery(fake, min_interval_s=0.0)
    query.refresh(["7_0", "7_1"])
    query.refresh(["7_0", "7_1"])
    assert [c[0] for c in fake.calls] == ["sacct", "squeue", "squeue"], "sacct is not asked again"
    assert query.states["7_1"].reason == "Priority" and not query.errors


def test_failing_sacct_still_forgets_vanished_jobs_and_is_given_up() -> None:
    """sacct erroring on every call (not "accounting disabled"): squeue's answers still decide what is gone,
    and after SACCT_GIVE_UP failures in a row sacct is no longer asked."""
    from launchers.slurm.query import SACCT_GIVE_UP

    calls: list[str] = []

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv[0])
        if argv[0] == "sacct":
            return subprocess.CompletedProcess(argv, 1, "", "sacct: error: slurmdbd not responding\n")
        return subprocess.CompletedProcess(argv, 0, "8|RUNNING|None\n" if len(calls) < 3 else "", "")

    query = SlurmQuery(run, min_interval_s=0.0)
    query.refresh(["8"])
    assert query.states["8"].state == "RUNNING"
    query.refresh(["8"])  # squeue no longer lists it: gone, although sacct failed
    assert "8" not in query.states
    for _ in range(SACCT_GIVE_UP):
        query.refresh(["8"])
    assert calls.count("sacct") == SACCT_GIVE_UP and not query.sacct_enabled
    assert any("asking squeue only" in e for e in query.errors)


def test_interval_backs_off_while_nothing_changes() -> None:
    fake = FakeSlurm(sacct=None, squeue="7_0|RUNNING|None\n")
    query = SlurmQuery(fake, min_interval_s=1.0, max_interval_s=8.0)
    query.refresh(["7_0"])
    assert query.interval_s == 1.0  # a change (first sight): the shortest interval
    assert not query.refresh(["7_0"]), "not due yet: no call"
    for expected in (2.0, 4.0, 8.0, 8.0):
        query.refresh(["7_0"], force=True)
        assert query.interval_s == expected


def test_cancel_is_one_batched_scancel(tmp_path: Path) -> None:
    fake = FakeSlurm()
    launcher = launcher_with(fake, tmp_path)
    launcher.cancel(
        [Submitted("a", 1, "100_1", {}), Submitted("b", 1, "100_0", {}), Submitted("c", 1, "100_1", {})]
    )
    assert fake.calls == [["scancel", "100_0", "100_1"]]


def test_wrapper_fallback_is_corrected_by_slurm(tmp_path: Path) -> None:
    """rank 0's wrapper saw SIGTERM and wrote 'cancelled'; Slurm says TIMEOUT: the run dir says timeout."""
    rundir.write_status(tmp_path, {"state": "cancelled", "reason": "cancelled (signal 15)", "log_tail": "x"},
                        rundir.WRAPPER)  # fmt: skip
    rundir.write_exit(tmp_path, exit_code=-15, started_at=0, ended_at=1, stopped_by_signal=15)
    launcher = launcher_with(FakeSlurm(), tmp_path)
    job = Submitted("c", 1, "101", {"run_dir": str(tmp_path), "time_min": 30})
    assert launcher.poll([job]) == {"101": JobState.TIMEOUT}
    status = rundir.read_status(tmp_path)
    assert status["state"] == "timeout" and "time limit of 30 min" in status["reason"]
    assert status["attempt_wrapper"] == {"state": "cancelled", "reason": "cancelled (signal 15)"}
    assert status["written_by"] == rundir.SCHEDULER and status["slurm_state"] == "TIMEOUT"
    assert status["log_tail"] == "x" and not rundir.status_problems(status)


def test_another_rank_failing_and_a_run_that_left_nothing(tmp_path: Path) -> None:
    """FAILED over rank 0's 'cancelled': another rank failed; CANCELLED with no files: Slurm's word, written."""
    stopped, empty = tmp_path / "stopped", tmp_path / "empty"
    for d in (stopped, empty):
        d.mkdir()
    rundir.write_status(stopped, {"state": "cancelled", "reason": "cancelled (signal 15)"}, rundir.WRAPPER)
    rundir.write_exit(stopped, exit_code=-15, started_at=0, ended_at=1, stopped_by_signal=15)
    (tmp_path / "slurm.err").write_text("srun: error: task 1: Exited with exit code 3\n")
    launcher = launcher_with(FakeSlurm(), tmp_path)
    jobs = [Submitted("a", 1, "102", {"run_dir": str(stopped)}),
            Submitted("b", 1, "100_1", {"run_dir": str(empty), "slurm_error": str(tmp_path / "slurm.err")})]  # fmt: skip
    assert launcher.poll(jobs) == {"102": JobState.FAILED, "100_1": JobState.CANCELLED}
    failed = rundir.read_status(stopped)
    assert "Slurm job 102 FAILED: another rank failed and srun stopped the others" in failed["reason"]
    cancelled = rundir.read_status(empty)
    assert cancelled["state"] == "cancelled" and "cancelled in Slurm (scancel" in cancelled["reason"]
    assert cancelled["job_id"] == "100_1" and "exit code 3" in cancelled["log_tail"]
    assert not rundir.status_problems(failed) and not rundir.status_problems(cancelled)


def test_a_finished_run_dir_needs_no_scheduler(tmp_path: Path) -> None:
    rundir.write_status(tmp_path, {"state": "completed", "reason": None}, rundir.TRAINER)
    rundir.write_exit(tmp_path, exit_code=0, started_at=0, ended_at=1)
    fake = FakeSlurm()
    launcher = launcher_with(fake, tmp_path)
    assert launcher.poll([Submitted("a", 1, "100_0", {"run_dir": str(tmp_path)})]) == {
        "100_0": JobState.COMPLETED
    }
    assert fake.calls == []


def test_requeued_run_archives_the_interrupted_one(tmp_path: Path) -> None:
    for name in ("status.json", "exit.json", "metrics.jsonl"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "logs").mkdir()
    (tmp_path / "recipe.yaml").write_text("x: 1\n")
    archive_previous_run(tmp_path, restart=1)
    assert sorted(p.name for p in (tmp_path / "requeued" / "0").iterdir()) == [
        "exit.json", "logs", "metrics.jsonl", "status.json"]  # fmt: skip
    assert (tmp_path / "recipe.yaml").exists() and not (tmp_path / "status.json").exists()
