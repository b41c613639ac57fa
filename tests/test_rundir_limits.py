"""Run-dir readers refuse damaged or hostile files over their limits quickly, naming the file and the limit."""

from __future__ import annotations

import json
import time
from pathlib import Path

from trainer import rundir


def _sparse(path: Path, size: int, head: bytes = b"") -> None:
    with path.open("wb") as handle:
        handle.write(head)
        handle.truncate(size)  # a sparse file: no disk, no time


def test_oversized_metrics_is_named_not_read(tmp_path: Path) -> None:
    _sparse(tmp_path / rundir.METRICS, rundir.MAX_METRICS_BYTES + 1, b'{"step": 1}\n')
    start = time.monotonic()
    rows, problem = rundir.read_metrics_checked(tmp_path)
    assert rows == []
    assert problem is not None and "metrics.jsonl" in problem and "too large" in problem and "limit" in problem
    assert time.monotonic() - start < 5  # the file is never read into memory


def test_a_step_row_longer_than_the_limit_is_refused(tmp_path: Path) -> None:
    long_row = json.dumps({"step": 2, "junk": "x" * (rundir.MAX_METRICS_LINE_BYTES + 10)})
    (tmp_path / rundir.METRICS).write_text(json.dumps({"step": 1}) + "\n" + long_row + "\n")
    rows, problem = rundir.read_metrics_checked(tmp_path)
    assert rows == [] and problem is not None and ":2: a line longer than" in problem


def test_oversized_status_is_unreadable_with_the_reason(tmp_path: Path) -> None:
    _sparse(tmp_path / rundir.STATUS, rundir.MAX_RECORD_BYTES + 1, b'{"state": "completed"')
    assert rundir.read_status(tmp_path) is None
    problems = rundir.file_problems(tmp_path)
    assert any("status.json" in p and "too large" in p for p in problems), problems


def test_records_within_the_limits_read_as_before(tmp_path: Path) -> None:
    rundir.write_json(tmp_path / rundir.STATUS, {"state": "completed"})
    (tmp_path / rundir.METRICS).write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    assert rundir.read_status(tmp_path) == {"state": "completed"}
    assert rundir.read_metrics_checked(tmp_path) == ([{"step": 1, "loss": 2.0}], None)
    assert rundir.file_problems(tmp_path) == []
