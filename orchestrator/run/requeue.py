"""Requeued Slurm jobs (preemption, `scontrol requeue`, node failure) become new attempts of the same cell.

A requeued job runs again in the same run dir; the node side first moves what the interrupted run left to
`<run dir>/requeued/<n>/` (n = SLURM_RESTART_COUNT − 1). On the login node the engine notices each new
archive while polling: the interrupted run stays the attempt it was, now `preempted` with its run dir pointing
at the archive, and the rerun is recorded as the cell's next attempt (same job id, the live run dir). So a
cell never appears twice, and every run Slurm made of it is an attempt with its own outputs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from orchestrator.run.inflight import InFlight
from orchestrator.run.store import AttemptRow, CellRow, Store
from trainer import rundir


def archived_runs(run_dir: Path) -> list[int]:
    """Restart indices whose interrupted outputs were archived under run_dir/requeued/, in order."""
    root = run_dir / rundir.REQUEUED
    if not root.is_dir():  # one stat per running attempt and poll: the common case costs nothing more
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())


def record_requeues(
    store: Store, campaign: str, in_flight: dict[str, InFlight]
) -> list[tuple[CellRow, AttemptRow, AttemptRow]]:
    """Turn every not yet recorded archive of an in-flight job into (old attempt → preempted, new attempt).

    Updates the in-flight records in place so each job is followed as its newest attempt; returns
    (cell, old, new) per requeue recorded now. `requeues_seen` on each record spares the store query on
    every poll once a job has been requeued.
    """
    recorded = []
    for job_id, flight in in_flight.items():
        live = flight.run_dir
        indices = archived_runs(live)
        if len(indices) == flight.requeues_seen:
            continue
        known = sum(1 for a in store.attempts(campaign, flight.cell.cell_id) if a.job_id == job_id) - 1
        for index in indices[known:]:
            archive = live / rundir.REQUEUED / str(index)
            old = flight.attempt
            new = store.requeue(campaign, flight.cell.cell_id, old.attempt, str(archive),
                                reason=f"requeued by Slurm (restart {index + 1} of job {job_id}): the interrupted "
                                       f"run's outputs are in {rundir.REQUEUED}/{index}/; it goes on as the next "
                                       "attempt")  # fmt: skip
            _relabel_launch(live, new.attempt, old.attempt)
            recorded.append((flight.cell, old, new))
            flight.attempt, flight.job = new, replace(flight.job, attempt=new.attempt)
        flight.requeues_seen = len(indices)
    return recorded


def _relabel_launch(run_dir: Path, attempt: int, previous: int) -> None:
    """launch.json stays in the live run dir: it now describes the rerun."""
    data = rundir.read_launch(run_dir)
    if data is None:
        return
    data["attempt"] = attempt
    data.setdefault("requeue_of", []).append(previous)
    rundir.write_launch(run_dir, data)
