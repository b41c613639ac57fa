"""Writing a file the user named (`--out`): atomically, only over a regular file, with a clean UsageError when
the path cannot take it.

`check_target` is the rule every user-named output follows: the path is absent or a regular file. A device
(/dev/full, /dev/null), a FIFO, a socket or a directory is refused and left as it is; a symbolic link is
refused unless the caller lets it be followed (then its target must itself be absent or a regular file, and
the target is written, the link kept). A missing or unwritable folder is one line, exit 2, and no temporary
file is left behind; a full disk is one line naming the file system, exit 1 (orchestrator/run/disk.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.run.disk import DiskFull, is_full
from trainer import atomic

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_target(out: Path, label: str = "--out", follow_symlinks: bool | None = None) -> Path:
    """The path to write for `out` (its target when a followed link); UsageError for anything but an absent
    path or a regular file, for a link not to be followed, and for a missing parent folder. `follow_symlinks`
    None: the command has no --follow-symlinks (a link is refused, and no such option is suggested)."""
    out = Path(out)
    try:
        info = os.lstat(out)
    except FileNotFoundError:
        info = None
    except OSError as err:  # ENOTDIR (a parent is a file), ENAMETOOLONG, EACCES
        raise UsageError(f"{label} {out}: cannot be written ({err.strerror or err})") from None
    except ValueError as err:  # a NUL byte in the path
        raise UsageError(f"{label} {out}: not a usable path ({err})") from None
    if info is not None and stat.S_ISLNK(info.st_mode):
        if not follow_symlinks:
            option = "" if follow_symlinks is None else ", or --follow-symlinks to write the file it points to"
            raise UsageError(f"{label} {out}: is a symbolic link; mbx does not replace links (give the target's "
                             f"path{option})")  # fmt: skip
        target = Path(os.path.realpath(out))
        if target == out or os.path.islink(target):
            raise UsageError(f"{label} {out}: the symbolic link does not resolve (a loop): give another path")
        return check_target(target, label, follow_symlinks=False)
    if info is not None and not stat.S_ISREG(info.st_mode):
        what = "is a directory, give a file name" if stat.S_ISDIR(info.st_mode) else f"is {_kind(info.st_mode)}"
        raise UsageError(f"{label} {out}: {what}; mbx writes only regular files and leaves this one as it is")
    parent = out.parent
    if not parent.is_dir():
        problem = "does not exist" if not parent.exists() else "is not a directory"
        raise UsageError(
            f"{label} {out}: cannot be written: the folder {parent} {problem} (create it first or give another path)"
        )
    return out


def write_out(out: Path, text: str, label: str = "--out", follow_symlinks: bool | None = None) -> None:
    """Write `text` to `out` whole or not at all (trainer.atomic), after `check_target`; an unwritable path →
    UsageError naming `label` and the path (nothing half-written is left)."""
    target = check_target(Path(out), label, follow_symlinks)
    try:
        with atomic.replacing(target) as handle:
            handle.write(text)
            handle.flush()
            check_target(target, label)  # replaced by a device or link meanwhile: refuse still
    except OSError as err:
        if is_full(err, target):  # no bad input: exit 1, the file system named
            done = f"{label} {out} was not written (nothing half-written is left)"
            raise DiskFull(out, done, elsewhere=label) from None
        raise UsageError(f"{label} {out}: cannot be written ({err.strerror or err})") from None
