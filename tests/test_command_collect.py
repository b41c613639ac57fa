"""Collection of a command attempt from its run dir: rank logs → metrics.jsonl, exit code and launcher status → status.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import MEGATRON_LOG, ROOT

from orchestrator.trainers.kinds.command import finalize_command_attempt
from reports.parsers import parse_log, parse_rank_logs
from reports.parsers.follow import LogFollower

LOG = MEGATRON_LOG
RECIPE = {"kind": "command", "log_format": "auto", "steps": None}


def run_dir(tmp_path: Path, exit_code: int | None, status: dict | None, log: Path | None = LOG) -> Path:
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    if log is not None:
        shutil.copy(log, run / "logs" / "rank-0.log")
    if exit_code is not None:
        (run / "exit.json").write_text(json.dumps({"exit_code": exit_code}))
    if status is not None:
        (run / "status.json").write_text(json.dumps(status))
    return run


WRAPPER_FALLBACK = {
    "state": "failed",
    "reason": "trainer exited 0 without writing status.json",
    "written_by": "launcher",
}


@pytest.mark.parametrize(
    ("exit_code", "status", "hung", "log", "state", "failure_class", "reason"),
    [
        (0, WRAPPER_FALLBACK, False, LOG, "completed", None, None),
        (0, {"state": "failed", "reason": "Slurm job 7 FAILED: rank 3 died", "written_by": "mbx slurm poll"},
         False, LOG, "failed", "unknown", "Slurm job 7 FAILED"),
        (-15, {"state": "timeout", "reason": "time limit of 60 s reached", "written_by": "launcher"},
         False, LOG, "timeout", "timeout", "time limit"),
        (-15, {"state": "cancelled", "reason": "cancelled (signal 15)", "written_by": "launcher"},
         True, LOG, "completed", "hung_after_finish", "did not exit within 5 s"),
        (0, WRAPPER_FALLBACK, False, None, "failed", "unknown", "exited 0 but logged no training iteration"),
        (1, None, False, ROOT / "tests" / "data" / "failures" / "config_argparse" / "rank0.log", "failed", "config",
         "command-line error"),
    ],
)  # fmt: skip
def test_finalize_states(tmp_path, exit_code, status, hung, log, state, failure_class, reason):
    run = run_dir(tmp_path, exit_code, status, log)
    if hung:
        (run / "hung.json").write_text(json.dumps({"grace_s": 5, "last_step": 15, "planned": 15}))
    result = finalize_command_attempt(run, RECIPE, world_size=1)
    assert (result["state"], result["failure_class"]) == (state, failure_class)
    assert reason is None and result["reason"] is None or reason in result["reason"]
    again = finalize_command_attempt(run, RECIPE, world_size=1)  # a second collection (after a resume) agrees
    assert (again["state"], again["failure_class"], again["reason"]) == (
        state,
        failure_class,
        result["reason"],
    )
    assert again["launcher_status"] == status
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == (json.loads(json.dumps(parse_log(log))) if log is not None else [])


def test_follower_reads_growing_logs_like_a_whole_parse(tmp_path):
    """Rank files that grow in odd-sized pieces (lines cut in half) give the rows of a parse of the whole files."""
    logs = tmp_path / "logs"
    logs.mkdir()
    sources = {
        "rank-0.log": LOG.read_bytes(),
        "rank-1.log": (ROOT / "tests" / "data" / "failures" / "oom_cuda" / "rank3.log").read_bytes(),
    }
    follower = LogFollower(logs, "auto")
    offsets = dict.fromkeys(sources, 0)
    piece = 997
    while any(offsets[name] < len(data) for name, data in sources.items()):
        for name, data in sources.items():
            with open(logs / name, "ab") as handle:
                handle.write(data[offsets[name] : offsets[name] + piece])
            offsets[name] += piece
        follower.update()
    rows = follower.finish(world_size=2)
    whole = parse_rank_logs([logs / "rank-0.log", logs / "rank-1.log"])
    assert rows == whole and len(rows) == 15
    assert follower.progress.last_step == max(r["step"] for r in whole)
