"""The one campaign lifecycle (orchestrator/flow/lifecycle.py): the dry run's attempt numbers are the real
run's (one owner: store.next_attempt_number, gaps in the run dirs included), a dry run leaves the store as it
found it (read-only: no tables made, no v1 store migrated, no store made), and `mbx compare --run` prepares
its sides as `mbx campaign run` does (the parity sides added, infeasible points recorded and skipped).

The campaigns are the command trainer with the fake Megatron (tests/fixtures_cmd/fake_megatron.py replays a
real log, no torch): a run starts one short Python process per cell."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import FAKE_MEGATRON, MEGATRON_LOG, ROOT

from orchestrator.flow import lifecycle
from orchestrator.run.store import STORE_FILE, Store, read_only

SCHEMA1 = ROOT / "tests" / "data" / "store_schema1.sqlite"
LAYOUT_PROBLEM = "world size 1 is not divisible by TP·PP·CP = 4·4·1"


def campaign(name: str, **over: Any) -> dict[str, Any]:
    """The fake Megatron, one point (TP = PP = 1) unless `over` sweeps more, on the local launcher."""
    data = {
        "name": name,
        "trainer": {
            "kind": "command",
            "command": [sys.executable, str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0"],
            "params": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 2048,
                       "vocab_size": 32000, "micro_batch_size": 1, "global_batch_size": 8, "bf16": True},
            "log_format": "megatron-lm",
        },  # fmt: skip
        "resources": {"gpu": "H100-80GB"},
        "launcher": "local",
        "wandb": {"mode": "disabled"},
    }
    data.update(over)
    return data


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_dry_run_numbers_attempts_as_the_real_run_with_gaps_in_the_run_dirs(tmp_path: Path, capsys) -> None:
    """Attempt 1 in the store (failed), run dirs 1 and 3 on disk: the dry run shows attempt 4 and the real run
    submits attempt 4 (it reserved 2 before: the dry run promised a script it would not submit)."""
    file = write(tmp_path, campaign("gaps"))
    options = lifecycle.Options(tmp_path / "ws", make_report=False, log_wandb=False)
    plan = lifecycle.prepare(file, options)
    (cell,) = plan.cells
    cell_dir = plan.workspace / "gaps" / cell.cell_id
    with Store(plan.workspace) as store:
        store.register_campaign("gaps", str(file), plan.campaign.model_dump(mode="json"), "local", plan.cells)
        first = store.reserve_attempt("gaps", cell.cell_id, "local", lambda n: cell_dir / str(n))
        store.set_state("gaps", cell.cell_id, first.attempt, "failed", "killed")
    (cell_dir / "3").mkdir()
    (cell_dir / "3" / "note.txt").write_text("a run dir the store does not know\n")

    dry = lifecycle.prepare(file, options)
    assert dry.attempts == {cell.cell_id: 4}
    lifecycle.render(dry)
    shown = capsys.readouterr().out
    assert f"{cell.cell_id}/4" in shown and f"{cell.cell_id}/2" not in shown, shown

    finished = lifecycle.execute(lifecycle.prepare(file, options))
    assert finished.outcome.completed == 1, finished.outcome
    with Store(plan.workspace, create=False) as store:
        numbers = [a.attempt for a in store.attempts("gaps", cell.cell_id)]
        latest = store.latest_attempts("gaps")[cell.cell_id]
    assert numbers == [1, 4] and latest.state == "completed"
    assert Path(latest.run_dir) == cell_dir / "4"
    assert (cell_dir / "3" / "note.txt").read_text() == "a run dir the store does not know\n"
    assert not (cell_dir / "2").exists()


def test_a_dry_run_leaves_a_version_1_store_as_it_was(tmp_path: Path, capsys) -> None:
    """A dry run reads a schema-1 store through a migrated copy in memory: the file keeps its bytes and schema
    (a read-write open migrated it, and made the additive tables)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    shutil.copy(SCHEMA1, workspace / STORE_FILE)
    before = hashlib.sha256((workspace / STORE_FILE).read_bytes()).hexdigest()
    plan = lifecycle.prepare(write(tmp_path, campaign("tiny")), lifecycle.Options(workspace))
    lifecycle.render(plan)
    assert "dry run: nothing submitted (1 attempt(s) rendered)" in capsys.readouterr().out
    assert hashlib.sha256((workspace / STORE_FILE).read_bytes()).hexdigest() == before
    db = sqlite3.connect(f"file:{workspace / STORE_FILE}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        version = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    finally:
        db.close()
    assert "estimates" not in tables and "trials" not in tables and version in (None, ("1",))
    assert not (workspace / "tiny").exists(), "a dry run makes no campaign directory"


def test_the_read_only_store_reads_schema_1_and_refuses_writes(tmp_path: Path) -> None:
    shutil.copy(SCHEMA1, tmp_path / STORE_FILE)
    with read_only(tmp_path) as store:
        assert store is not None
        names = store.campaign_names()
        attempts = [a for name in names for a in store.attempts(name)]
        assert attempts and all(a.try_number >= 1 for a in attempts)  # schema 2's columns, from the copy
        with pytest.raises(RuntimeError, match="read-only"):
            store.register_campaign("x", None, {"name": "x"}, "local", [])
    with read_only(tmp_path / "nowhere") as store:
        assert store is None
    assert not (tmp_path / "nowhere").exists()


def test_a_dry_run_makes_no_workspace_and_no_store(tmp_path: Path, capsys) -> None:
    workspace = tmp_path / "ws"
    lifecycle.render(lifecycle.prepare(write(tmp_path, campaign("none")), lifecycle.Options(workspace)))
    assert "1 attempt(s) rendered" in capsys.readouterr().out
    assert not workspace.exists()
    workspace.mkdir()  # a workspace without a store: still no store made
    lifecycle.render(lifecycle.prepare(write(tmp_path, campaign("none")), lifecycle.Options(workspace)))
    assert list(workspace.iterdir()) == []


def parity_side(name: str) -> dict[str, Any]:
    """A parity campaign (bf16 off/on) sweeping TP×PP 1×1 (runs) and 4×4 (breaks the layout on one rank)."""
    return campaign(
        name,
        sweep={"zip": [{"tensor_model_parallel_size": [1, 4], "pipeline_model_parallel_size": [1, 4]}]},
        parity={"toggle": {"bf16": [False, True]}, "metrics": {"loss": {"max_rel": 0.5}}},
    )


def test_compare_run_adds_parity_sides_and_skips_infeasible_points_as_campaign_run(tmp_path: Path, mbx) -> None:
    """`mbx compare --run` of two parity campaigns with an infeasible point: each side gets its parity sides as
    sweep factors and its infeasible points recorded and skipped, with the lines `mbx campaign run` prints
    (it refused the whole A/B with exit 2 before, and ran no parity side)."""
    a, b = write(tmp_path, parity_side("lc-a")), write(tmp_path, parity_side("lc-b"))
    workspace = tmp_path / "ws"
    result = mbx("compare", str(a), str(b), "--run", "--workspace", str(workspace), "--repeats", "1")
    assert result.returncode in (0, 3), result.stdout + result.stderr
    assert result.stdout.count("2 of 4 point(s) infeasible, skipped (not run):") == 2, result.stdout
    assert LAYOUT_PROBLEM in result.stdout
    with Store(workspace, create=False) as store:
        for name in ("lc-a", "lc-b"):
            cells = store.cells(name)
            assert sorted(c.params["bf16"] for c in cells) == [False, True]  # the parity sides, run
            assert {c.params["tensor_model_parallel_size"] for c in cells} == {1}
            assert [r["feasible"] for r in store.estimates(name)] == [True, False, True, False]
            assert all(a.state == "completed" for a in store.attempts(name))

    alone = mbx("campaign", "run", str(write(tmp_path, parity_side("lc-c"))), "--workspace", str(tmp_path / "ws2"),
                "--dry-run")  # fmt: skip
    assert alone.returncode == 0 and alone.stdout.count("INFEASIBLE") == 2, alone.stdout + alone.stderr
    assert "2 attempt(s) rendered" in alone.stdout


def test_campaign_list_reads_a_version_1_store_without_migrating_it(tmp_path: Path) -> None:
    from orchestrator.flow.runner import campaign_names

    shutil.copy(SCHEMA1, tmp_path / STORE_FILE)
    before = hashlib.sha256((tmp_path / STORE_FILE).read_bytes()).hexdigest()
    assert sorted(campaign_names(tmp_path)) == ["past", "replay", "tiny"]
    assert hashlib.sha256((tmp_path / STORE_FILE).read_bytes()).hexdigest() == before
    assert not list(tmp_path.glob("*/campaign.json")), "a migration writes each campaign's manifest"


def test_a_dry_run_renders_no_script_for_a_running_attempt_a_real_run_adopts(tmp_path: Path, capsys) -> None:
    """A cell whose attempt is submitted and not ended is adopted by a real run (engine._start), not submitted
    again: the dry run shows no script for it (it rendered attempt 2 before)."""
    file = write(tmp_path, campaign("busy"))
    options = lifecycle.Options(tmp_path / "ws")
    plan = lifecycle.prepare(file, options)
    (cell,) = plan.cells
    with Store(plan.workspace) as store:
        store.register_campaign("busy", str(file), plan.campaign.model_dump(mode="json"), "local", plan.cells)
        store.reserve_attempt("busy", cell.cell_id, "local", lambda n: plan.workspace / "busy" / cell.cell_id / str(n))
        store.mark_submitted("busy", cell.cell_id, 1, "4242", {})
    dry = lifecycle.prepare(file, options)
    assert dry.attempts == {}
    lifecycle.render(dry)
    assert "(0 attempt(s) rendered); 1 cell(s) running (a real run follows them)" in capsys.readouterr().out
