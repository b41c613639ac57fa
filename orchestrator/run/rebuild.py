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
engine's collection would have written it. Run dirs of every run-dir format this mbx knows are read (rundir
brings older records to the current format as it reads them); one a newer mbx wrote stops the rebuild
(`rundir.NewerFormat`, exit 2) before the new store replaces the old one.

A campaign whose campaign.json is damaged or missing is taken from the old store when that one can be read
(campaign row and cells), else rebuilt from its run dirs alone (orchestrator/run/rebuild_rundirs.py, which says what
they cannot tell); either way its campaign.json is written again and the damaged one kept aside. The additive
tables (memory estimates, search trials, parity verdicts) are carried over from the old store when it can be
read; otherwise the rebuild says they are dropped.

The whole rebuild holds the workspace lock (orchestrator/run/lock.py `WorkspaceLock`): it is refused while any
campaign of the workspace runs, and no campaign starts until it ends. The new store is built next to the old one
and moved into place at the end; the old file (with its -wal and -shm) is kept aside as
`mbx.sqlite.damaged-<time>` (or `.replaced-<time>` when it was sound), never deleted.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import MbxError, UsageError, printable
from orchestrator.run.baseline import baseline_for, baseline_summaries
from orchestrator.run.collect import collect_attempt
from orchestrator.run.lock import WorkspaceLock
from orchestrator.run.rebuild_rundirs import campaign_dirs, rebuild_from_run_dirs
from orchestrator.run.store import (
    MANIFEST,
    STORE_FILE,
    AttemptRow,
    CellRow,
    ResultRow,
    Store,
    integrity_problem,
    read_manifest,
)
from orchestrator.spec.campaign import Campaign
from trainer import rundir

BUILDING = STORE_FILE + ".rebuilding"  # the new store while it is built (removed if a rebuild fails)
SQLITE_SIDECARS = ("", "-wal", "-shm")  # a store is these files together


@dataclass
class Rebuilt:
    """What a rebuild did."""

    store: Path
    kept_aside: list[Path] = field(default_factory=list)
    campaigns: list[tuple[str, int, int]] = field(default_factory=list)  # (name, cells, attempts)
    problems: list[str] = field(default_factory=list)  # what could not be read, and what was done instead
    notes: list[str] = field(default_factory=list)  # what was carried over from the old store


@dataclass
class _Source:
    """One campaign as its files describe it."""

    record: dict[str, Any]
    cells: list[CellRow]
    campaign: Campaign | None  # None when the recorded spec no longer validates (attempts kept, no results)
    repair: Path | None = None  # a damaged or missing campaign.json, written again from this source


@dataclass
class _OldStore:
    """What the store being replaced still tells: campaigns and cells, and the additive tables."""

    campaigns: dict[str, tuple[dict[str, Any], list[CellRow]]] = field(default_factory=dict)
    additive: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)  # name → table → rows
    problem: str | None = None  # why it could not be read


def rebuild(workspace: Path) -> Rebuilt:
    """Rebuild `<workspace>/mbx.sqlite` from the workspace's files; the old store is kept aside. Holds the
    workspace lock throughout (refused while a campaign runs)."""
    workspace = Path(workspace).expanduser().resolve()
    if not workspace.is_dir():
        raise UsageError(f"no workspace at {workspace}: no <campaign>/{MANIFEST} or run directories to rebuild "
                         "the store from (check --workspace or MBX_WORKSPACE)")
    with WorkspaceLock(workspace):
        old = _read_old_store(workspace)
        sources, problems = _read_sources(workspace, old)
        if not sources:
            found = f" ({'; '.join(problems)})" if problems else ""
            raise UsageError(f"{workspace}: no readable <campaign>/{MANIFEST} or run directories to rebuild the "
                             f"store from{found}")  # fmt: skip
        result = Rebuilt(store=workspace / STORE_FILE, problems=problems)
        _remove_store(workspace / BUILDING)
        try:
            with Store(workspace, file=BUILDING) as store:
                for source in _baselines_first(sources):
                    attempts = _restore(store, workspace, source)
                    result.campaigns.append((source.record["name"], len(source.cells), attempts))
                    _carry_over(store, source.record["name"], old, result)
                    if source.repair is not None:
                        _repair_manifest(store, source)
        except BaseException:
            _remove_store(workspace / BUILDING)
            raise
        if old.problem:
            result.problems.append(f"{old.problem}: its memory estimates, search trials and parity verdicts are "
                                   "dropped (the next `mbx campaign run` and `mbx report` make them again)")  # fmt: skip
        result.kept_aside = _keep_aside(workspace / STORE_FILE)
        os.replace(workspace / BUILDING, workspace / STORE_FILE)
    return result


def _read_old_store(workspace: Path) -> _OldStore:
    """Campaigns, cells and additive tables of the store being replaced, as far as it can be read."""
    old = _OldStore()
    if not (workspace / STORE_FILE).is_file():
        return old
    try:
        with Store(workspace, create=False) as store:
            for name in store.campaign_names():
                record = store.campaign(name)
                if record is not None:
                    old.campaigns[name] = (record, store.cells(name, active_only=False))
                old.additive[name] = {"estimates": store.estimates(name), "trials": store.trials(name),
                                      "parity": store.parity(name)}  # fmt: skip
    except (MbxError, sqlite3.Error, ValueError) as err:
        old.problem = f"the old run store {workspace / STORE_FILE} cannot be read ({printable(str(err))})"
    return old


def _carry_over(store: Store, name: str, old: _OldStore, result: Rebuilt) -> None:
    """The additive tables of one campaign, as the old store had them."""
    tables = old.additive.get(name)
    if not tables or not any(tables.values()):
        return
    store.record_estimates(name, tables["estimates"], replace=True)
    store.record_trials(name, tables["trials"], replace=True)
    store.record_parity(name, tables["parity"])
    counts = ", ".join(f"{len(rows)} {table}" for table, rows in tables.items() if rows)
    result.notes.append(f"{name}: carried over from the old store: {counts}")


def _repair_manifest(store: Store, source: _Source) -> None:
    """Write a damaged or missing campaign.json again (through the store, its owner); the damaged file kept aside."""
    path = source.repair
    assert path is not None
    if path.exists():
        os.replace(path, path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"))
    record = source.record
    active = [cell for cell in source.cells if cell.active]
    store.register_campaign(record["name"], record.get("source_file"), record["spec"], record["launcher"], active)


def _read_sources(workspace: Path, old: _OldStore) -> tuple[list[_Source], list[str]]:
    sources, problems = [], []
    manifests = {path.parent.name: path for path in sorted(workspace.glob(f"*/{MANIFEST}"))}
    with_runs = {directory.name: directory for directory in campaign_dirs(workspace)}
    for name in sorted(set(manifests) | set(with_runs)):
        path = manifests.get(name, workspace / name / MANIFEST)
        manifest = read_manifest(path) if name in manifests else None
        if manifest is None:
            source = _without_manifest(workspace, name, path, old, problems)
            if source is not None:
                sources.append(source)
            continue
        record, cells = manifest
        if record.get("name") != path.parent.name:  # a copied directory (foo.bak/): its cells belong to foo's
            problems.append(f"{path}: records campaign {record.get('name')!r} but lies in "
                            f"{path.parent.name}/ (a copy?), skipped")  # fmt: skip
            continue
        sources.append(_Source(record, cells, _validated(record, path, problems)))
    return sources, problems


def _without_manifest(
    workspace: Path, name: str, path: Path, old: _OldStore, problems: list[str]
) -> _Source | None:
    """A campaign whose campaign.json is damaged or missing: from the old store, else from its run dirs."""
    what = f"{path}: damaged" if path.exists() else f"{path}: missing"
    if name in old.campaigns:
        record, cells = old.campaigns[name]
        problems.append(f"{what}; the campaign and its {len(cells)} cell(s) are taken from the old run store "
                        f"and {MANIFEST} is written again")  # fmt: skip
        return _Source(record, cells, _validated(record, path, problems), repair=path)
    try:
        record, cells, note = rebuild_from_run_dirs(workspace / name)
    except ValueError as err:
        problems.append(f"{what}, and its run directories do not make a campaign ({printable(str(err))}), skipped")
        return None
    problems.append(f"{what}; {note}")
    return _Source(record, cells, _validated(record, path, problems), repair=path)


def _validated(record: dict[str, Any], path: Path, problems: list[str]) -> Campaign | None:
    try:
        return Campaign.model_validate(record["spec"])
    except ValueError as err:  # pydantic's ValidationError is a ValueError
        problems.append(f"{path}: the spec no longer validates, attempts restored without results ({err})")
        return None


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
