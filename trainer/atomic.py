"""Whole-or-nothing file writes: a unique temporary file beside the target, renamed over it (the one implementation).

A reader sees the old file or the new one, never half of one; a failure at any point (a full disk, a quota, a
signal) removes the temporary file and leaves the target as it was. The temporary file is created like any new
file (mode 0o666 less the umask: a colleague may read a run dir or a report page), with O_EXCL under a random
name, so concurrent writers of one target never share it. Standard library only: the trainer imports this before
torch, node-side launcher code and the login side (reports, orchestrator) import it too.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


_TEMP_NAME = re.compile(r"^\.(.+)\.[0-9a-f]{8}\.tmp$")


def destination(path: str | os.PathLike[str]) -> Path:
    """The file a temporary `.<name>.<random>.tmp` stands for (an error names the temporary file: messages name
    this one); any other path as it is."""
    path = Path(path)
    found = _TEMP_NAME.match(path.name)
    return path.with_name(found.group(1)) if found else path


def _create_temp(path: Path) -> tuple[int, Path]:
    """(fd, path) of a new empty file next to `path`, named `.<name>.<random>.tmp` (the name cut to fit NAME_MAX)."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name[:200]}.{os.urandom(4).hex()}.tmp")
        try:
            return os.open(tmp, _FLAGS, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{path}: no free temporary name beside it")


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, binary: bool = False, errors: str = "strict",
              fsync: bool = False) -> Iterator[IO[Any]]:
    """A handle on a new temporary file beside `path`; when the block ends without an exception the file is
    closed (flushed, fsynced if asked) and renamed over `path`; on any exception it is removed, `path` untouched."""
    path = Path(path)
    fd, tmp = _create_temp(path)
    try:
        handle = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", errors=errors)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    try:
        with handle:
            yield handle
            handle.flush()  # a full disk surfaces here at the latest, before the rename
            if fsync:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike[str], text: str, *, errors: str = "strict", fsync: bool = False) -> None:
    """`text` (UTF-8) into `path`, whole or not at all; `errors` as for str.encode ("replace": lone surrogates)."""
    with replacing(path, errors=errors, fsync=fsync) as handle:
        handle.write(text)


def copy_file(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """shutil.copy2 (contents, mode and times) of `source` onto `target`, whole or not at all."""
    target = Path(target)
    fd, tmp = _create_temp(target)
    os.close(fd)
    try:
        shutil.copy2(source, tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
