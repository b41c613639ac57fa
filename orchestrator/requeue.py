"""Requeued Slurm jobs (preemption, `scontrol requeue`, node failure) become new attempts of the same cell.

A requeued job runs again in the same run dir; launchers/_rank.py first moves what the interrupted run left
to `<run dir>/requeued/<n>/` (n = SLURM_RESTART_COUNT − 1). On the login node the engine notices each new
archive while polling: the interrupted run stays the attempt it was, now `preempted` with its run dir pointing
at the archive, and the rerun is recorded as the cell's next attempt (same job id, the live run dir). So a
cell never appears twice, and every run Slurm made of it is an attempt with its own outputs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from launchers.base import Submitted
from orchestrator.ingest import write_json
from orchestrator.store import AttemptRow, CellRow, Store

ARCHIVE = "requeued"

InFlight = dict[str, tuple[CellRow, AttemptRow, Submitted]]


def archived_runs(run_dir: Path) -> list[int]:
    """Restart indices whose interrupted outputs were archived under run_dir/requeued/, in order."""
    root = run_dir / ARCHIVE
    if not root.is_dir():  # one stat per running attempt and poll: the common case costs nothing more
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())


def record_requeues(store: Store, campaign: str, in_flight: InFlight, seen: dict[str, int]
                    ) -> list[tuple[CellRow, AttemptRow, AttemptRow]]:
    """Turn every not yet recorded archive of an in-flight job into (old attempt → preempted, new attempt).

    Updates `in_flight` in place so the job is followed as its newest attempt; returns (cell, old, new) per
    requeue recorded now. `seen` (job id → archives already recorded, kept by the caller) spares the store
    query on every poll once a job has been requeued.
    """
    recorded = []
    for job_id, (cell, attempt, job) in list(in_flight.items()):
        live = Path(attempt.run_dir)
        indices = archived_runs(live)
        if len(indices) == seen.get(job_id, 0):
            continue
        known = sum(1 for a in store.attempts(campaign, cell.cell_id) if a.job_id == job_id) - 1
        for index in indices[known:]:
            archive = live / ARCHIVE / str(index)
            new = store.requeue(campaign, cell.cell_id, attempt.attempt, str(archive),
                                reason=f"requeued by Slurm (restart {index + 1} of job {job_id}): the interrupted "
                                       f"run's outputs are in {ARCHIVE}/{index}/; it goes on as the next attempt")
            _relabel_launch_json(live, new.attempt, attempt.attempt)
            recorded.append((cell, attempt, new))
            attempt, job = new, replace(job, attempt=new.attempt)
        in_flight[job_id] = (cell, attempt, job)
        seen[job_id] = len(indices)
    return recorded


def _relabel_launch_json(run_dir: Path, attempt: int, previous: int) -> None:
    """launch.json stays in the live run dir: it now describes the rerun."""
    path = run_dir / "launch.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return
    data["attempt"] = attempt
    data.setdefault("requeue_of", []).append(previous)
    write_json(path, data)
