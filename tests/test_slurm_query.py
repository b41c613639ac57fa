"""Scheduler queries without a cluster: one batched sacct, squeue for the rest, backoff, status correction."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from launchers import _rank
from launchers.base import JobState, Submitted
from launchers.slurm_common import SlurmQuery, StateResolver

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


def test_interval_backs_off_while_nothing_changes() -> None:
    fake = FakeSlurm(sacct=None, squeue="7_0|RUNNING|None\n")
    query = SlurmQuery(fake, min_interval_s=1.0, max_interval_s=8.0)
    query.refresh(["7_0"])
    assert query.interval_s == 1.0  # a change (first sight): the shortest interval
    assert not query.refresh(["7_0"]), "not due yet: no call"
    for expected in (2.0, 4.0, 8.0, 8.0):
        query.refresh(["7_0"], force=True)
        assert query.interval_s == expected


def test_wrapper_fallback_is_corrected_by_slurm(tmp_path: Path) -> None:
    """rank 0's wrapper saw SIGTERM and wrote 'cancelled'; Slurm says TIMEOUT: the run dir says timeout."""
    (tmp_path / "status.json").write_text(json.dumps({
        "state": "cancelled", "reason": "cancelled (signal 15)", "written_by": "launcher", "log_tail": "x",
    }))  # fmt: skip
    (tmp_path / "exit.json").write_text("{}")
    resolver = StateResolver(SlurmQuery(FakeSlurm(), min_interval_s=0.0))
    job = Submitted("c", 1, "101", {"run_dir": str(tmp_path), "time_min": 30})
    assert resolver.resolve([job]) == {"101": JobState.TIMEOUT}
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "timeout" and "time limit of 30 min" in status["reason"]
    assert status["attempt_wrapper"] == {"state": "cancelled", "reason": "cancelled (signal 15)"}


def test_requeued_run_archives_the_interrupted_one(tmp_path: Path) -> None:
    for name in ("status.json", "exit.json", "metrics.jsonl"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "logs").mkdir()
    (tmp_path / "recipe.yaml").write_text("x: 1\n")
    _rank.archive_previous_run(tmp_path, restart=1)
    assert sorted(p.name for p in (tmp_path / "requeued" / "0").iterdir()) == [
        "exit.json", "logs", "metrics.jsonl", "status.json"]  # fmt: skip
    assert (tmp_path / "recipe.yaml").exists() and not (tmp_path / "status.json").exists()
