"""User-named outputs (issue 21): `--out` never replaces a device, FIFO, socket, directory or symbolic link, and a
missing or unwritable place is one clean line, exit 2, with nothing (no temporary file) left behind."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.run.outfile import write_out


def assert_refused(result, *needles: str) -> None:
    """Exit 2, no traceback, one `error:` line holding every needle."""
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])


def golden_export(mbx, tmp_path: Path, out: Path, *extra: str):
    # The target is checked before the store is read: no campaign is needed to be refused.
    return mbx("golden", "export", "nocampaign", "--point", "abc", "-o", str(out), "-w", str(tmp_path / "ws"), *extra)


def test_golden_export_refuses_a_fifo_and_leaves_it(mbx, tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    assert_refused(golden_export(mbx, tmp_path, fifo), str(fifo), "is a FIFO (named pipe)", "leaves this one")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.json"]  # no temporary file, no workspace


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_golden_export_refuses_a_device(mbx, tmp_path):
    assert_refused(golden_export(mbx, tmp_path, Path("/dev/null")), "/dev/null: is a character device")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)  # the old code renamed a regular file over it


def test_golden_export_refuses_a_symlink_and_its_target_is_untouched(mbx, tmp_path):
    target = tmp_path / "real.json"
    target.write_text("keep me\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert_refused(golden_export(mbx, tmp_path, link), "is a symbolic link", "--follow-symlinks")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "keep me\n"


def test_golden_export_into_a_missing_folder(mbx, tmp_path):
    out = tmp_path / "missing" / "x.json"
    assert_refused(golden_export(mbx, tmp_path, out), f"the folder {out.parent} does not exist")
    assert not out.parent.exists()


def test_golden_export_refuses_a_directory(mbx, tmp_path):
    assert_refused(golden_export(mbx, tmp_path, tmp_path), "is a directory, give a file name")


def test_freeze_out_under_a_file_is_a_clean_error(mbx, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker / "sub" / "x.json"
    result = mbx("freeze", "nocampaign", "-o", str(out), "-w", str(tmp_path / "ws"))
    assert_refused(result, f"--out {out}", "is not a directory")
    assert blocker.read_text() == "x"


def test_report_out_that_is_a_file_is_refused(mbx, tmp_path):
    out = tmp_path / "site"
    out.write_text("not a folder")
    assert_refused(mbx("report", "nocampaign", "-o", str(out), "-w", str(tmp_path / "ws")), "is not a directory")
    assert out.read_text() == "not a folder"


def test_write_out_follows_a_link_only_when_asked(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(UsageError, match="is a symbolic link") as refused:
        write_out(link, "new\n")  # freeze -o, card export -o: no --follow-symlinks to suggest
    assert "--follow-symlinks" not in str(refused.value)
    with pytest.raises(UsageError, match="or --follow-symlinks to write the file"):
        write_out(link, "new\n", follow_symlinks=False)  # golden export: the option is there
    assert target.read_text() == "old\n"
    write_out(link, "new\n", follow_symlinks=True)
    assert link.is_symlink() and target.read_text() == "new\n"  # the link kept, its target written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def test_write_out_follows_a_link_only_to_a_regular_file(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    link.symlink_to(fifo)
    with pytest.raises(UsageError, match="is a FIFO"):
        write_out(link, "x", follow_symlinks=True)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_write_out_refuses_a_socket(tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(UsageError, match="is a socket"):
            write_out(path, "x")
        assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_write_out_replaces_a_regular_file_atomically(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("old")
    write_out(out, "new")
    assert out.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_write_out_to_an_unwritable_place_leaves_nothing(tmp_path):
    with pytest.raises(UsageError, match="cannot be written"):
        write_out(Path("/proc/mbx-trust-test.json"), "x")
    assert not Path("/proc/mbx-trust-test.json").exists()
