"""A full disk said in one line: which file system, how full, what to free (the locks, the run store, rebuild)."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from orchestrator.errors import RunError

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
SQLITE_FULL = 13  # primary result code: "database or disk is full"
SQLITE_IOERR = 10  # "disk I/O error": what a WAL store gives when it cannot make its -shm file on a full disk
NEARLY_FULL_BYTES = 1 << 20  # less free space than this, for the user writing, is a full disk


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding `path` (its nearest existing ancestor's)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    device = path.stat().st_dev
    while path != path.parent and path.parent.stat().st_dev == device:
        path = path.parent
    return path


def nearly_full(path: Path) -> bool:
    """Whether the file system holding `path` has (almost) no room left for this user: bytes or inodes."""
    try:
        found = os.statvfs(mount_point(path))
    except OSError:
        return False
    return found.f_bavail * found.f_frsize < NEARLY_FULL_BYTES or (found.f_files > 0 and found.f_favail == 0)


def is_full(err: BaseException, path: Path) -> bool:
    """Whether `err` says the disk holding `path` is full: ENOSPC/EDQUOT, SQLite's FULL, or an I/O error of a
    store on a file system with no room left."""
    if isinstance(err, OSError) and err.errno in FULL_ERRNOS:
        return True
    if isinstance(err, sqlite3.Error):
        code = getattr(err, "sqlite_errorcode", 0) & 0xFF
        return code == SQLITE_FULL or (code == SQLITE_IOERR and nearly_full(path))
    return False


def full_disk_error(
    path: Path, doing: str, again: str = "run the command again", elsewhere: str = "--workspace"
) -> RunError:
    """`the file system at /x holding /x/ws/.lock is full (12 KiB free of 8 MiB): mbx could not take the lock; free
    space there ... then run the command again` (`again`: what to do once there is room; `elsewhere`: the option
    that puts the files on another disk)."""
    from reports.limits import size_text

    mount = mount_point(path)
    try:
        found = os.statvfs(mount)
        room = f" ({size_text(found.f_bavail * found.f_frsize)} free of {size_text(found.f_blocks * found.f_frsize)})"
    except OSError:
        room = ""
    return RunError(f"the file system at {mount} holding {path} is full{room} (ENOSPC): {doing}; free space there "
                    "(old attempts' checkpoint/ folders, profile traces, report sites, wandb/ runs, other files) or "
                    f"use a {elsewhere} on another disk, then {again}")  # fmt: skip


class DiskFull(RunError):
    """The disk holding `path` is full: the one line of `full_disk_error`."""

    def __init__(
        self, path: Path, doing: str, again: str = "run the command again", elsewhere: str = "--workspace"
    ):
        self.path = Path(path)
        super().__init__(str(full_disk_error(self.path, doing, again, elsewhere)))
