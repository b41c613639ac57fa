"""The run store: SQLite (WAL) in the workspace holding campaigns, cells, attempts, states and results."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
STORE_FILE = "mbx.sqlite"

# Attempt states. Terminal ones never change again.
ACTIVE_STATES = ("submitted", "running")
TERMINAL_STATES = ("completed", "failed", "timeout", "cancelled", "preempted")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS campaigns (
    name TEXT PRIMARY KEY,
    source_file TEXT,
    spec_json TEXT NOT NULL,
    launcher TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS cells (
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
    PRIMARY KEY (campaign, cell_id)
);
CREATE TABLE IF NOT EXISTS attempts (
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
    PRIMARY KEY (campaign, cell_id, attempt),
    FOREIGN KEY (campaign, cell_id) REFERENCES cells(campaign, cell_id)
);
CREATE TABLE IF NOT EXISTS results (
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


@dataclass
class CellRow:
    campaign: str
    cell_id: str
    point_id: str
    repeat: int
    ordinal: int
    label: str
    params: dict[str, Any]
    recipe: dict[str, Any]
    resources: dict[str, Any]
    env: dict[str, str]
    active: bool


@dataclass
class AttemptRow:
    campaign: str
    cell_id: str
    attempt: int
    launcher: str
    job_id: str | None
    job_info: dict[str, Any]
    run_dir: str
    state: str
    reason: str | None
    failure_class: str | None
    submitted_at: float | None
    ended_at: float | None


@dataclass
class ResultRow:
    campaign: str
    cell_id: str
    attempt: int
    summary: dict[str, Any] | None
    gate: dict[str, Any] | None
    verdict: str | None


class Store:
    """One SQLite file per workspace; every write is its own short transaction (safe to SIGKILL anytime)."""

    def __init__(self, workspace: Path):
        self.workspace = Path(workspace).expanduser().resolve()  # run dirs are used from other cwds
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.path = self.workspace / STORE_FILE
        self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row["value"]) > SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path} was written by a newer mbx (schema {row['value']} > {SCHEMA_VERSION}); upgrade mbx"
            )

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # campaigns -----------------------------------------------------------------------------------------
    def upsert_campaign(
        self, name: str, source_file: str | None, spec: dict[str, Any], launcher: str
    ) -> None:
        now = time.time()
        with self.transaction() as db:
            db.execute(
                "INSERT INTO campaigns VALUES (?,?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET "
                "source_file=excluded.source_file, spec_json=excluded.spec_json, launcher=excluded.launcher, "
                "updated_at=excluded.updated_at",
                (name, source_file, json.dumps(spec), launcher, now, now),
            )

    def campaign(self, name: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT * FROM campaigns WHERE name=?", (name,)).fetchone()
        if row is None:
            return None
        return {
            "name": row["name"],
            "source_file": row["source_file"],
            "spec": json.loads(row["spec_json"]),
            "launcher": row["launcher"],
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
        }

    def campaign_names(self) -> list[str]:
        return [r["name"] for r in self._db.execute("SELECT name FROM campaigns ORDER BY updated_at DESC")]

    # cells ---------------------------------------------------------------------------------------------
    def sync_cells(self, campaign: str, cells: list[CellRow]) -> None:
        """Make exactly these cells active (in this order); cells no longer in the campaign stay, inactive."""
        with self.transaction() as db:
            db.execute("UPDATE cells SET active=0 WHERE campaign=?", (campaign,))
            for cell in cells:
                db.execute(
                    "INSERT INTO cells VALUES (?,?,?,?,?,?,?,?,?,?,1) ON CONFLICT(campaign, cell_id) DO UPDATE SET "
                    "ordinal=excluded.ordinal, label=excluded.label, params_json=excluded.params_json, active=1",
                    (
                        campaign,
                        cell.cell_id,
                        cell.point_id,
                        cell.repeat,
                        cell.ordinal,
                        cell.label,
                        json.dumps(cell.params),
                        json.dumps(cell.recipe),
                        json.dumps(cell.resources),
                        json.dumps(cell.env),
                    ),
                )

    def cells(self, campaign: str, active_only: bool = True) -> list[CellRow]:
        query = (
            "SELECT * FROM cells WHERE campaign=?"
            + (" AND active=1" if active_only else "")
            + " ORDER BY ordinal"
        )
        return [
            CellRow(
                r["campaign"],
                r["cell_id"],
                r["point_id"],
                r["repeat"],
                r["ordinal"],
                r["label"],
                json.loads(r["params_json"]),
                json.loads(r["recipe_json"]),
                json.loads(r["resources_json"]),
                json.loads(r["env_json"]),
                bool(r["active"]),
            )
            for r in self._db.execute(query, (campaign,))
        ]

    # attempts ------------------------------------------------------------------------------------------
    def new_attempt(self, campaign: str, cell_id: str, launcher: str, run_dir_of: Any) -> AttemptRow:
        """Reserve the next attempt number of a cell (state 'submitted', no job id yet)."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT COALESCE(MAX(attempt), 0) AS n FROM attempts WHERE campaign=? AND cell_id=?",
                (campaign, cell_id),
            ).fetchone()
            number = int(row["n"]) + 1
            run_dir = str(run_dir_of(number))
            db.execute(
                "INSERT INTO attempts (campaign, cell_id, attempt, launcher, run_dir, state, submitted_at) "
                "VALUES (?,?,?,?,?,?,?)",
                (campaign, cell_id, number, launcher, run_dir, "submitted", time.time()),
            )
        return self.attempt(campaign, cell_id, number)  # type: ignore[return-value]

    def requeue(self, campaign: str, cell_id: str, attempt: int, archive_dir: str, reason: str) -> AttemptRow:
        """A requeued job: `attempt` ends as preempted with its outputs in `archive_dir`; the rerun (same job,
        same live run dir) becomes the cell's next attempt, running. One transaction: never half of it."""
        with self.transaction() as db:
            old = db.execute(
                "SELECT * FROM attempts WHERE campaign=? AND cell_id=? AND attempt=?", (campaign, cell_id, attempt)
            ).fetchone()
            number = int(db.execute(
                "SELECT MAX(attempt) AS n FROM attempts WHERE campaign=? AND cell_id=?", (campaign, cell_id)
            ).fetchone()["n"]) + 1
            now = time.time()
            db.execute(
                "UPDATE attempts SET run_dir=?, state='preempted', reason=?, failure_class='preempted', ended_at=? "
                "WHERE campaign=? AND cell_id=? AND attempt=?",
                (archive_dir, reason, now, campaign, cell_id, attempt),
            )
            db.execute(
                "INSERT INTO attempts (campaign, cell_id, attempt, launcher, job_id, job_info_json, run_dir, state, "
                "submitted_at) VALUES (?,?,?,?,?,?,?,?,?)",
                (campaign, cell_id, number, old["launcher"], old["job_id"], old["job_info_json"], old["run_dir"],
                 "running", now),
            )
        return self.attempt(campaign, cell_id, number)  # type: ignore[return-value]

    def set_job(self, campaign: str, cell_id: str, attempt: int, job_id: str, info: dict[str, Any]) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE attempts SET job_id=?, job_info_json=? WHERE campaign=? AND cell_id=? AND attempt=?",
                (job_id, json.dumps(info), campaign, cell_id, attempt),
            )

    def set_state(
        self,
        campaign: str,
        cell_id: str,
        attempt: int,
        state: str,
        reason: str | None = None,
        failure_class: str | None = None,
    ) -> None:
        ended = time.time() if state in TERMINAL_STATES else None
        with self.transaction() as db:
            db.execute(
                "UPDATE attempts SET state=?, reason=?, failure_class=?, ended_at=COALESCE(?, ended_at) "
                "WHERE campaign=? AND cell_id=? AND attempt=?",
                (state, reason, failure_class, ended, campaign, cell_id, attempt),
            )

    def _attempt(self, row: sqlite3.Row) -> AttemptRow:
        return AttemptRow(
            row["campaign"],
            row["cell_id"],
            row["attempt"],
            row["launcher"],
            row["job_id"],
            json.loads(row["job_info_json"] or "{}"),
            row["run_dir"],
            row["state"],
            row["reason"],
            row["failure_class"],
            row["submitted_at"],
            row["ended_at"],
        )

    def attempt(self, campaign: str, cell_id: str, attempt: int) -> AttemptRow | None:
        row = self._db.execute(
            "SELECT * FROM attempts WHERE campaign=? AND cell_id=? AND attempt=?",
            (campaign, cell_id, attempt),
        ).fetchone()
        return self._attempt(row) if row else None

    def attempts(self, campaign: str, cell_id: str | None = None) -> list[AttemptRow]:
        if cell_id is None:
            rows = self._db.execute(
                "SELECT * FROM attempts WHERE campaign=? ORDER BY cell_id, attempt", (campaign,)
            )
        else:
            rows = self._db.execute(
                "SELECT * FROM attempts WHERE campaign=? AND cell_id=? ORDER BY attempt", (campaign, cell_id)
            )
        return [self._attempt(r) for r in rows]

    def latest_attempts(self, campaign: str) -> dict[str, AttemptRow]:
        latest: dict[str, AttemptRow] = {}
        for attempt in self.attempts(campaign):
            latest[attempt.cell_id] = attempt  # ordered by attempt number
        return latest

    # results -------------------------------------------------------------------------------------------
    def put_result(
        self,
        campaign: str,
        cell_id: str,
        attempt: int,
        summary: dict[str, Any] | None,
        gate: dict[str, Any] | None,
    ) -> None:
        verdict = gate.get("verdict") if gate else None
        with self.transaction() as db:
            db.execute(
                "INSERT INTO results VALUES (?,?,?,?,?,?,?) ON CONFLICT(campaign, cell_id, attempt) DO UPDATE SET "
                "summary_json=excluded.summary_json, gate_json=excluded.gate_json, verdict=excluded.verdict, "
                "collected_at=excluded.collected_at",
                (
                    campaign,
                    cell_id,
                    attempt,
                    json.dumps(summary) if summary is not None else None,
                    json.dumps(gate) if gate is not None else None,
                    verdict,
                    time.time(),
                ),
            )

    def result(self, campaign: str, cell_id: str, attempt: int) -> ResultRow | None:
        row = self._db.execute(
            "SELECT * FROM results WHERE campaign=? AND cell_id=? AND attempt=?", (campaign, cell_id, attempt)
        ).fetchone()
        if row is None:
            return None
        return ResultRow(
            row["campaign"],
            row["cell_id"],
            row["attempt"],
            json.loads(row["summary_json"]) if row["summary_json"] else None,
            json.loads(row["gate_json"]) if row["gate_json"] else None,
            row["verdict"],
        )

    # ingested runs -------------------------------------------------------------------------------------
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
        """One ingested run (`mbx ingest`): campaign, cell, finished attempt and result, in one transaction."""
        now = time.time()
        with self.transaction() as db:
            db.execute(
                "INSERT INTO campaigns VALUES (?,?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET "
                "spec_json=excluded.spec_json, updated_at=excluded.updated_at",
                (cell.campaign, None, json.dumps(spec), "ingest", now, now),
            )
            db.execute(
                "INSERT INTO cells VALUES (?,?,?,?,?,?,?,?,?,?,1) ON CONFLICT(campaign, cell_id) DO UPDATE SET "
                "label=excluded.label, params_json=excluded.params_json, recipe_json=excluded.recipe_json, active=1",
                (
                    cell.campaign,
                    cell.cell_id,
                    cell.point_id,
                    cell.repeat,
                    cell.ordinal,
                    cell.label,
                    json.dumps(cell.params),
                    json.dumps(cell.recipe),
                    json.dumps(cell.resources),
                    json.dumps(cell.env),
                ),
            )
            db.execute(
                "INSERT INTO attempts (campaign, cell_id, attempt, launcher, run_dir, state, reason, failure_class, "
                "submitted_at, ended_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    cell.campaign,
                    cell.cell_id,
                    attempt,
                    "ingest",
                    run_dir,
                    state,
                    reason,
                    failure_class,
                    now,
                    now,
                ),
            )
            db.execute(
                "INSERT INTO results VALUES (?,?,?,?,?,?,?)",
                (
                    cell.campaign,
                    cell.cell_id,
                    attempt,
                    json.dumps(summary) if summary is not None else None,
                    json.dumps(gate) if gate is not None else None,
                    gate.get("verdict") if gate else None,
                    now,
                ),
            )
