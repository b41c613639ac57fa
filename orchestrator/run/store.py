"""The run store: SQLite (WAL) in the workspace holding campaigns, cells, attempts, states and results.

Every method that writes is one transaction, named by what happened (a campaign registered, an attempt
reserved, submitted, finished, requeued, a past run ingested): a reader never sees half of it, and a SIGKILL
at any moment leaves either the old or the new rows. Use it as `with Store(workspace) as store: ...`; what
must write nothing (a dry run, a plan, a listing) uses `with read_only(workspace) as store: ...` (SQLite
`mode=ro`; None without a store). Attempt numbers come from one rule, `next_attempt_number`.

Tables (schema 3; `_migrate_1_to_2` and `_migrate_2_to_3` upgrade a store written by schema 1 or 2)::

    meta       schema_version
    campaigns  name, source_file, spec_json, launcher, created_at, updated_at
    cells      (campaign, cell_id), point_id, repeat, ordinal, label, params/recipe/resources/env JSON, active,
               trainer_kind (a trainer kind's name, orchestrator/trainers/kinds/, or "ingested")
    attempts   (campaign, cell_id, attempt), launcher, job_id, job_info_json, run_dir, state, reason,
               failure_class, submitted_at, ended_at, try_number (which try of its cell, 1-based),
               steps_before (steps the previous try made); run_dir relative to the workspace (`stored_run_dir`;
               older stores hold absolute paths), read back absolute through `resolve_run_dir` alone
    results    (campaign, cell_id, attempt), summary_json, gate_json, verdict, collected_at
    estimates  (campaign, point_id), ordinal, feasible, detail_json: each point's memory estimate and feasibility
               (additive, no schema bump; orchestrator/run/feasibility.py; `record_estimates` / `estimates`)

The store also owns `<workspace>/<campaign>/campaign.json` (MANIFEST): the campaign row and every cell, written
with each registration so that `mbx store rebuild` (orchestrator/run/rebuild.py) can rebuild a lost or damaged
store from the workspace's files.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import RunError, StoreDamaged, StoreTooNew, UsageError
from orchestrator.rows import AttemptRow, CellRow, ResultRow
from orchestrator.run.disk import DiskFull, is_full, nearly_full
from trainer import rundir

if TYPE_CHECKING:
    from orchestrator.spec.campaign import Campaign
    from orchestrator.spec.sweep import Point

SCHEMA_VERSION = 3  # 3: attempts.run_dir relative to the workspace (stored_run_dir); 2 read it absolute
STORE_FILE = "mbx.sqlite"
MANIFEST = "campaign.json"  # <workspace>/<campaign>/campaign.json: what a rebuild needs besides the run dirs

# Attempt states. Terminal ones never change again.
ACTIVE_STATES = ("submitted", "running")
TERMINAL_STATES = ("completed", "failed", "timeout", "cancelled", "preempted")
INGEST_LAUNCHER = "ingest"  # the launcher name of campaigns made by `mbx ingest`

_CORRUPT_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB (primary result codes)

_TABLES = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE campaigns (
    name TEXT PRIMARY KEY,
    source_file TEXT,
    spec_json TEXT NOT NULL,
    launcher TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE cells (
    campaign TEXT NOT NULL REFERENCES campaigns(name),
    cell_id TEXT NOT NULL,
    point_id TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    ordinal INTEGER NOT NULL,
    label TEXT NOT NULL,
    params_json TEXT NOT NULL,
    recipe_json TEXT NOT NULL,
    resources_json TEXT NOT NULL,
    env_json TEXT NOT NULL,
    active INTEGER NOT NULL DEFAULT 1,
    trainer_kind TEXT NOT NULL DEFAULT 'bundled',
    PRIMARY KEY (campaign, cell_id)
);
CREATE TABLE attempts (
    campaign TEXT NOT NULL,
    cell_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    launcher TEXT NOT NULL,
    job_id TEXT,
    job_info_json TEXT NOT NULL DEFAULT '{}',
    run_dir TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    failure_class TEXT,
    submitted_at REAL,
    ended_at REAL,
    try_number INTEGER NOT NULL DEFAULT 1,
    steps_before INTEGER,
    PRIMARY KEY (campaign, cell_id, attempt),
    FOREIGN KEY (campaign, cell_id) REFERENCES cells(campaign, cell_id)
);
CREATE TABLE results (
    campaign TEXT NOT NULL,
    cell_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    summary_json TEXT,
    gate_json TEXT,
    verdict TEXT,
    collected_at REAL NOT NULL,
    PRIMARY KEY (campaign, cell_id, attempt),
    FOREIGN KEY (campaign, cell_id, attempt) REFERENCES attempts(campaign, cell_id, attempt)
);
"""
# Additive (no schema bump): parity verdicts of on/off pairs, one JSON record per pair, replaced as a whole per
# campaign. Derived data: `mbx report` recomputes them from the run dirs (a rebuilt store starts without them).
_PARITY_TABLE = """
CREATE TABLE IF NOT EXISTS parity (
    campaign TEXT NOT NULL,
    pair_id TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    verdict TEXT NOT NULL,
    detail_json TEXT NOT NULL,
    judged_at REAL NOT NULL,
    PRIMARY KEY (campaign, pair_id)
)
"""
# Additive (no schema bump): the memory estimate and feasibility of every point of a campaign (orchestrator/
# feasibility.py), one JSON record per point, written each time it is run; infeasible points have no cells.
# Derived data: a rebuilt store starts without them (the next run or plan makes them again).
_ESTIMATES_TABLE = """
CREATE TABLE IF NOT EXISTS estimates (
    campaign TEXT NOT NULL,
    point_id TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    feasible INTEGER NOT NULL,
    detail_json TEXT NOT NULL,
    estimated_at REAL NOT NULL,
    PRIMARY KEY (campaign, point_id)
)
"""
# Additive (no schema bump): the trials of a budgeted search (`sweep.search`, orchestrator/flow/search_run.py), one row
# per point and run length (rung), upserted as the search goes; the best point and the Pareto front are flagged.
_TRIALS_TABLE = """
CREATE TABLE IF NOT EXISTS trials (
    campaign TEXT NOT NULL,
    trial INTEGER NOT NULL,
    rung INTEGER NOT NULL,
    state TEXT NOT NULL,
    best INTEGER NOT NULL DEFAULT 0,
    pareto INTEGER NOT NULL DEFAULT 0,
    detail_json TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (campaign, trial, rung)
)
"""


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _loads(text: str | None) -> Any:
    return json.loads(text) if text else None


def _cell_columns(cell: CellRow) -> dict[str, Any]:
    return {
        "campaign": cell.campaign, "cell_id": cell.cell_id, "point_id": cell.point_id, "repeat": cell.repeat,
        "ordinal": cell.ordinal, "label": cell.label, "params_json": json.dumps(cell.params),
        "recipe_json": json.dumps(cell.recipe), "resources_json": json.dumps(cell.resources),
        "env_json": json.dumps(cell.env), "active": int(cell.active), "trainer_kind": cell.trainer_kind,
    }  # fmt: skip


def _attempt_columns(row: AttemptRow, workspace: Path) -> dict[str, Any]:
    values = asdict(row)
    values["job_info_json"] = json.dumps(values.pop("job_info"))
    values["run_dir"] = stored_run_dir(workspace, row.run_dir)
    return values


def stored_run_dir(workspace: Path, run_dir: str | Path) -> str:
    """How the store records a run dir: relative to the workspace when it lies inside it (so the workspace can be
    moved or copied elsewhere), else absolute as given."""
    path = Path(run_dir)
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.relative_to(workspace))
    except ValueError:
        return str(path)


def resolve_run_dir(workspace: Path, stored: str, campaign: str, cell_id: str) -> str:
    """The one reading of a stored run dir, as an absolute path: a relative one against the workspace; an absolute
    one outside the workspace (a store written before run dirs were relative, then moved) as the same tail
    `<campaign>/<cell_id>/<attempt>[/requeued/<n>]` under this workspace when that exists; otherwise the stored
    path itself (so a truly missing run dir is reported by the path the store holds)."""
    path = Path(stored)
    if not path.is_absolute():
        return str(workspace / path)
    if path.is_relative_to(workspace):
        return stored
    parts = path.parts
    starts = [i for i in range(len(parts) - 1) if parts[i] == campaign and parts[i + 1] == cell_id]
    if starts:
        moved = workspace.joinpath(*parts[starts[-1] :])
        if moved.exists():
            return str(moved)
    return stored


def _result_columns(campaign: str, cell_id: str, attempt: int, summary: Any, gate: Any) -> dict[str, Any]:
    return {
        "campaign": campaign, "cell_id": cell_id, "attempt": attempt, "summary_json": _dumps(summary),
        "gate_json": _dumps(gate), "verdict": gate.get("verdict") if gate else None, "collected_at": time.time(),
    }  # fmt: skip


def _insert(
    db: sqlite3.Connection,
    table: str,
    values: dict[str, Any],
    key: tuple[str, ...] = (),
    keep: tuple[str, ...] = (),
) -> None:
    """INSERT a row by column names; on a conflict on `key` (if given) update every column but the key and
    `keep`; without a key a conflict is an error (sqlite3.IntegrityError)."""
    names = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    update = ", ".join(f"{c}=excluded.{c}" for c in values if c not in key and c not in keep)
    conflict = f" ON CONFLICT({', '.join(key)}) DO UPDATE SET {update}" if key and update else ""
    db.execute(f"INSERT INTO {table} ({names}) VALUES ({marks}){conflict}", tuple(values.values()))


def _cell(row: sqlite3.Row) -> CellRow:
    return CellRow(
        campaign=row["campaign"], cell_id=row["cell_id"], point_id=row["point_id"], repeat=row["repeat"],
        ordinal=row["ordinal"], label=row["label"], params=json.loads(row["params_json"]),
        recipe=json.loads(row["recipe_json"]), resources=json.loads(row["resources_json"]),
        env=json.loads(row["env_json"]), trainer_kind=row["trainer_kind"], active=bool(row["active"]),
    )  # fmt: skip


def _attempt(row: sqlite3.Row, workspace: Path) -> AttemptRow:
    run_dir = resolve_run_dir(workspace, row["run_dir"], row["campaign"], row["cell_id"])
    return AttemptRow(
        campaign=row["campaign"], cell_id=row["cell_id"], attempt=row["attempt"], launcher=row["launcher"],
        run_dir=run_dir, state=row["state"], job_id=row["job_id"],
        job_info=json.loads(row["job_info_json"] or "{}"), reason=row["reason"],
        failure_class=row["failure_class"], try_number=row["try_number"], steps_before=row["steps_before"],
        submitted_at=row["submitted_at"], ended_at=row["ended_at"],
    )  # fmt: skip


def _campaign(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "name": row["name"], "source_file": row["source_file"], "spec": json.loads(row["spec_json"]),
        "launcher": row["launcher"], "created_at": row["created_at"], "updated_at": row["updated_at"],
    }  # fmt: skip


def _connect_read_only(path: Path, immutable: bool = False) -> sqlite3.Connection:
    """`path` opened with SQLite's `mode=ro` URI: a write raises, and no file is made when it is missing.
    `immutable`: without the -shm file WAL mode needs (on a full disk, where it cannot be made; only when no -wal
    file holds writes the main file lacks)."""
    from urllib.parse import quote

    flags = "mode=ro&immutable=1" if immutable else "mode=ro"
    db = sqlite3.connect(f"file:{quote(str(path))}?{flags}", uri=True, timeout=30.0, isolation_level=None)
    db.row_factory = sqlite3.Row
    return db


def _wal_files(path: Path) -> list[Path]:
    """The store's -wal and -shm files that exist (WAL mode keeps them while a connection is open)."""
    return [p for p in (Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()]


def _remove_reader_files(path: Path) -> None:
    """The -wal and -shm files a read-only connection made and cannot remove, removed the way SQLite does: by
    closing a connection that may write, which checkpoints and deletes them when no other connection uses them
    (one that does keeps them; a disk with no room, or a store this user cannot write, is left alone)."""
    if not _wal_files(path) or nearly_full(path) or not os.access(path, os.W_OK):
        return
    try:
        db = sqlite3.connect(path, timeout=0.1, isolation_level=None)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            db.close()
    except sqlite3.Error:  # busy or locked by a writer: its close removes them
        pass


def _no_pending_writes(path: Path) -> bool:
    """Whether the main file holds every write: no -wal file, or an empty one (then no -shm file is needed)."""
    wal = Path(f"{path}-wal")
    return not wal.exists() or wal.stat().st_size == 0


def integrity_problem(db: sqlite3.Connection) -> str | None:
    """What SQLite's quick check finds wrong with an open store file (None when it is sound)."""
    try:
        check = [row[0] for row in db.execute("PRAGMA quick_check(3)")]
    except sqlite3.DatabaseError as err:
        if getattr(err, "sqlite_errorcode", 0) & 0xFF in _CORRUPT_CODES:
            return str(err)
        raise
    return None if check == ["ok"] else "; ".join(check)


def manifest_path(workspace: Path, campaign: str) -> Path:
    return Path(workspace) / campaign / MANIFEST


def read_manifest(path: Path) -> tuple[dict[str, Any], list[CellRow]] | None:
    """A campaign.json: (campaign record as `Store.campaign` returns it, its cells), or None if unreadable."""
    data = rundir.read_json(path)
    if data is None or not isinstance(data.get("spec"), dict) or not isinstance(data.get("cells"), list):
        return None
    try:
        cells = [CellRow(**cell) for cell in data.pop("cells")]
    except TypeError:  # not the fields of a cell
        return None
    data.pop("store_schema", None)
    return data, cells


def check_workspace(workspace: Path, create: bool = True, file: str = STORE_FILE) -> Path:
    """The workspace's absolute path, made when `create` and checked: a path of the wrong kind, one that cannot be
    written (when `create`), or (when not `create`) a workspace or store that does not exist → UsageError."""
    path = Path(workspace).expanduser().resolve()  # run dirs are used from other cwds
    if path.exists() and not path.is_dir():
        raise UsageError(f"workspace {path} is a file, not a directory: give --workspace a directory")
    if not path.exists() and not create:
        raise UsageError(f"no workspace at {path}: nothing was run there (check --workspace or MBX_WORKSPACE)")
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=path).close()  # can files be made there (/proc, /sys, read-only mounts)?
        except OSError as err:
            raise UsageError(
                f"workspace {path} cannot be written ({err.strerror or err}): give --workspace a writable directory"
            ) from None
    store = path / file
    if store.is_symlink():  # read or written, the store is never taken through a link (workspace_links)
        from orchestrator.run.workspace_links import link_refused

        raise link_refused(store)
    if store.exists() and not store.is_file():
        raise UsageError(f"{store} is not a file (a directory or a device is in the run store's place): "
                         "move it away, or give --workspace another directory")  # fmt: skip
    if not create and not store.exists():
        hint = f"; `mbx store rebuild --workspace {path}` restores it" if any(path.glob(f"*/{MANIFEST}")) else ""
        raise UsageError(f"no run store in workspace {path} (no {file}){hint}")
    return path


def next_attempt_number(known: int, cell_dir: Path) -> int:
    """The one rule numbering attempts: above `known` (the highest attempt the store holds for the cell) and
    above every run dir on disk in `cell_dir`, so an attempt never writes into an earlier one's files (even
    after the store was lost and started afresh). The dry run (engine.plan), the real submission
    (`Store.reserve_attempt`) and `mbx ingest` all number through it, so they agree."""
    on_disk = [int(p.name) for p in cell_dir.iterdir() if p.name.isdigit()] if cell_dir.is_dir() else []
    return max([int(known), *on_disk]) + 1


@contextmanager
def read_only(workspace: Path, file: str = STORE_FILE) -> Iterator[Store | None]:
    """The workspace's store opened read-only (SQLite `mode=ro`): nothing is created, migrated or written; None
    when there is no store file (nor workspace). A store of an older schema is read through a migrated copy in
    memory. For dry runs and plans: they must leave the workspace as they found it."""
    path = Path(workspace).expanduser().resolve()
    if not (path / file).is_file():
        yield None
        return
    store = Store(path, file, create=False, read_only=True)
    try:
        yield store
    finally:
        store.close()


class Store:
    """One SQLite file per workspace; every write is one short transaction (safe to SIGKILL anytime).

    `create=False` (the commands that only read or continue): a workspace or store that does not exist is an
    error instead of being made. `read_only` (use `read_only(workspace)`): opened with SQLite's `mode=ro`, no
    table made and no migration written; any write raises.
    """

    def __init__(self, workspace: Path, file: str = STORE_FILE, create: bool = True, read_only: bool = False):
        self.workspace = check_workspace(workspace, create and not read_only, file)
        self.path = self.workspace / file
        self.read_only = read_only
        self.full_disk = False  # opened read-only because its disk is full: derived data is not stored again
        self._reader_files = read_only and not _wal_files(self.path)  # the -wal/-shm a reader makes, removed at close
        try:
            self._connect()
        except (sqlite3.OperationalError, OSError) as err:
            if not is_full(err, self.path):
                raise RunError(f"{self.path}: cannot open the run store ({err})") from None
            if create or read_only:
                raise DiskFull(self.path, f"mbx could not open the run store{'' if read_only else ' to write it'}"
                               ) from None  # fmt: skip
            self.read_only = self.full_disk = True  # a command that only reads works on a full disk
            try:
                self._connect()
            except (sqlite3.OperationalError, OSError):
                raise DiskFull(self.path, "mbx could not open the run store, even to read it") from None

    def _connect(self) -> None:
        """Open and check the file (read-only, or read-write with the schema brought up to date)."""
        try:
            self._db = _connect_read_only(self.path) if self.read_only else sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None)  # fmt: skip
        except sqlite3.Error as err:
            raise RunError(f"{self.path}: cannot open the run store ({err})") from None
        self._db.row_factory = sqlite3.Row
        try:
            with self._guard():
                self._open()
        except sqlite3.OperationalError as err:
            self._db.close()
            if self.read_only and is_full(err, self.path) and _no_pending_writes(self.path):
                self._db = _connect_read_only(self.path, immutable=True)  # no -shm can be made, none is needed
                self._db.row_factory = sqlite3.Row
                self._open_read_only()
                return
            raise
        except BaseException:
            self._db.close()
            raise

    def _open(self) -> None:
        if self.read_only:
            self._open_read_only()
            return
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        problem = integrity_problem(self._db)
        if problem:
            raise StoreDamaged(self.path, problem)
        with self._transaction() as db:
            version = self._schema_version(db)
            self._check_version(version)
            _bring_up_to_date(db, version)
        if version == 1:
            for name in self.campaign_names():
                self._write_manifest(self._db, name)

    def _open_read_only(self) -> None:
        """Check a store opened `mode=ro`; one of an older schema (or without an additive table) is copied into
        memory and brought up to date there, so every reader sees the current schema while the file stays as it was."""
        problem = integrity_problem(self._db)
        if problem:
            raise StoreDamaged(self.path, problem)
        version = self._schema_version(self._db)
        self._check_version(version)
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if version == SCHEMA_VERSION and {"parity", "estimates", "trials"} <= tables:
            return
        memory = sqlite3.connect(":memory:", isolation_level=None)
        memory.row_factory = sqlite3.Row
        self._db.backup(memory)
        self._db.close()
        self._db = db = memory
        with self._guard():
            db.execute("BEGIN")
            _bring_up_to_date(db, version)
            db.execute("COMMIT")

    def _check_version(self, version: int | None) -> None:
        if version is not None and version > SCHEMA_VERSION:
            raise StoreTooNew(f"{self.path} was written by a newer mbx (schema {version} > {SCHEMA_VERSION}); "
                              "upgrade mbx")  # fmt: skip

    @staticmethod
    def _schema_version(db: sqlite3.Connection) -> int | None:
        if db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone() is None:
            return None
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row["value"]) if row else 1

    def close(self) -> None:
        self._db.close()
        if self._reader_files and not self.full_disk:
            _remove_reader_files(self.path)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """A damaged file found by any query becomes StoreDamaged (naming the file and the rebuild command)."""
        try:
            yield
        except sqlite3.DatabaseError as err:
            if getattr(err, "sqlite_errorcode", 0) & 0xFF in _CORRUPT_CODES:
                raise StoreDamaged(self.path, str(err)) from err
            raise

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        if self.full_disk:
            raise DiskFull(self.path, "mbx could not write the run store")
        if self.read_only:
            raise RuntimeError(f"{self.path} is open read-only: a dry run or a plan writes nothing")
        with self._guard():
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except (sqlite3.OperationalError, OSError) as err:
                if is_full(err, self.path):
                    raise DiskFull(self.path, "mbx could not write the run store (nothing of this write was "
                                   "kept)") from err  # fmt: skip
                raise

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._guard():
            return self._db.execute(sql, params).fetchall()

    # campaigns -----------------------------------------------------------------------------------------
    def register_campaign(
        self, name: str, source_file: str | None, spec: dict[str, Any], launcher: str, cells: list[CellRow]
    ) -> None:
        """The campaign row and exactly these cells active (in this order; cells no longer in it stay,
        inactive), and its campaign.json, in one transaction."""
        now = time.time()
        with self._transaction() as db:
            _insert(db, "campaigns", {"name": name, "source_file": source_file, "spec_json": json.dumps(spec),
                                      "launcher": launcher, "created_at": now, "updated_at": now},
                    key=("name",), keep=("created_at",))  # fmt: skip
            db.execute("UPDATE cells SET active=0 WHERE campaign=?", (name,))
            for cell in cells:
                _insert(db, "cells", {**_cell_columns(cell), "campaign": name, "active": 1},
                        key=("campaign", "cell_id"))  # fmt: skip
            self._write_manifest(db, name)

    def _write_manifest(self, db: sqlite3.Connection, name: str) -> None:
        """<workspace>/<name>/campaign.json: the campaign row and all its cells (written inside the transaction
        that changed them: a failed write rolls the rows back)."""
        row = db.execute("SELECT * FROM campaigns WHERE name=?", (name,)).fetchone()
        cells = db.execute("SELECT * FROM cells WHERE campaign=? ORDER BY ordinal", (name,)).fetchall()
        path = manifest_path(self.workspace, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        rundir.write_json(path, {"store_schema": SCHEMA_VERSION, **_campaign(row),
                                 "cells": [asdict(_cell(c)) for c in cells]})  # fmt: skip

    def campaign(self, name: str) -> dict[str, Any] | None:
        """name, source_file, spec, launcher, created_at, updated_at of a campaign, or None."""
        rows = self._rows("SELECT * FROM campaigns WHERE name=?", (name,))
        return _campaign(rows[0]) if rows else None

    def campaign_names(self) -> list[str]:
        return [r["name"] for r in self._rows("SELECT name FROM campaigns ORDER BY updated_at DESC")]

    # cells ---------------------------------------------------------------------------------------------
    def cells(self, campaign: str, active_only: bool = True) -> list[CellRow]:
        query = (
            "SELECT * FROM cells WHERE campaign=?"
            + (" AND active=1" if active_only else "")
            + " ORDER BY ordinal"
        )
        return [_cell(r) for r in self._rows(query, (campaign,))]

    def deactivate_point(self, campaign: str, point_id: str) -> list[str]:
        """Take a point's cells out of the campaign's active set (a point found infeasible on its allocation's
        GPU: like a point infeasible at plan time, it has no active cells); returns all its cell ids."""
        with self._transaction() as db:
            db.execute("UPDATE cells SET active=0 WHERE campaign=? AND point_id=?", (campaign, point_id))
            rows = db.execute("SELECT cell_id FROM cells WHERE campaign=? AND point_id=? ORDER BY ordinal",
                              (campaign, point_id)).fetchall()  # fmt: skip
            self._write_manifest(db, campaign)
        return [r["cell_id"] for r in rows]

    # attempts ------------------------------------------------------------------------------------------
    def reserve_attempt(
        self,
        campaign: str,
        cell_id: str,
        launcher: str,
        run_dir_of: Callable[[int], Path],
        try_number: int = 1,
        steps_before: int | None = None,
    ) -> AttemptRow:
        """The cell's next attempt (state 'submitted', no job yet) and its new, empty run dir.

        Numbered by `next_attempt_number` (the store's highest attempt for the cell, the run dirs on disk beside
        `run_dir_of(n)`, which is `<cell dir>/<n>`), inside the transaction that records it.
        """
        with self._transaction() as db:
            known = db.execute(
                "SELECT COALESCE(MAX(attempt), 0) AS n FROM attempts WHERE campaign=? AND cell_id=?",
                (campaign, cell_id),
            ).fetchone()["n"]
            number = next_attempt_number(known, Path(run_dir_of(int(known) + 1)).parent)
            run_dir = Path(run_dir_of(number))
            row = AttemptRow(campaign=campaign, cell_id=cell_id, attempt=number, launcher=launcher,
                             run_dir=str(run_dir), state="submitted", try_number=try_number,
                             steps_before=steps_before, submitted_at=time.time())  # fmt: skip
            _insert(db, "attempts", _attempt_columns(row, self.workspace))
        run_dir.mkdir(parents=True)  # after the commit: a dir that cannot be made leaves a row to mark failed
        return row

    def mark_submitted(
        self, campaign: str, cell_id: str, attempt: int, job_id: str, job_info: dict[str, Any]
    ) -> None:
        """The launcher accepted the attempt: its job id and info, state 'running'."""
        with self._transaction() as db:
            db.execute(
                "UPDATE attempts SET job_id=?, job_info_json=?, state='running' "
                "WHERE campaign=? AND cell_id=? AND attempt=?",
                (job_id, json.dumps(job_info), campaign, cell_id, attempt),
            )

    def record_outcome(
        self,
        campaign: str,
        cell_id: str,
        attempt: int,
        state: str,
        reason: str | None,
        failure_class: str | None,
        summary: dict[str, Any] | None,
        gate: dict[str, Any] | None,
    ) -> None:
        """A collected attempt: its final state and its result row, together."""
        with self._transaction() as db:
            self._set_state(db, campaign, cell_id, attempt, state, reason, failure_class)
            _insert(db, "results", _result_columns(campaign, cell_id, attempt, summary, gate),
                    key=("campaign", "cell_id", "attempt"))  # fmt: skip

    def set_state(
        self,
        campaign: str,
        cell_id: str,
        attempt: int,
        state: str,
        reason: str | None = None,
        failure_class: str | None = None,
    ) -> None:
        """Retire or relabel an attempt without a result (never submitted, refused, cancelled, retry stopped)."""
        with self._transaction() as db:
            self._set_state(db, campaign, cell_id, attempt, state, reason, failure_class)

    @staticmethod
    def _set_state(db: sqlite3.Connection, campaign: str, cell_id: str, attempt: int, state: str,
                   reason: str | None, failure_class: str | None) -> None:  # fmt: skip
        ended = time.time() if state in TERMINAL_STATES else None
        db.execute(
            "UPDATE attempts SET state=?, reason=?, failure_class=?, ended_at=COALESCE(?, ended_at) "
            "WHERE campaign=? AND cell_id=? AND attempt=?",
            (state, reason, failure_class, ended, campaign, cell_id, attempt),
        )

    def requeue(self, campaign: str, cell_id: str, attempt: int, archive_dir: str, reason: str) -> AttemptRow:
        """A requeued job: `attempt` ends as preempted with its outputs in `archive_dir`; the rerun (same job,
        same live run dir, same try) becomes the cell's next attempt, running."""
        with self._transaction() as db:
            old = _attempt(db.execute(
                "SELECT * FROM attempts WHERE campaign=? AND cell_id=? AND attempt=?", (campaign, cell_id, attempt)
            ).fetchone(), self.workspace)  # fmt: skip
            number = int(db.execute(
                "SELECT MAX(attempt) AS n FROM attempts WHERE campaign=? AND cell_id=?", (campaign, cell_id)
            ).fetchone()["n"]) + 1  # fmt: skip
            now = time.time()
            db.execute(
                "UPDATE attempts SET run_dir=?, state='preempted', reason=?, failure_class='preempted', ended_at=? "
                "WHERE campaign=? AND cell_id=? AND attempt=?",
                (stored_run_dir(self.workspace, archive_dir), reason, now, campaign, cell_id, attempt),
            )
            new = AttemptRow(campaign=campaign, cell_id=cell_id, attempt=number, launcher=old.launcher,
                             run_dir=old.run_dir, state="running", job_id=old.job_id, job_info=old.job_info,
                             try_number=old.try_number, steps_before=old.steps_before, submitted_at=now)  # fmt: skip
            _insert(db, "attempts", _attempt_columns(new, self.workspace))
        return new

    def attempt(self, campaign: str, cell_id: str, attempt: int) -> AttemptRow | None:
        rows = self._rows(
            "SELECT * FROM attempts WHERE campaign=? AND cell_id=? AND attempt=?",
            (campaign, cell_id, attempt),
        )
        return _attempt(rows[0], self.workspace) if rows else None

    def attempts(self, campaign: str, cell_id: str | None = None) -> list[AttemptRow]:
        """A campaign's attempts (or one cell's), by cell and attempt number."""
        if cell_id is None:
            rows = self._rows(
                "SELECT * FROM attempts WHERE campaign=? ORDER BY cell_id, attempt", (campaign,)
            )
        else:
            rows = self._rows(
                "SELECT * FROM attempts WHERE campaign=? AND cell_id=? ORDER BY attempt", (campaign, cell_id)
            )
        return [_attempt(r, self.workspace) for r in rows]

    def highest_attempt(self, campaign: str, cell_id: str) -> int:
        """The highest attempt number the store holds for a cell (0: none)."""
        rows = self._rows("SELECT COALESCE(MAX(attempt), 0) AS n FROM attempts WHERE campaign=? AND cell_id=?",
                          (campaign, cell_id))  # fmt: skip
        return int(rows[0]["n"])

    def latest_attempts(self, campaign: str) -> dict[str, AttemptRow]:
        """Each cell's attempt with the highest number."""
        latest: dict[str, AttemptRow] = {}
        for attempt in self.attempts(campaign):
            latest[attempt.cell_id] = attempt  # ordered by attempt number
        return latest

    # results -------------------------------------------------------------------------------------------
    def result(self, campaign: str, cell_id: str, attempt: int) -> ResultRow | None:
        rows = self._rows(
            "SELECT * FROM results WHERE campaign=? AND cell_id=? AND attempt=?", (campaign, cell_id, attempt)
        )
        if not rows:
            return None
        row = rows[0]
        return ResultRow(campaign=row["campaign"], cell_id=row["cell_id"], attempt=row["attempt"],
                         summary=_loads(row["summary_json"]), gate=_loads(row["gate_json"]),
                         verdict=row["verdict"])  # fmt: skip

    def update_verdicts(
        self, campaign: str, gates: dict[tuple[str, int], dict[str, Any]], spec: dict[str, Any] | None = None
    ) -> None:
        """Re-judged results (`mbx campaign regate`): each (cell id, attempt)'s gate result and verdict, and
        the campaign's spec when its gates changed (with campaign.json), in one transaction. On a store opened
        read-only for a full disk, verdicts alone are not stored again (they are derived; readers re-derive them)."""
        if self.full_disk and spec is None:
            return
        with self._transaction() as db:
            for (cell_id, attempt), gate in gates.items():
                db.execute(
                    "UPDATE results SET gate_json=?, verdict=? WHERE campaign=? AND cell_id=? AND attempt=?",
                    (json.dumps(gate), gate.get("verdict"), campaign, cell_id, attempt),
                )
            if spec is not None:
                db.execute("UPDATE campaigns SET spec_json=?, updated_at=? WHERE name=?",
                           (json.dumps(spec), time.time(), campaign))  # fmt: skip
                self._write_manifest(db, campaign)

    # parity verdicts (additive table) ------------------------------------------------------------------
    def record_parity(self, campaign: str, verdicts: list[dict[str, Any]]) -> None:
        """A campaign's parity pair verdicts (each a dict with `pair_id` and `verdict`), replacing the stored
        ones, in one transaction (not on a store opened read-only for a full disk: `mbx report` derives them again)."""
        if self.full_disk:
            return
        now = time.time()
        with self._transaction() as db:
            db.execute("DELETE FROM parity WHERE campaign=?", (campaign,))
            for ordinal, verdict in enumerate(verdicts):
                db.execute("INSERT INTO parity VALUES (?, ?, ?, ?, ?, ?)",
                           (campaign, verdict["pair_id"], ordinal, verdict["verdict"], json.dumps(verdict), now))  # fmt: skip

    def parity(self, campaign: str) -> list[dict[str, Any]]:
        """The stored parity pair verdicts of a campaign, in their order."""
        rows = self._rows("SELECT detail_json FROM parity WHERE campaign=? ORDER BY ordinal", (campaign,))
        return [json.loads(r["detail_json"]) for r in rows]

    # memory estimates and feasibility (additive table) -------------------------------------------------
    def record_estimates(self, campaign: str, rows: list[dict[str, Any]], replace: bool = False) -> None:
        """Per-point estimates of a campaign (dicts with point_id, label, params, estimate_gib, gpu, gpu_gib,
        feasible, reason, ...; orchestrator/run/feasibility.py) in one transaction: each point's row replaces its
        earlier one, other points' rows stay (a search records its points rung by rung); `replace` drops them."""
        now = time.time()
        with self._transaction() as db:
            if replace:
                db.execute("DELETE FROM estimates WHERE campaign=?", (campaign,))
            known = {r[0]: r[1] for r in db.execute("SELECT point_id, ordinal FROM estimates WHERE campaign=?",
                                                    (campaign,))}  # fmt: skip
            start = max(known.values(), default=-1) + 1
            for index, row in enumerate(rows):
                ordinal = known.get(row["point_id"], start + index)
                db.execute("INSERT OR REPLACE INTO estimates VALUES (?, ?, ?, ?, ?, ?)",
                           (campaign, row["point_id"], ordinal, int(bool(row["feasible"])), json.dumps(row), now))  # fmt: skip

    def estimates(self, campaign: str) -> list[dict[str, Any]]:
        """The stored per-point estimates of a campaign, in point order (empty: none recorded)."""
        sql = "SELECT detail_json, feasible FROM estimates WHERE campaign=? ORDER BY ordinal"
        rows = self._rows(sql, (campaign,))
        return [{**json.loads(r["detail_json"]), "feasible": bool(r["feasible"])} for r in rows]

    # search trials (additive table) --------------------------------------------------------------------
    def record_trials(self, campaign: str, rows: list[dict[str, Any]], replace: bool = False) -> None:
        """Trials of a budgeted search (dicts with at least trial, rung, state; `best` and `pareto` flags
        optional; orchestrator/flow/search_run.py), upserted by (trial, rung), in one transaction; `replace` first
        deletes the campaign's stored trials."""
        now = time.time()
        with self._transaction() as db:
            if replace:
                db.execute("DELETE FROM trials WHERE campaign=?", (campaign,))
            for row in rows:
                db.execute("INSERT OR REPLACE INTO trials VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           (campaign, int(row["trial"]), int(row["rung"]), row["state"], int(bool(row.get("best"))),
                            int(bool(row.get("pareto"))), json.dumps(row), now))  # fmt: skip

    def trials(self, campaign: str) -> list[dict[str, Any]]:
        """The stored trials of a campaign's search, by trial and rung (empty: not a search)."""
        sql = "SELECT detail_json, state, best, pareto FROM trials WHERE campaign=? ORDER BY trial, rung"
        return [{**json.loads(r["detail_json"]), "state": r["state"], "best": bool(r["best"]),
                 "pareto": bool(r["pareto"])} for r in self._rows(sql, (campaign,))]  # fmt: skip

    # ingested runs and rebuilds ------------------------------------------------------------------------
    def record_ingested(
        self,
        spec: dict[str, Any],
        cell: CellRow,
        attempt: int,
        run_dir: str,
        state: str,
        reason: str | None,
        failure_class: str | None,
        summary: dict[str, Any] | None,
        gate: dict[str, Any] | None,
    ) -> None:
        """One ingested run (`mbx ingest`): campaign, cell, finished attempt, result and campaign.json, in one
        transaction. An existing cell keeps its place (ordinal)."""
        now = time.time()
        row = AttemptRow(campaign=cell.campaign, cell_id=cell.cell_id, attempt=attempt, launcher=INGEST_LAUNCHER,
                         run_dir=run_dir, state=state, reason=reason, failure_class=failure_class,
                         submitted_at=now, ended_at=now)  # fmt: skip
        with self._transaction() as db:
            _insert(db, "campaigns", {"name": cell.campaign, "source_file": None, "spec_json": json.dumps(spec),
                                      "launcher": INGEST_LAUNCHER, "created_at": now, "updated_at": now},
                    key=("name",), keep=("created_at", "source_file", "launcher"))  # fmt: skip
            _insert(
                db,
                "cells",
                {**_cell_columns(cell), "active": 1},
                key=("campaign", "cell_id"),
                keep=("ordinal",),
            )
            _insert(db, "attempts", _attempt_columns(row, self.workspace))
            _insert(db, "results", _result_columns(cell.campaign, cell.cell_id, attempt, summary, gate))
            self._write_manifest(db, cell.campaign)

    def restore_campaign(
        self,
        record: dict[str, Any],
        cells: list[CellRow],
        attempts: list[tuple[AttemptRow, ResultRow | None]],
    ) -> None:
        """Put back a campaign as read from its campaign.json and run dirs (`mbx store rebuild`), in one
        transaction: rows are written as given (attempt numbers, times and all)."""
        with self._transaction() as db:
            _insert(db, "campaigns", {"name": record["name"], "source_file": record.get("source_file"),
                                      "spec_json": json.dumps(record["spec"]), "launcher": record["launcher"],
                                      "created_at": record["created_at"], "updated_at": record["updated_at"]},
                    key=("name",))  # fmt: skip
            for cell in cells:
                _insert(db, "cells", _cell_columns(cell), key=("campaign", "cell_id"))
            for attempt, result in attempts:
                columns = _attempt_columns(attempt, self.workspace)
                _insert(db, "attempts", columns, key=("campaign", "cell_id", "attempt"))
                if result is not None:
                    _insert(db, "results", _result_columns(attempt.campaign, attempt.cell_id, attempt.attempt,
                                                           result.summary, result.gate),
                            key=("campaign", "cell_id", "attempt"))  # fmt: skip


RETRY_KEY_V1 = "mbx_retry"  # schema 1 kept the retry budget in an attempt's job info under this key


def _bring_up_to_date(db: sqlite3.Connection, version: int | None) -> None:
    """Inside the caller's transaction: the tables made (no store yet) or migrated (schema 1), and the additive
    tables made when missing."""
    if version is None:
        for statement in _TABLES.split(";"):  # (executescript would COMMIT first)
            if statement.strip():
                db.execute(statement)
        db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    if version == 1:
        _migrate_1_to_2(db)
    if version in (1, 2):
        _migrate_2_to_3(db)
    db.execute(_PARITY_TABLE)
    db.execute(_ESTIMATES_TABLE)
    db.execute(_TRIALS_TABLE)


# The trainer kinds a schema-1 store can name: its history, not today's kinds.
_SCHEMA1_KINDS = ("bundled", "command", "ingested")


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    """Schema 1 → 2 (inside the caller's transaction): the trainer kind out of recipe_json's "kind" into
    cells.trainer_kind, the retry budget out of job_info_json's "mbx_retry" into attempts.try_number and
    attempts.steps_before. Every row is kept; the recipe keeps its content."""
    db.execute("ALTER TABLE cells ADD COLUMN trainer_kind TEXT NOT NULL DEFAULT 'bundled'")
    db.execute("ALTER TABLE attempts ADD COLUMN try_number INTEGER NOT NULL DEFAULT 1")
    db.execute("ALTER TABLE attempts ADD COLUMN steps_before INTEGER")
    for row in db.execute("SELECT campaign, cell_id, recipe_json FROM cells").fetchall():
        kind = (_loads(row["recipe_json"]) or {}).get("kind")
        if kind in _SCHEMA1_KINDS:
            db.execute("UPDATE cells SET trainer_kind=? WHERE campaign=? AND cell_id=?",
                       (kind, row["campaign"], row["cell_id"]))  # fmt: skip
    for row in db.execute("SELECT campaign, cell_id, attempt, job_info_json FROM attempts").fetchall():
        info = _loads(row["job_info_json"]) or {}
        retry = info.pop(RETRY_KEY_V1, None)
        if not isinstance(retry, dict):
            continue
        db.execute(
            "UPDATE attempts SET try_number=?, steps_before=?, job_info_json=? "
            "WHERE campaign=? AND cell_id=? AND attempt=?",
            (int(retry.get("try") or 1), retry.get("steps_before"), json.dumps(info), row["campaign"],
             row["cell_id"], row["attempt"]),
        )  # fmt: skip
    db.execute("UPDATE meta SET value='2' WHERE key='schema_version'")


def _migrate_2_to_3(db: sqlite3.Connection) -> None:
    """Schema 2 → 3: attempts.run_dir may now be relative to the workspace (`stored_run_dir`). Rows stay as
    written (`resolve_run_dir` reads absolute ones too); the version says it, so an mbx of schema 2 refuses the
    store ("written by a newer mbx") instead of reading relative run dirs against its working directory."""
    db.execute("UPDATE meta SET value='3' WHERE key='schema_version'")


def cell_rows(campaign: Campaign, points: list[Point]) -> list[CellRow]:
    """The store rows of a campaign's expanded points, in order."""
    return [
        CellRow(campaign=campaign.name, cell_id=p.cell_id, point_id=p.point_id, repeat=p.repeat, ordinal=i,
                label=p.label, params=p.params, recipe=p.recipe, resources=p.resources, env=p.env, active=True,
                trainer_kind=p.trainer_kind)  # fmt: skip
        for i, p in enumerate(points)
    ]
