"""The run store by itself: schema 1 → 2 migration of a store written by mbx 73cd8cc, one transaction per
method, attempt numbers that never reuse a run dir on disk, campaign.json, and a damaged file named as such."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import ROOT

from orchestrator.errors import MbxError, StoreDamaged, StoreTooNew
from orchestrator.run.store import (
    MANIFEST,
    SCHEMA_VERSION,
    STORE_FILE,
    AttemptRow,
    CellRow,
    Store,
    read_manifest,
)

# Written by `mbx campaign run` and `mbx ingest` at commit 73cd8cc (schema 1) in one workspace:
#   tiny    bundled trainer, 2 points (micro_batch_size 1, 2), 4 steps each;
#   replay  command trainer (tests/fixtures_cmd/fake_megatron.py), fail=infra-once retried once (attempt 2:
#           job info {"mbx_retry": {"try": 2, "steps_before": 3}}) and fail=none;
#   past    one Megatron-LM log ingested with `mbx ingest`.
FIXTURE = ROOT / "tests" / "data" / "store_schema1.sqlite"
TABLES = ("campaigns", "cells", "attempts", "results")


def _rows(path: Path, table: str) -> list[dict]:
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute(f"SELECT * FROM {table} ORDER BY rowid")]
    finally:
        db.close()


def _cell(campaign: str = "c", cell_id: str = "p-r0", ordinal: int = 0, **extra) -> CellRow:
    fields = dict(campaign=campaign, cell_id=cell_id, point_id=cell_id.split("-")[0], repeat=0, ordinal=ordinal,
                  label=cell_id, params={"x": ordinal}, recipe={"steps": 3}, resources={"nodes": 1}, env={})  # fmt: skip
    return CellRow(**{**fields, **extra})


@pytest.fixture
def migrated(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    shutil.copy(FIXTURE, workspace / STORE_FILE)
    return workspace


def test_migration_keeps_every_row_and_fills_the_new_columns(migrated):
    before = {table: _rows(FIXTURE, table) for table in TABLES}
    with Store(migrated) as store:
        assert set(store.campaign_names()) == {"tiny", "replay", "past"}
        kinds = {
            (c.campaign, c.cell_id): c.trainer_kind
            for n in ("tiny", "replay", "past")
            for c in store.cells(n)
        }
        budgets = {(a.campaign, a.cell_id, a.attempt): (a.try_number, a.steps_before, a.state, a.failure_class)
                   for n in ("tiny", "replay", "past") for a in store.attempts(n)}  # fmt: skip
        infos = [a.job_info for n in ("tiny", "replay", "past") for a in store.attempts(n)]
        replay = store.cells("replay")
    after = {table: _rows(migrated / STORE_FILE, table) for table in TABLES}

    # every row of every table is there, every old column unchanged (job info less the retry key)
    for table in TABLES:
        assert len(after[table]) == len(before[table]) > 0, table
        for old, new in zip(before[table], after[table], strict=True):
            if table == "attempts":
                info = json.loads(old.pop("job_info_json"))
                info.pop("mbx_retry", None)
                assert json.loads(new.pop("job_info_json")) == info
            assert {k: new[k] for k in old} == old, table
    assert [len(after[t]) for t in TABLES] == [3, 5, 6, 6]

    assert kinds == {
        ("tiny", "aebfcdde3f-r0"): "bundled", ("tiny", "7fab3c2a3f-r0"): "bundled",
        ("replay", "d457a2cff2-r0"): "command", ("replay", "e34797f679-r0"): "command",
        ("past", "66f0cd0bfd-r0"): "ingested",
    }  # fmt: skip
    assert budgets == {
        ("tiny", "7fab3c2a3f-r0", 1): (1, None, "completed", None),
        ("tiny", "aebfcdde3f-r0", 1): (1, None, "completed", None),
        ("replay", "d457a2cff2-r0", 1): (1, None, "failed", "infra"),
        ("replay", "d457a2cff2-r0", 2): (2, 3, "completed", None),
        ("replay", "e34797f679-r0", 1): (1, None, "completed", None),
        ("past", "66f0cd0bfd-r0", 1): (1, None, "completed", None),
    }
    assert all("mbx_retry" not in info for info in infos)
    assert all(set(info) == {"pid", "argv"} for info in infos if info), "the launcher's own job info is kept"
    assert replay[0].recipe["kind"] == "command" and replay[0].recipe["argv"], "the recipe keeps its content"

    # results read back as they were written
    with Store(migrated) as store:
        verdicts = {(r["campaign"], r["cell_id"], r["attempt"]): r["verdict"] for r in after["results"]}
        for (name, cell_id, attempt), verdict in verdicts.items():
            result = store.result(name, cell_id, attempt)
            assert result is not None and result.verdict == verdict
        assert store.result("replay", "d457a2cff2-r0", 2).summary["steps"] == 15
        assert store.result("tiny", "aebfcdde3f-r0", 1).summary["steps"] == 4


def test_migrated_schema_equals_a_new_store_and_writes_campaign_json(migrated, tmp_path):
    Store(migrated).close()
    Store(tmp_path / "fresh").close()

    def schema(path: Path) -> dict:
        db = sqlite3.connect(path)
        try:
            version = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
            return {
                "version": version,
                **{t: db.execute(f"PRAGMA table_info({t})").fetchall() for t in TABLES},
            }
        finally:
            db.close()

    assert schema(migrated / STORE_FILE) == schema(tmp_path / "fresh" / STORE_FILE)
    assert schema(migrated / STORE_FILE)["version"] == str(SCHEMA_VERSION)
    record, cells = read_manifest(migrated / "replay" / MANIFEST)
    assert record["launcher"] == "local" and record["source_file"] == "/tmp/fx/command.yaml"
    assert [c.trainer_kind for c in cells] == ["command", "command"]


def test_register_campaign_keeps_old_cells_inactive_and_writes_campaign_json(tmp_path):
    with Store(tmp_path) as store:
        store.register_campaign(
            "c", "a.yaml", {"name": "c"}, "local", [_cell(), _cell(cell_id="q-r0", ordinal=1)]
        )
        store.register_campaign("c", "b.yaml", {"name": "c", "v": 2}, "local",
                                [_cell(cell_id="q-r0", trainer_kind="command")])  # fmt: skip
        assert [c.cell_id for c in store.cells("c")] == ["q-r0"]
        assert [(c.cell_id, c.active) for c in store.cells("c", active_only=False)] == [
            ("p-r0", False), ("q-r0", True)
        ]  # fmt: skip
        assert store.campaign("c")["source_file"] == "b.yaml"
    record, cells = read_manifest(tmp_path / "c" / MANIFEST)
    assert record["spec"] == {"name": "c", "v": 2} and record["source_file"] == "b.yaml"
    assert [(c.cell_id, c.active, c.trainer_kind) for c in cells] == [("p-r0", False, "bundled"),
                                                                      ("q-r0", True, "command")]  # fmt: skip


def test_a_campaign_json_that_cannot_be_written_leaves_no_rows(tmp_path):
    (tmp_path / "c").write_text("a file where the campaign's directory belongs")
    with Store(tmp_path) as store:
        with pytest.raises(OSError):
            store.register_campaign("c", None, {"name": "c"}, "local", [_cell()])
        assert store.campaign("c") is None and store.cells("c") == []


def test_attempt_lifecycle_each_write_one_transaction(tmp_path):
    with Store(tmp_path) as store:
        store.register_campaign("c", None, {"name": "c"}, "local", [_cell()])
        first = store.reserve_attempt("c", "p-r0", "local", lambda n: tmp_path / "c" / "p-r0" / str(n), 2, 7)
        assert (first.attempt, first.state, first.try_number, first.steps_before) == (1, "submitted", 2, 7)
        assert Path(first.run_dir).is_dir()
        store.mark_submitted("c", "p-r0", 1, "42", {"argv": ["x"]})
        running = store.attempt("c", "p-r0", 1)
        assert (running.state, running.job_id, running.job_info) == ("running", "42", {"argv": ["x"]})

        # a failure inside record_outcome (the result cannot be written) leaves neither half
        with pytest.raises(TypeError):
            store.record_outcome(
                "c", "p-r0", 1, "completed", None, None, {"bad": object()}, {"verdict": "pass"}
            )
        assert store.attempt("c", "p-r0", 1).state == "running" and store.result("c", "p-r0", 1) is None

        store.record_outcome("c", "p-r0", 1, "failed", "boom", "infra", {"steps": 3}, {"verdict": "fail"})
        done = store.attempt("c", "p-r0", 1)
        assert (done.state, done.reason, done.failure_class) == ("failed", "boom", "infra") and done.ended_at
        result = store.result("c", "p-r0", 1)
        assert (result.summary, result.verdict) == ({"steps": 3}, "fail")
        store.set_state("c", "p-r0", 1, "failed", "boom; no retry", "infra")
        assert store.attempt("c", "p-r0", 1).reason == "boom; no retry"


def test_reserve_attempt_never_reuses_a_run_dir_on_disk(tmp_path):
    """A store lost and started afresh must not hand out attempt 1 again while <cell>/1 holds a run."""
    cell_dir = tmp_path / "c" / "p-r0"
    for n in (1, 2):
        (cell_dir / str(n)).mkdir(parents=True)
        (cell_dir / str(n) / "metrics.jsonl").write_text('{"step": 1}\n')
    with Store(tmp_path) as store:
        store.register_campaign("c", None, {"name": "c"}, "local", [_cell()])
        numbers = [
            store.reserve_attempt("c", "p-r0", "local", lambda n: cell_dir / str(n)).attempt for _ in "ab"
        ]
    assert numbers == [3, 4]
    assert (cell_dir / "1" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert not any((cell_dir / "3").iterdir()), "a new attempt starts in an empty run dir"


def test_requeue_ends_one_attempt_and_starts_the_next_with_the_same_try(tmp_path):
    with Store(tmp_path) as store:
        store.register_campaign("c", None, {"name": "c"}, "submitit", [_cell()])
        store.reserve_attempt("c", "p-r0", "submitit", lambda n: tmp_path / "c" / "p-r0" / str(n), 2, 5)
        store.mark_submitted("c", "p-r0", 1, "77", {})
        new = store.requeue("c", "p-r0", 1, "/archive/0", "requeued")
        old = store.attempt("c", "p-r0", 1)
    assert (old.state, old.failure_class, old.run_dir) == ("preempted", "preempted", "/archive/0")
    assert (new.attempt, new.state, new.job_id, new.try_number, new.steps_before) == (
        2,
        "running",
        "77",
        2,
        5,
    )
    assert new.run_dir == str(tmp_path / "c" / "p-r0" / "1")


def test_record_ingested_is_one_transaction_with_campaign_json(tmp_path):
    cell = _cell(campaign="past", trainer_kind="ingested")
    with Store(tmp_path) as store:
        store.record_ingested({"name": "past"}, cell, 1, str(tmp_path / "run"), "completed", None, None,
                              {"steps": 9}, {"verdict": "pass"})  # fmt: skip
        with pytest.raises(sqlite3.IntegrityError):  # the same attempt twice: nothing of the second stays
            store.record_ingested({"name": "past", "v": 2}, cell, 1, "x", "failed", None, None, None, None)
        assert (
            store.campaign("past")["spec"] == {"name": "past"}
            and store.campaign("past")["launcher"] == "ingest"
        )
        attempt = store.attempt("past", "p-r0", 1)
        assert (attempt.launcher, attempt.state) == ("ingest", "completed")
        assert store.result("past", "p-r0", 1).summary == {"steps": 9}
    record, cells = read_manifest(tmp_path / "past" / MANIFEST)
    assert record["launcher"] == "ingest" and cells[0].trainer_kind == "ingested"


def test_rows_are_built_with_keywords():
    with pytest.raises(TypeError):
        AttemptRow("c", "p-r0", 1, "local", "/run", "running")  # type: ignore[misc]


@pytest.mark.parametrize("damage", ["garbage", "truncate"])
def test_a_damaged_store_is_an_mbx_error_naming_the_file_and_the_rebuild(tmp_path, damage):
    workspace = tmp_path / "ws"
    with Store(workspace) as store:
        for index in range(40):  # enough rows for several pages, so that cutting the file loses some
            store.register_campaign(
                f"c{index}", None, {"name": "c", "pad": "x" * 2000}, "local", [_cell(f"c{index}")]
            )
    path = workspace / STORE_FILE
    data = path.read_bytes()
    path.write_bytes(b"this is not a database" * 100 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(StoreDamaged) as caught:
        with Store(workspace) as store:
            store.campaign_names()
    assert isinstance(caught.value, MbxError) and caught.value.exit_code == 1
    assert str(path) in str(caught.value)
    assert f"mbx store rebuild --workspace {workspace}" in str(caught.value)


def test_a_store_from_a_newer_mbx_is_refused(tmp_path):
    Store(tmp_path).close()
    db = sqlite3.connect(tmp_path / STORE_FILE)
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreTooNew, match="newer mbx"):
        Store(tmp_path)
