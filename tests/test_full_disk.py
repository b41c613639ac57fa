"""A full disk is a clear error, never an internal one (issue 32): on a workspace whose small tmpfs is full, the
commands that only read (status, list, freeze -o elsewhere, golden export, regate without changes with --no-report
--no-wandb) work from the store opened read-only; those that must write (run, store rebuild, regate's report, the
report's page) end with one line naming the file system, how full it is and what to free; once space is freed the
store is whole. And a refused lock names the process that holds it now, never the pid of a run that ended long ago."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import FAKE_MEGATRON, MEGATRON_LOG, ROOT, run_mbx, wait_for
from test_faults import fill, small_disk

from orchestrator.errors import RunError
from orchestrator.run.lock import LOCK_FILE, CampaignLock


def _one_line(result: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 1, no traceback, one `error:` line holding every needle."""
    assert result.returncode == 1, (result.returncode, result.stdout[-1500:], result.stderr[-1500:])
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr[-1500:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-1500:]
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """(workspace on a full tmpfs, the campaign file, a folder elsewhere) after one completed campaign."""
    root = tmp_path_factory.mktemp("fulldisk")
    campaign = root / "c.yaml"
    campaign.write_text(yaml.safe_dump({
        "name": "fd",
        "trainer": {"kind": "command", "log_format": "megatron-lm",
                    "command": ["python", str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0"]},
    }))  # fmt: skip
    with small_disk(root / "disk") as disk:
        workspace = disk / "ws"
        done = run_mbx("campaign", "run", str(campaign), "-w", str(workspace), "--no-wandb", "--no-report")
        assert done.returncode == 0, done.stderr[-2000:]
        filler = fill(disk)
        yield workspace, campaign, root
        filler.unlink()


def test_reading_commands_work_on_a_full_disk(full):
    workspace, _, root = full
    cell = next(p.name for p in (workspace / "fd").iterdir() if p.name.endswith("-r0"))
    for args in (["campaign", "status", "fd"], ["campaign", "list"],
                 ["campaign", "regate", "fd", "--no-report", "--no-wandb"],
                 ["golden", "export", "fd", "--point", cell], ["freeze", "fd", "-o", str(root / "frozen")]):  # fmt: skip
        result = run_mbx(*args, "-w", str(workspace))
        assert result.returncode == 0, (args, result.stderr[-2000:])
    assert (root / "frozen" / "FROZEN.md").is_file()


def test_writing_commands_say_the_disk_is_full_in_one_line(full):
    workspace, campaign, _ = full
    mount = str(workspace.parent)
    _one_line(run_mbx("campaign", "run", str(campaign), "-w", str(workspace), "--no-wandb"),
              f"the file system at {mount}", "is full", "free space there")  # fmt: skip
    _one_line(run_mbx("store", "rebuild", "-w", str(workspace)), f"the file system at {mount}", "is full")
    regate = run_mbx("campaign", "regate", "fd", "-w", str(workspace), "--no-wandb")  # it writes the report
    _one_line(regate, f"the file system at {mount}", "the report (`mbx report fd` writes it) was not written")
    assert "PASS" in regate.stdout, regate.stdout[-1500:]  # the closing line first: every verdict stands
    report = run_mbx(
        "report", "fd", "-m", "-w", str(workspace)
    )  # the summary still printed, the page said unwritten
    _one_line(report, f"the file system at {mount}", "the report was not written", "free space there")
    assert report.stdout.startswith("## mbx campaign `fd`"), report.stdout[:500]
    db = sqlite3.connect(
        f"file:{workspace / 'mbx.sqlite'}?mode=ro&immutable=1", uri=True
    )  # no -shm on a full disk
    try:
        assert list(db.execute("PRAGMA integrity_check")) == [("ok",)]
        assert [state for (state,) in db.execute("SELECT state FROM attempts")] == ["completed"]
    finally:
        db.close()


def test_resume_on_a_full_disk_is_one_line_without_wandb_tracebacks(full):
    """wandb's own log handlers failed per record ("--- Logging error ---", 20 tracebacks, 1,199 stderr lines)
    and the resume exited 0 with two warnings; now the verdicts, then one line naming the file system, exit 1."""
    workspace, _, _ = full
    result = run_mbx("campaign", "resume", "fd", "-w", str(workspace), env={"WANDB_MODE": "offline"})
    assert "Logging error" not in result.stderr and "warning:" not in result.stderr, result.stderr[-3000:]
    _one_line(result, f"the file system at {workspace.parent}", "the report (`mbx report fd` writes it) and the "
              "W&B outcome run were not written (every result is stored)")  # fmt: skip
    assert "PASS" in result.stdout, result.stdout[-1500:]


def test_freeze_and_golden_export_on_a_full_disk_exit_1_and_leave_nothing(full):
    """Exit 2 (bad input) before, naming a temporary `.campaign.yaml.check-<pid>`, and an empty folder left."""
    workspace, _, _ = full
    mount = str(workspace.parent)
    cell = next(p.name for p in (workspace / "fd").iterdir() if p.name.endswith("-r0"))
    frozen = workspace.parent / "frozen"
    result = run_mbx(
        "freeze", "fd", "--point", cell.removesuffix("-r0"), "-o", str(frozen), "-w", str(workspace)
    )
    _one_line(result, f"the file system at {mount} holding {frozen} is full", "mbx freeze wrote nothing",
              "--out on another disk")  # fmt: skip
    assert ".check-" not in result.stderr and not frozen.exists()
    out = workspace.parent / "golden.json"
    result = run_mbx("golden", "export", "fd", "--point", cell, "-o", str(out), "-w", str(workspace))
    _one_line(result, f"the file system at {mount} holding {out} is full", f"--out {out} was not written")
    assert not out.exists() and not [p for p in workspace.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_report_cut_short_by_the_disk_names_the_file_it_was_writing(full):
    """With 600 KB free the page's assets do not fit: the line named plotly.min.js's source in mbx's package."""
    workspace, _, _ = full
    disk = workspace.parent
    (disk / "filler").unlink()
    room = os.statvfs(disk)
    (disk / "filler").write_bytes(b"\0" * (room.f_bavail * room.f_frsize - 600 * 1024))
    try:
        result = run_mbx("report", "fd", "-o", str(disk / "site"), "-w", str(workspace))
        _one_line(result, f"the file system at {disk} holding {disk / 'site'}", "the report was not written")
        assert str(ROOT) not in result.stderr and ".tmp" not in result.stderr, result.stderr
    finally:
        (disk / "filler").unlink()
        shutil.rmtree(disk / "site", ignore_errors=True)
        fill(disk)


def test_a_full_disk_leaves_no_folder_behind(full):
    """`report --out` left empty assets/ and cells/, `compare --html` its folder, and a new campaign's `run` or
    `ingest` its folder holding a .lock; compare's line named neither the file system nor what to free."""
    workspace, campaign, root = full
    disk = workspace.parent
    def files() -> list[str]:  # not the store's -shm/-wal: a reader cannot remove them with no room left
        return sorted(str(p.relative_to(disk)) for p in disk.rglob("*") if not p.name.endswith(("-shm", "-wal")))

    before = files()
    _one_line(run_mbx("report", "fd", "-w", str(workspace), "--out", str(disk / "rep" / "site")),
              f"the file system at {disk} holding {disk / 'rep'}", "the report was not written")  # fmt: skip
    _one_line(run_mbx("compare", "fd", "fd", "-w", str(workspace), "--html", str(disk / "cmp")),
              f"the file system at {disk} holding {disk / 'cmp'} is full", "the comparison page was not written",
              "free space there", "--html on another disk")  # fmt: skip
    other = root / "fd2.yaml"
    other.write_text(campaign.read_text().replace("name: fd", "name: fd2"))
    _one_line(run_mbx("campaign", "run", str(other), "-w", str(workspace), "--no-wandb"),
              f"the file system at {disk}", "is full")  # fmt: skip
    _one_line(run_mbx("ingest", "ing1", str(MEGATRON_LOG), "-w", str(workspace)), f"the file system at {disk}")
    after = files()
    assert after == before, set(after) ^ set(before)


HOLD_WORKSPACE = """
import sys, time
from orchestrator.run.lock import WorkspaceLock
with WorkspaceLock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_refused_lock_names_the_rebuild_that_holds_it_not_an_ended_run(tmp_path):
    """The campaign's lock file still names the run that ended (`mbx pid 999999`); a store rebuild holds it now.
    A run refused during the rebuild names the rebuild's live process."""
    workspace = tmp_path / "ws"
    (workspace / "camp").mkdir(parents=True)
    (workspace / "camp" / LOCK_FILE).write_text("mbx pid 999999")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_WORKSPACE, str(workspace)], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        wait_for(lambda: holder.stdout.readline().strip() == "held", "the rebuild's lock", holder)
        with pytest.raises(RunError) as refused:
            with CampaignLock(workspace / "camp"):
                pass
        assert f"pid {holder.pid}" in str(refused.value) and "999999" not in str(refused.value), refused.value
        assert "mbx store rebuild" in str(refused.value)
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=30)
