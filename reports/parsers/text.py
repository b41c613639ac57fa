"""Low-level text helpers for log lines: ANSI colours, launcher rank labels, numbers and "key: value |" fields."""

from __future__ import annotations

import re
from collections.abc import Iterator

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")

# Launcher prefixes put in front of every line of a rank: `srun -l` ("3: ", " 3: ", "> 3: " when quoted),
# torch elastic ("[rank3]:", "[default3]:"), NeMo-Run/Slurm ("<job>/3 ").
LABEL_RE = re.compile(r"^(?:\s*>?\s*\d+: |\[rank\d+\]: ?|\[default\d+\]: ?|[\w.\-]+/\d+ (?=\S))+")

# A line that begins a new message, so it can't be the wrapped tail of the previous one.
_START_RE = re.compile(
    r"^\s*(?:\[\d{4}-\d\d-\d\d[ T]|\[Rank \d+\]|\[rank\d+\]|\[default\d+\]|\[after |\[before |INFO|WARNING|ERROR"
    r"|DEBUG|Traceback|Step Time|iteration\s+\d|validation|test loss|> |-{8}|\S+\.py:\d+: |\w*(?:Error|Warning):)"
)
_MARKERS = ("iteration", "memory (", "Step Time :", "loss at ")
_RECORD_RE = re.compile(
    r"iteration\s+\d+\s*/\s*\d+|\(after \d+ iterations\) memory|Step Time :|loss at iteration"
)


def strip_ansi(line: str) -> str:
    """`line` without ANSI colour/cursor escape sequences."""
    return ANSI_RE.sub("", line) if "\x1b" in line else line


def split_label(line: str) -> tuple[str, str]:
    """(launcher label, rest of the line); the label is "" when the line has none."""
    m = LABEL_RE.match(line)
    if m is None:
        return "", line
    return m.group(0).strip(), line[m.end() :]


def starts_record(line: str) -> bool:
    """True when `line` opens a message of its own (timestamp, rank tag, logger level, warning,
    iteration/memory/step-time marker): a terminal-wrapped tail never does."""
    if not line.strip():
        return True
    _, rest = split_label(line)
    if _START_RE.match(rest):
        return True
    return any(marker in rest for marker in _MARKERS) and _RECORD_RE.search(rest) is not None


def to_number(text: str) -> float | int | None:
    """An int or float written by Megatron (also `nan`, `NaN`, `inf`, `-inf`, `Infinity`), else None."""
    text = text.strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def to_float(text: str) -> float | None:
    """A float (nan/inf spellings included), else None."""
    try:
        return float(text)
    except ValueError:
        return None


def squash(key: str) -> str:
    """A field name without spaces and case, to recognise keys whose spaces a terminal wrap ate."""
    return key.replace(" ", "").lower()


def to_int(text: str | None) -> int | None:
    """An integer written as text (an argument dump's value), or None."""
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def key_values(body: str, complete: bool = True) -> Iterator[tuple[str, str]]:
    """The `key: value` fields of a `|`-separated record; `complete=False` drops the last field, which may
    have been cut short."""
    fields = body.split("|")
    if not complete:
        fields = fields[:-1]
    for field in fields:
        key, sep, value = field.partition(":")
        if sep:
            yield key, value
