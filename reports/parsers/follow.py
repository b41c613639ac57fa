"""Follow a run's rank logs while they grow: one streaming parser per file, progress from `iteration N/M |`.

follower = LogFollower(run_dir / "logs", "auto")   # a folder: new files are picked up as they appear
follower.update()                                   # read what was appended; True on a new iteration
follower.progress.last_step, follower.progress.planned
rows = follower.finish(world_size)                  # the rest parsed; rows of every file merged by step
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reports.limits import long_line
from reports.parsers import StreamParser, make_parser, merge_rows
from reports.parsers.rows import Row, derive_tokens
from reports.parsers.text import to_int

LOG_SUFFIXES = (".log", ".txt", ".out", ".err", "")
_READ = 8 << 20  # bytes read from a file at a time
_PROGRESS = re.compile(rb"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")


def _natural(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def log_files(folder: Path) -> list[Path]:
    """Text logs under a folder (recursively: torchrun's per-rank folders too), in natural order."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.rglob("*") if p.is_file() and p.suffix in LOG_SUFFIXES]
    return sorted(found, key=_natural)


@dataclass
class _Followed:
    path: Path
    parser: StreamParser
    offset: int = 0
    carry: bytes = b""  # the partial last line, for the progress scan
    digest: Any = None
    refused: bool = False  # a line past limits.MAX_LOG_LINE_CHARS: read no further, `finish` refuses the file


@dataclass
class Progress:
    """How far a run is, from its `iteration N/M |` lines."""

    last_step: int | None = None
    planned: int | None = None
    changed_at: float = field(default_factory=time.time)


class LogFollower:
    """Parses a run's logs incrementally as they grow (one streaming parser per file, nothing re-read).

    `update()` reads what was appended since the last call (and picks up new files of a followed
    folder); `finish()` parses the rest and returns the rows of every file merged by step. The
    parsers hold every row (`lag=None`), so the result equals parsing the finished files at once.
    """

    def __init__(
        self,
        sources: Path | list[Path],
        log_format: str = "auto",
        *,
        seq_length: int | None = None,
        num_gpus: int | None = None,
        hashing: bool = False,
    ):
        self.folder = Path(sources) if isinstance(sources, (str, os.PathLike)) else None
        self.fixed = None if self.folder is not None else [Path(p) for p in sources]  # type: ignore[union-attr]
        self.log_format = log_format
        self.seq_length = seq_length
        self.num_gpus = num_gpus
        self.hashing = hashing
        self.files: dict[Path, _Followed] = {}
        self.progress = Progress()
        self._finished: list[Row] | None = None

    def _paths(self) -> list[Path]:
        return log_files(self.folder) if self.folder is not None else list(self.fixed or [])

    def update(self) -> bool:
        """Read what the logs gained; True when a new iteration line was seen."""
        before = self.progress.last_step
        for path in self._paths():
            followed = self.files.get(path)
            if followed is None:
                parser = make_parser(
                    self.log_format,  # type: ignore[arg-type]
                    lag=None,
                    seq_length=self.seq_length,
                    num_gpus=self.num_gpus,
                )
                followed = self.files[path] = _Followed(
                    path, parser, digest=hashlib.sha256() if self.hashing else None
                )
            self._read(followed)
        if self.progress.last_step != before:
            self.progress.changed_at = time.time()
            return True
        return False

    def _read(self, followed: _Followed) -> None:
        if followed.refused:
            return
        try:
            handle = open(followed.path, "rb")  # noqa: SIM115 - closed below
        except OSError:
            return
        with handle:
            handle.seek(followed.offset)
            while chunk := handle.read(_READ):
                followed.offset += len(chunk)
                if followed.digest is not None:
                    followed.digest.update(chunk)
                followed.parser.feed(chunk)
                if followed.parser.overlong:
                    followed.refused = True
                    return
                self._scan_progress(followed, chunk)

    def _scan_progress(self, followed: _Followed, chunk: bytes) -> None:
        data = followed.carry + chunk
        cut = data.rfind(b"\n") + 1
        followed.carry = data[cut:][-4096:]
        last = None
        for m in _PROGRESS.finditer(data, 0, cut):
            last = m
        if last is not None:
            step, total = int(last.group(1)), int(last.group(2))
            p = self.progress
            p.last_step = step if p.last_step is None else max(p.last_step, step)
            p.planned = total if p.planned is None else max(p.planned, total)

    def digests(self) -> dict[str, str]:
        return {str(f.path): f.digest.hexdigest() for f in self.files.values() if f.digest is not None}

    def finish(self, world_size: int | None = None) -> list[Row]:
        """Every file parsed to its end; rows merged by step, tokens/s derived where the inputs are known.
        LimitError (a ValueError) for a file with a line past limits.MAX_LOG_LINE_CHARS."""
        if self._finished is not None:
            return self._finished
        self.update()
        refused = [f.path for f in self.files.values() if f.refused]
        if refused:
            raise long_line(refused[0])
        row_lists: list[list[Row]] = []
        args: dict[str, str] = {}
        for followed in self.files.values():
            row_lists.append(followed.parser.close())
            args.update(followed.parser.args)
            if followed.carry:
                self._scan_progress(followed, b"\n")
        rows = merge_rows(row_lists)
        seq = self.seq_length or to_int(args.get("seq_length"))
        gpus = self.num_gpus or to_int(args.get("world_size")) or world_size
        for row in rows:
            derive_tokens(row, seq, gpus)
        self._finished = rows
        return rows




def logged_last_step(rows: list[Row]) -> int | None:
    """The last step with a timing or a loss (a step row with neither is not a training iteration)."""
    steps = [r["step"] for r in rows if r.get("step_time_ms") is not None or r.get("loss") is not None]
    return max(steps) if steps else None
