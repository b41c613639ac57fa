"""Corrupt run-dir files, workspaces of the wrong kind, a damaged store and a full disk during the report: each is
one clean line (or a note on the cell), never a traceback; stored results stay shown (real `mbx` subprocesses)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from conftest import TINY_MOE_RECIPE, run_mbx

from orchestrator.judge.views import cell_view
from orchestrator.run.collect import collect_attempt
from orchestrator.run.store import Store
from reports.gates import GateSpec
from trainer import rundir

NAME = "tiny"


def _campaign(tmp: Path) -> Path:
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 4
    data = {"name": NAME, "trainer": {"recipe": recipe}, "sweep": {"axes": {"model.moe.top_k": [1, 2]}},
            "collect": {"window": 2}, "wandb": {"mode": "disabled"}}  # fmt: skip
    path = tmp / "tiny.yaml"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """A workspace where a real two-cell campaign completed (made once, copied by each test)."""
    tmp = tmp_path_factory.mktemp("finished")
    file = _campaign(tmp)
    cache = {"MBX_CACHE_DIR": str(tmp / "cache"), "WANDB_MODE": "disabled"}
    result = run_mbx("campaign", "run", str(file), "--workspace", str(tmp / "ws"), "--no-report", env=cache)
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp / "ws", file


def _copy(source: Path, target: Path) -> Path:
    """A copy of a workspace whose store points at the copy's run dirs."""
    shutil.copytree(source, target, symlinks=True)
    db = sqlite3.connect(target / "mbx.sqlite")
    db.execute("UPDATE attempts SET run_dir=replace(run_dir, ?, ?)", (f"{source}/", f"{target}/"))
    db.commit()
    db.close()
    return target


def _run_dirs(workspace: Path) -> list[Path]:
    db = sqlite3.connect(workspace / "mbx.sqlite")
    try:
        return [workspace / r[0] for r in db.execute("SELECT run_dir FROM attempts ORDER BY cell_id")]
    finally:
        db.close()


def _clean(result: subprocess.CompletedProcess, code: int = 0) -> str:
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text
    assert result.returncode == code, text
    return text


def _junk_middle(d: Path) -> str:
    (d / rundir.METRICS).write_bytes(b'{"step": 1}\n\xff\x00\x9cjunk\n{"step": 2}\n')
    return rundir.METRICS


def _binary(d: Path) -> str:
    (d / rundir.METRICS).write_bytes(bytes(range(256)) * 4)
    return rundir.METRICS


def _metrics_dir(d: Path) -> str:
    (d / rundir.METRICS).unlink()
    (d / rundir.METRICS).mkdir()
    return rundir.METRICS


def _not_utf8(name: str):
    def corrupt(d: Path) -> str:
        (d / name).write_bytes(b'{"a": "\xff\xfe"}')
        return name

    return corrupt


def _truncated(name: str):
    def corrupt(d: Path) -> str:
        text = (d / name).read_bytes()
        (d / name).write_bytes(text[: len(text) // 2] if name != rundir.RECIPE else b"model: {vocab_size: [1,\n")
        return name

    return corrupt


def _dir_is_file(d: Path) -> str:
    shutil.rmtree(d)
    d.write_text("not a directory\n")
    return ""


def _deep(d: Path) -> str:
    (d / rundir.ENV).write_text("[" * 100000)
    return rundir.ENV


CORRUPTIONS = {
    "metrics-bad-middle-line": _junk_middle,
    "metrics-binary-junk": _binary,
    "metrics-is-a-directory": _metrics_dir,
    "run-dir-is-a-file": _dir_is_file,
    "env-deeply-nested": _deep,
    **{f"{name}-not-utf8": _not_utf8(name) for name in (rundir.ENV, rundir.NODE, rundir.LAUNCH, rundir.STATUS,
                                                         rundir.EXIT, rundir.RECIPE)},
    **{f"{name}-truncated": _truncated(name) for name in (rundir.ENV, rundir.NODE, rundir.LAUNCH, rundir.STATUS,
                                                           rundir.EXIT, rundir.RECIPE)},
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_damaged_file_is_a_note_not_a_traceback(finished, tmp_path, case):
    source, _ = finished
    workspace = _copy(source, tmp_path / "ws")
    damaged_dir = _run_dirs(workspace)[0]
    if case.startswith(rundir.NODE):
        rundir.write_node(damaged_dir, {"gpu_name": "x"})  # the local launcher writes no node.json
    name = CORRUPTIONS[case](damaged_dir)
    damaged_path = str(damaged_dir / name) if name else str(damaged_dir)

    status = json.loads(_clean(run_mbx("campaign", "status", NAME, "--workspace", str(workspace), "--json")))["cells"]
    assert [c["state"] for c in status] == ["completed", "completed"]
    assert all(c["summary"] and c["summary"]["tflops_per_gpu"] for c in status), "stored results must stay shown"
    notes = status[0]["damaged"]
    assert notes and all(damaged_path in note for note in notes), notes
    assert status[1]["damaged"] == []

    table = _clean(run_mbx("campaign", "status", NAME, "--workspace", str(workspace)))
    assert "damaged" in table and damaged_path.replace("\n", "") in table.replace("\n", "")

    report = _clean(run_mbx("report", NAME, "--workspace", str(workspace), "--markdown"))
    assert "### Damaged run-directory files" in report and Path(damaged_path).name in report
    page = (workspace / NAME / "report" / "index.html").read_text()
    assert 'id="damaged-warning"' in page and 'class="damaged"' in page


@pytest.mark.parametrize("case", ["metrics-bad-middle-line", "metrics-is-a-directory", "run-dir-is-a-file",
                                  "status.json-not-utf8", "env-deeply-nested"])  # fmt: skip
def test_collection_and_wandb_view_survive_damage(finished, tmp_path, case):
    """What resume's collection (`collect_attempt`) and the W&B logger (`cell_view` with rows) read."""
    source, _ = finished
    workspace = _copy(source, tmp_path / "ws")
    run_dir = _run_dirs(workspace)[0]
    name = CORRUPTIONS[case](run_dir)
    collected = collect_attempt(run_dir, GateSpec(), 2)
    assert "damaged" in (collected.reason or "") and str(run_dir / name).rstrip("/") in collected.reason
    if case.startswith("metrics"):
        assert collected.summary is None and collected.gate.verdict == "inconclusive"
        assert rundir.METRICS in collected.gate.checks[0].message
    with Store(workspace, create=False) as store:
        cell = store.cells(NAME)[0]
        view = cell_view(store, NAME, cell, store.latest_attempts(NAME)[cell.cell_id], with_rows=True)
    assert view.summary is not None and view.damaged


# ---- workspaces of the wrong kind -----------------------------------------------------------------------
def _one_error(result: subprocess.CompletedProcess, code: int, *words: str) -> str:
    _clean(result, code)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def _commands(workspace: str, file: Path) -> list[tuple[str, ...]]:
    return [
        ("campaign", "run", str(file), "--workspace", workspace, "--no-report"),
        ("campaign", "status", NAME, "--workspace", workspace),
        ("campaign", "status", NAME, "--workspace", workspace, "--json"),
        ("campaign", "list", "--workspace", workspace),
        ("campaign", "resume", NAME, "--workspace", workspace),
        ("campaign", "cancel", NAME, "--workspace", workspace),
        ("report", NAME, "--workspace", workspace),
    ]


def test_workspace_that_is_a_file(tmp_path):
    file = _campaign(tmp_path)
    for args in _commands(str(file), file):
        _one_error(run_mbx(*args), 2, str(file), "not a directory")


@pytest.mark.parametrize("where", ["/proc/mbx-workspace", "/sys/mbx-workspace", "/proc/1/mbx"])
def test_workspace_where_nothing_can_be_written(tmp_path, where):
    file = _campaign(tmp_path)
    _one_error(run_mbx("campaign", "run", str(file), "--workspace", where), 2, where)
    _one_error(run_mbx("campaign", "status", NAME, "--workspace", where), 2, where)


def test_missing_workspace_is_not_created(tmp_path):
    file = _campaign(tmp_path)
    missing = tmp_path / "nowhere" / "ws"
    for args in _commands(str(missing), file)[1:]:  # every command but run
        _one_error(run_mbx(*args), 2, "no workspace", str(missing))
        assert not missing.exists() and not missing.parent.exists(), args


def test_store_path_that_is_a_directory(tmp_path):
    file = _campaign(tmp_path)
    (tmp_path / "ws" / "mbx.sqlite").mkdir(parents=True)
    for args in _commands(str(tmp_path / "ws"), file):
        _one_error(run_mbx(*args), 2, "mbx.sqlite", "not a file")


def test_workspace_without_a_store(tmp_path):
    (tmp_path / "ws").mkdir()
    file = _campaign(tmp_path)
    for args in _commands(str(tmp_path / "ws"), file)[1:]:
        _one_error(run_mbx(*args), 2, "no run store")
        assert list((tmp_path / "ws").iterdir()) == [], args


def test_truncated_store_is_store_damaged_everywhere(finished, tmp_path):
    source, file = finished
    workspace = _copy(source, tmp_path / "ws")
    for extra in ("mbx.sqlite-wal", "mbx.sqlite-shm"):
        (workspace / extra).unlink(missing_ok=True)
    store = workspace / "mbx.sqlite"
    store.write_bytes(store.read_bytes()[:5000])
    for args in _commands(str(workspace), file):
        _one_error(run_mbx(*args), 1, "run store is damaged", "mbx store rebuild")


@pytest.mark.parametrize("kind", ["report-dir-is-a-file", "out-is-a-file", "index-is-a-directory", "assets-is-a-file"])
def test_report_dir_of_the_wrong_kind(finished, tmp_path, kind):
    source, _ = finished
    workspace = _copy(source, tmp_path / "ws")
    report = workspace / NAME / "report"
    args = ["report", NAME, "--workspace", str(workspace)]
    if kind == "report-dir-is-a-file":
        report.write_text("x")
    elif kind == "out-is-a-file":
        (tmp_path / "out").write_text("x")
        args += ["--out", str(tmp_path / "out")]
    elif kind == "index-is-a-directory":
        (report / "index.html").mkdir(parents=True)
    else:
        report.mkdir()
        (report / "assets").write_text("x")
    _one_error(run_mbx(*args), 2, "the report cannot be written", f"mbx report {NAME}")


# ---- a full disk while the report copies its assets -------------------------------------------------------
def test_full_disk_during_the_report_keeps_the_verdict(tmp_path):
    """A 1 MiB tmpfs where the report goes: plotly.min.js (MBs) does not fit; the cells all completed and were
    stored, so PASS is printed; then one error line names the file system and `mbx report`, exit 1 (a full disk
    is an error said in one line, issue 32; it was a warning and exit 0)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    file = _campaign(tmp_path)
    workspace = tmp_path / "ws"
    report = workspace / NAME / "report"
    report.mkdir(parents=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(report)], capture_output=True,
                           text=True)  # fmt: skip
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        cache = {"MBX_CACHE_DIR": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
        result = run_mbx("campaign", "run", str(file), "--workspace", str(workspace), env=cache)
        text = _clean(result, 1)
        assert "PASS 2/2 completed" in result.stdout, text
        _one_error(result, 1, f"the file system at {report} holding {report}", f"`mbx report {NAME}` writes it",
                   "free space there")  # fmt: skip
        assert not list((report / "assets").glob(".plotly*")), "a half-copied asset was left behind"
        again = run_mbx("report", NAME, "--workspace", str(workspace))
        _one_error(again, 1, f"the file system at {report}", "the report was not written", "free space there")
    finally:
        subprocess.run(["umount", str(report)], check=False)
