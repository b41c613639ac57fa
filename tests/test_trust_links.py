"""Whole or nothing, and never through a link (issue 32): `freeze -o` checks every target before it writes any
(one symbolic link among them wrote 2 of the 4 files before refusing), and a symbolic link where mbx writes a
campaign (its folder, a cell's, an attempt's, the report's) is refused naming it: nothing is written through it
into the folder it points to."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import FAKE_MEGATRON, MEGATRON_LOG, run_mbx


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(workspace, campaign file) after one completed command-trainer campaign."""
    root = tmp_path_factory.mktemp("links")
    campaign = root / "c.yaml"
    campaign.write_text(yaml.safe_dump({
        "name": "ln",
        "trainer": {"kind": "command", "log_format": "megatron-lm",
                    "command": ["python", str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0"]},
        "sweep": {"axes": {"params.seed": [1, 2]}},
    }))  # fmt: skip
    workspace = root / "ws"
    result = run_mbx("campaign", "run", str(campaign), "-w", str(workspace), "--no-wandb", "--no-report")
    assert result.returncode == 0, result.stderr[-2000:]
    return workspace, campaign


def test_freeze_checks_every_target_before_writing_any(done, tmp_path):
    workspace, _ = done
    out = tmp_path / "frozen"
    out.mkdir()
    (tmp_path / "elsewhere").write_text("keep")
    (out / "frozen.json").symlink_to(tmp_path / "elsewhere")  # the last file freeze writes
    cell = next(p.name for p in (workspace / "ln").iterdir() if p.name.endswith("-r0"))
    result = run_mbx("freeze", "ln", "-w", str(workspace), "-o", str(out), "--point", cell)
    assert result.returncode == 2 and "frozen.json: is a symbolic link" in result.stderr, result.stderr
    assert "--follow-symlinks" not in result.stderr  # only golden export has that option
    assert sorted(p.name for p in out.iterdir()) == ["frozen.json"], "nothing written beside the link"
    assert (tmp_path / "elsewhere").read_text() == "keep"


def test_a_linked_cell_folder_is_refused_and_not_written_through(done, tmp_path):
    workspace, campaign = done
    cell = next(p for p in (workspace / "ln").iterdir() if p.name.endswith("-r0"))
    target = tmp_path / "target"
    cell.rename(target)
    cell.symlink_to(target)
    try:
        before = sorted(p.name for p in target.iterdir())
        for args in (("campaign", "run", str(campaign)), ("campaign", "resume", "ln"), ("report", "ln")):
            result = run_mbx(*args, "-w", str(workspace), "--no-wandb" if args[0] == "campaign" else "-m")
            assert result.returncode == 2, (args, result.stderr[-2000:])
            assert (
                f"{cell}: a symbolic link (to {target})" in result.stderr and "Traceback" not in result.stderr
            )
        assert sorted(p.name for p in target.iterdir()) == before
    finally:
        cell.unlink()
        target.rename(cell)


def test_a_linked_report_folder_is_refused(done, tmp_path):
    workspace, _ = done
    report = workspace / "ln" / "report"
    (tmp_path / "site").mkdir()
    report.symlink_to(tmp_path / "site")
    try:
        result = run_mbx("report", "ln", "-w", str(workspace))
        assert result.returncode == 2 and f"{report}: a symbolic link" in result.stderr, result.stderr[-2000:]
        assert list((tmp_path / "site").iterdir()) == []
        # the advice was "give --workspace the folder it points to" (a report folder is no workspace)
        assert (
            f"`mbx report ln --out {tmp_path / 'site'}`" in result.stderr
            and "--workspace" not in result.stderr
        )
    finally:
        report.unlink()


@pytest.mark.parametrize("entry", ["mbx.sqlite", "wandb"])
def test_a_linked_store_or_wandb_folder_is_refused_and_not_written_through(done, tmp_path, entry):
    """The run store and W&B's offline runs were written through a link silently (the store grew elsewhere, the
    runs landed in the link's target); they are refused as a linked campaign folder is, naming what to do."""
    workspace, campaign = done
    place = workspace / entry
    target = tmp_path / "elsewhere"
    if place.exists():
        place.rename(target)
    else:
        target.mkdir()
    place.symlink_to(target)
    try:
        before = (
            target.stat().st_mtime_ns,
            sorted(p.name for p in target.iterdir()) if target.is_dir() else [],
        )
        for args in (("campaign", "run", str(campaign)), ("campaign", "resume", "ln"), ("store", "rebuild")):
            result = run_mbx(*args, "-w", str(workspace))
            assert result.returncode == 2, (args, result.stderr[-2000:])
            where = (
                "the workspace's run store"
                if entry == "mbx.sqlite"
                else "W&B's offline runs of the workspace"
            )
            assert f"{place}: a symbolic link (to {target}) where mbx keeps {where};" in result.stderr, (
                result.stderr
            )
            assert "move the link away" in result.stderr and "Traceback" not in result.stderr
        after = target.stat().st_mtime_ns, sorted(p.name for p in target.iterdir()) if target.is_dir() else []
        assert after == before
    finally:
        place.unlink()
        if entry == "mbx.sqlite":
            target.rename(place)


@pytest.mark.parametrize("where", ["campaign", "workspace"])
def test_a_linked_lock_file_is_refused_and_not_written_through(done, tmp_path, where):
    """A `.lock` that is a symbolic link was opened and signed through it: `campaign run` wrote "mbx pid N" into
    the campaign lock's target, `store rebuild` into the workspace lock's. Both locks are refused naming the link,
    by `run`, `resume`, `store rebuild` and `ingest` alike, and the file it points to is left as it was."""
    workspace, campaign = done
    lock = workspace / ("ln" if where == "campaign" else "") / ".lock"
    precious = tmp_path / "precious.txt"
    precious.write_text("PRECIOUS")
    lock.unlink(missing_ok=True)
    lock.symlink_to(precious)
    try:
        for args in (("campaign", "run", str(campaign), "--no-wandb"), ("campaign", "resume", "ln", "--no-wandb"),
                     ("store", "rebuild"), ("ingest", "ln", str(MEGATRON_LOG))):  # fmt: skip
            result = run_mbx(*args, "-w", str(workspace))
            assert result.returncode == 2, (args, result.stderr[-2000:])
            assert f"{lock}: a symbolic link (to {precious}) where mbx keeps the " in result.stderr, args
            assert "remove the link" in result.stderr and "Traceback" not in result.stderr
            assert precious.read_text() == "PRECIOUS", args
    finally:
        lock.unlink()


def test_a_lock_linked_after_the_checks_is_refused_at_open(tmp_path):
    """The lock is opened with O_NOFOLLOW: a link made between the folder checks and the open is refused too."""
    from orchestrator.errors import UsageError
    from orchestrator.run.lock import _flock

    (tmp_path / "camp").mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("PRECIOUS")
    (tmp_path / "camp" / ".lock").symlink_to(precious)
    with pytest.raises(UsageError, match="keeps the campaign's lock"):
        _flock(tmp_path / "camp" / ".lock", 0, "camp")
    (tmp_path / ".lock").symlink_to(tmp_path / "dangling")
    with pytest.raises(UsageError, match="keeps the workspace's lock"):
        _flock(tmp_path / ".lock", 0)
    assert precious.read_text() == "PRECIOUS" and not (tmp_path / "dangling").exists()


def test_a_linked_store_is_refused_by_readers_too(done, tmp_path):
    """`campaign list` and `status` read a linked mbx.sqlite (and left its -shm/-wal beside the target) while
    `report -m` refused it: reading through a link is still a link, refused alike."""
    workspace, _ = done
    place = workspace / "mbx.sqlite"
    target = tmp_path / "other.sqlite"
    place.rename(target)
    place.symlink_to(target)
    try:
        for args in (("campaign", "list"), ("campaign", "status", "ln"), ("report", "ln", "-m")):
            result = run_mbx(*args, "-w", str(workspace))
            assert result.returncode == 2, (args, result.stdout[-1500:], result.stderr[-1500:])
            assert f"{place}: a symbolic link (to {target}) where mbx keeps the workspace's run store" in (
                result.stderr
            ), (args, result.stderr)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["other.sqlite"]
    finally:
        place.unlink()
        target.rename(place)


def test_readers_leave_no_wal_files(done):
    """A read-only connection made mbx.sqlite-shm and -wal and could not remove them: every `campaign list` left
    them in the workspace."""
    workspace, _ = done
    for args in (("campaign", "list"), ("campaign", "status", "ln"), ("report", "ln", "-m")):
        result = run_mbx(*args, "-w", str(workspace))
        assert result.returncode == 0, (args, result.stderr[-1500:])
        assert not [p.name for p in workspace.iterdir() if p.name.startswith("mbx.sqlite-")], args


@pytest.mark.parametrize("page", ["index.html", "summary.md", "cells"])
def test_a_linked_page_of_the_report_is_refused_not_replaced(done, tmp_path, page):
    """`report` replaced a linked report/index.html or summary.md with a file, silently (the target untouched,
    the link gone); a link among the report's files is refused as its folder is."""
    workspace, _ = done
    report = workspace / "ln" / "report"
    assert run_mbx("report", "ln", "-w", str(workspace)).returncode == 0
    place = next((report / "cells").iterdir()) if page == "cells" else report / page
    target = tmp_path / "mine"
    target.write_text("MINE")
    place.unlink()
    place.symlink_to(target)
    try:
        result = run_mbx("report", "ln", "-w", str(workspace))
        assert result.returncode == 2, result.stderr[-1500:]
        assert (
            f"{place}: a symbolic link (to {target}) where mbx writes the campaign's report;" in result.stderr
        )
        assert "`mbx report ln --out DIR`" in result.stderr and "Traceback" not in result.stderr
        assert place.is_symlink() and target.read_text() == "MINE"
    finally:
        place.unlink()
