"""Directories mbx creates and may delete: a marker file inside proves ownership; removal is checked first.

Every `shutil.rmtree` of the login side goes through `remove_owned_dir`, which removes a directory only when

- it is not a symbolic link, and its resolved path lies strictly inside the resolved `root` its owner names
  (so `..`, an absolute path or a link out of the tree can never point the removal elsewhere), and
- it holds the marker `make_owned_dir` wrote (a regular file, not a link),

all checked before anything is removed; otherwise `NotOwned` (exit 1) says which check failed and nothing is
touched. `shutil.rmtree` itself never follows links inside the tree it removes.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

from orchestrator.errors import RunError

OWNED_MARKER = ".mbx-owned"  # written inside every directory mbx may remove


class NotOwned(RunError):
    """A directory mbx was asked to remove is not provably its own (outside its root, a link, no marker)."""


def make_owned_dir(path: Path) -> Path:
    """Create `path` (and its parents) with mbx's marker inside; the path. An existing directory is marked too."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    mark_owned(path)
    return path


def mark_owned(path: Path) -> None:
    """Write the marker into a directory mbx has just created by other means (e.g. `git worktree add`)."""
    marker = Path(path) / OWNED_MARKER
    if marker.is_symlink():
        raise NotOwned(f"{path}: its {OWNED_MARKER} is a symbolic link; refusing to use the directory")
    marker.write_text(json.dumps({"owner": "mbx", "pid": os.getpid()}) + "\n")


def is_owned(path: Path) -> bool:
    """Whether `path` is a real directory (not a link) holding mbx's marker as a regular file."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        return stat.S_ISREG(os.lstat(Path(path) / OWNED_MARKER).st_mode)
    except OSError:
        return False


def owned_problem(path: Path, root: Path) -> str | None:
    """Why `path` may not be removed as a directory owned under `root` (None: it may; a missing path may)."""
    root_r = Path(root).resolve()
    if Path(path).is_symlink():
        return f"{path} is a symbolic link (to {os.readlink(path)}); only a real directory is removed"
    resolved = Path(path).resolve()
    if resolved == root_r or root_r not in resolved.parents:
        return f"{path} resolves to {resolved}, which is not inside {root_r}"
    if not os.path.lexists(resolved):
        return None
    if not is_owned(resolved):
        return f"{resolved} has no {OWNED_MARKER} marker (mbx did not create it)"
    return None


def remove_owned_dir(path: Path, *, root: Path) -> None:
    """Remove a directory mbx created under `root`; NotOwned, before anything is removed, when it is not one.
    A path that does not exist (inside `root`) is nothing to remove."""
    problem = owned_problem(path, root)
    if problem:
        raise NotOwned(f"refusing to remove {problem}; remove it by hand if it is really not needed")
    resolved = Path(path).resolve()
    if os.path.lexists(resolved):
        shutil.rmtree(resolved)
