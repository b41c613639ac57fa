"""`mbx store rebuild`: a new run store from the workspace's campaign.json files and run directories.

What a rebuild reads, for every `<workspace>/<campaign>/campaign.json` (written by the store with each
registration, ingested campaigns included): the campaign and its cells; then every run dir
`<campaign>/<cell>/<n>/` of those cells. An attempt keeps its number; its launcher, job id, the launcher's job
info (run dir, log files, a packed point's files: what following and cancelling it needs) and retry budget
come from launch.json, its state from `rundir.resolve_state(status, exit)`, its result from
`collect.collect_attempt` (against the campaign's gates and window, and its baseline, rebuilt first). The runs
of a job requeued by Slurm (`<n>/requeued/<i>/`) come back as the preempted attempts they were. A run dir with
no status or exit file is an attempt still running (if it has a job id) or one never submitted; one whose
facts call for a new status.json (the wrapper's exit record only) gets it through `rundir.settle`, as the
engine's collection would have written it.

The new store is built next to the old one and moved into place at the end; the old file (with its -wal and
-shm) is kept aside as `mbx.sqlite.damaged-<time>` (or `.replaced-<time>` when it was sound), never deleted.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.baseline import baseline_for, baseline_summaries
from orchestrator.campaign import Campaign
from orchestrator.collect import collect_attempt
from orchestrator.errors import UsageError
from orchestrator.lock import CampaignLock
from orchestrator.store import (
    MANIFEST,
    STORE_FILE,
    AttemptRow,
    CellRow,
    ResultRow,
    Store,
    integrity_problem,
    read_manifest,
)
from trainer import rundir

BUILDING = STORE_FILE + ".rebuilding"  # the new store while it is built (removed if a rebuild fails)
SQLITE_SIDECARS = ("", "-wal", "-shm")  # a store is these files together


@dataclass
class Rebuilt:
    """What a rebuild did."""

    store: Path
    kept_aside: list[Path] = field(default_factory=list)
    campaigns: list[tuple[str, int, int]] = field(default_factory=list)  # (name, cells, attempts)
    problems: list[str] = field(default_factory=list)  # campaign.json files that could not be read


@dataclass
class _Source:
    """One campaign as its files describe it."""

    record: dict[str, Any]
    cells: list[CellRow]
    campaign: Campaign | None  # None when the recorded spec no longer validates (attempts kept, no results)


def rebuild(workspace: Path) -> Rebuilt:
    """Rebuild `<workspace>/mbx.sqlite` from the workspace's files; the old store is kept aside."""
    workspace = Path(workspace).expanduser().resolve()
    sources, problems = _read_sources(workspace)
    if not sources:
        found = f" ({'; '.join(problems)})" if problems else ""
        raise UsageError(f"{workspace}: no readable <campaign>/{MANIFEST} to rebuild the store from{found}")
    result = Rebuilt(store=workspace / STORE_FILE, problems=problems)
    with ExitStack() as locks:
        for source in sources:  # no campaign may be running while its rows are rebuilt
            locks.enter_context(CampaignLock(workspace / source.record["name"]))
        _remove_store(workspace / BUILDING)
        try:
            with Store(workspace, file=BUILDING) as store:
                for source in _baselines_first(sources):
                    attempts = _restore(store, workspace, source)
                    result.campaigns.append((source.record["name"], len(source.cells), attempts))
        except BaseException:
            _remove_store(workspace / BUILDING)
            raise
        result.kept_aside = _keep_aside(workspace / STORE_FILE)
        os.replace(workspace / BUILDING, workspace / STORE_FILE)
    return result


def _read_sources(workspace: Path) -> tuple[list[_Source], list[str]]:
    sources, problems = [], []
    for path in sorted(workspace.glob(f"*/{MANIFEST}")):
        manifest = read_manifest(path)
        if manifest is None:
            problems.append(f"{path}: not a campaign record, skipped")
            continue
        record, cells = manifest
        if record.get("name") != path.parent.name:  # a copied directory (foo.bak/): its cells belong to foo's
            problems.append(f"{path}: records campaign {record.get('name')!r} but lies in "
                            f"{path.parent.name}/ (a copy?), skipped")  # fmt: skip
            continue
        try:
            campaign: Campaign | None = Campaign.model_validate(record["spec"])
        except ValueError as err:  # pydantic's ValidationError is a ValueError
            problems.append(
                f"{path}: the spec no longer validates, attempts restored without results ({err})"
            )
            campaign = None
        sources.append(_Source(record, cells, campaign))
    return sources, problems


def _baselines_first(sources: list[_Source]) -> Iterator[_Source]:
    """Campaigns in an order where each one's baseline (when in this workspace) comes before it."""
    waiting = list(sources)
    done: set[str] = set()
    while waiting:
        names = {s.record["name"] for s in waiting}
        ready = [s for s in waiting if not (s.campaign and s.campaign.baseline in names - done)]
        if not ready:  # a baseline cycle: take them as they come
            ready = waiting[:1]
        for source in ready:
            waiting.remove(source)
            done.add(source.record["name"])
            yield source


def _restore(store: Store, workspace: Path, source: _Source) -> int:
    """Put one campaign back (one transaction); returns the number of attempts found."""
    campaign = source.campaign
    baselines = baseline_summaries(store, campaign.baseline) if campaign else {}
    attempts: list[tuple[AttemptRow, ResultRow | None]] = []
    for cell in source.cells:
        cell_dir = workspace / source.record["name"] / cell.cell_id
        numbered = sorted((int(d.name), d) for d in _subdirs(cell_dir) if d.name.isdigit())
        for number, run_dir in numbered:
            attempts.extend(_attempts_of(source, cell, number, run_dir, baselines))
    store.restore_campaign(source.record, source.cells, attempts)
    return len(attempts)


def _subdirs(directory: Path) -> list[Path]:
    return [d for d in directory.iterdir() if d.is_dir()] if directory.is_dir() else []


def _attempts_of(
    source: _Source, cell: CellRow, number: int, run_dir: Path, baselines: dict[str, Any]
) -> list[tuple[AttemptRow, ResultRow | None]]:
    """The attempt(s) one numbered run dir holds: the runs a Slurm requeue archived, then the live one."""
    launch = rundir.read_launch(run_dir) or {}
    earlier = launch.get("requeue_of") or []
    found = []
    for index, previous in enumerate(earlier):
        archive = run_dir / rundir.REQUEUED / str(index)
        reason = f"requeued by Slurm: the interrupted run's outputs are in {rundir.REQUEUED}/{index}/"
        row = _attempt_row(source, cell, int(previous), archive, launch)
        row.state, row.reason, row.failure_class = "preempted", reason, "preempted"
        found.append((row, None))
    live = int(launch["attempt"]) if earlier and isinstance(launch.get("attempt"), int) else number
    row = _attempt_row(source, cell, live, run_dir, launch)
    found.append((row, _judge(source, cell, row, baselines)))
    return found


def _attempt_row(
    source: _Source, cell: CellRow, number: int, run_dir: Path, launch: dict[str, Any]
) -> AttemptRow:
    command, kept = launch.get("command"), launch.get("job_info")
    info = dict(kept) if isinstance(kept, dict) else {"run_dir": str(run_dir)}  # older launch.json: no job_info
    if command:
        info["argv"] = command
    ended = (rundir.read_exit(run_dir) or rundir.read_status(run_dir) or {}).get("ended_at")
    return AttemptRow(
        campaign=cell.campaign, cell_id=cell.cell_id, attempt=number,
        launcher=launch.get("launcher") or source.record["launcher"], run_dir=str(run_dir), state="failed",
        job_id=launch.get("job_id"), job_info=info,
        try_number=int(launch.get("try_number") or 1), steps_before=launch.get("steps_before"),
        submitted_at=launch.get("written_at"), ended_at=ended,
    )  # fmt: skip


def _judge(source: _Source, cell: CellRow, row: AttemptRow, baselines: dict[str, Any]) -> ResultRow | None:
    """Set the attempt's state from its files and collect its result (None while it has not ended)."""
    run_dir = Path(row.run_dir)
    status, exit_info = rundir.read_status(run_dir), rundir.read_exit(run_dir)
    if status is None and exit_info is None:  # nothing says it ended: running if it was submitted
        row.state, row.reason = ("running", None) if row.job_id else ("failed", "never submitted")
        return None
    resolution = rundir.settle(run_dir, rundir.resolve_state(status, exit_info))
    row.state, row.reason, row.failure_class = resolution.state, resolution.reason, resolution.failure_class
    if source.campaign is None:
        return None
    campaign = source.campaign
    collected = collect_attempt(
        run_dir, campaign.gates, campaign.collect.window, baseline_for(baselines, cell)
    )
    row.state, row.reason, row.failure_class = collected.state, collected.reason, collected.failure_class
    summary = collected.summary.to_dict() if collected.summary else None
    gate = collected.gate.to_dict()
    return ResultRow(
        campaign=row.campaign, cell_id=row.cell_id, attempt=row.attempt, summary=summary, gate=gate
    )


def _keep_aside(path: Path) -> list[Path]:
    """Move a store's files out of the way under a dated name; returns where they went."""
    if not path.exists():
        return []
    db = sqlite3.connect(path.as_uri() + "?mode=ro&immutable=1", uri=True)  # a look that writes nothing
    try:
        word = "damaged" if integrity_problem(db) else "replaced"
    finally:
        db.close()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for suffix in SQLITE_SIDECARS:
        old = path.with_name(path.name + suffix)
        if old.exists():
            new = old.with_name(f"{old.name}.{word}-{stamp}")
            os.replace(old, new)
            moved.append(new)
    return moved


def _remove_store(path: Path) -> None:
    for suffix in SQLITE_SIDECARS:
        path.with_name(path.name + suffix).unlink(missing_ok=True)
