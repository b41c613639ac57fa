"""A full disk said in one line: which file system, how full, what to free (the locks, the run store, rebuild);
and nothing left behind by a command it stopped (the folders it made)."""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
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


class NewFolders:
    """The folders a command is about to make at and under `path` (the missing ones from its highest missing
    ancestor down, and any new one under an existing `path`): `undo()` removes them again, with the files written
    into them, when the command fails; folders that existed before keep everything."""

    def __init__(self, path: Path):
        self.path = Path(path).absolute()
        self.top = self.path
        while not self.top.parent.exists() and self.top.parent != self.top:
            self.top = self.top.parent
        self.existed = {Path(d) for d, _, _ in os.walk(self.path)} if self.path.is_dir() else set()

    def made(self) -> list[Path]:
        """The folders made since, deepest first (none when `path` still does not exist)."""
        root = self.path if self.existed else self.top
        if root.is_symlink() or not root.is_dir():
            return []
        return [Path(d) for d, _, _ in os.walk(root, topdown=False) if Path(d) not in self.existed]

    def undo(self, only: frozenset[str] | None = None) -> None:
        """Remove the new folders and the regular files in them; with `only`, just when every file in them has
        one of those names (a lock file), else leave them all. Never follows a link; what cannot go stays."""
        made = self.made()
        files = [Path(e.path) for d in made for e in os.scandir(d) if not e.is_dir(follow_symlinks=False)]
        if only is not None and any(f.name not in only for f in files):
            return
        for file in files:
            if file.is_file() and not file.is_symlink():
                file.unlink(missing_ok=True)
        for folder in made:
            try:
                folder.rmdir()
            except OSError:  # something else in it: kept
                pass


@contextmanager
def nothing_left_on_error(path: Path) -> Iterator[None]:
    """Run the block; when it fails, remove the folders it made at and under `path` with what it wrote in them
    (a report or comparison site cut short by a full disk leaves no empty `assets/`, `cells/`)."""
    made = NewFolders(path)
    try:
        yield
    except BaseException:
        made.undo()
        raise
