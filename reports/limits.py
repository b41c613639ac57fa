"""The limits on every input mbx reads (one place, cited by README's Reliability section), and bounded readers.

A campaign is a few KB, a golden-values file a few hundred KB, a trace a few hundred MB: the limits sit far
above real inputs and only stop hostile or broken ones, quickly and with the limit named
("x.json.gz: too large (inflates to more than 512 MiB; the limit for a profiler trace)").

Nothing here imports orchestrator (reports/ never does); orchestrator/spec/yamlio.py takes its YAML limits from here.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MiB = 1 << 20

# YAML: campaign, recipe and card files (orchestrator/spec/yamlio.py).
MAX_YAML_BYTES = 4 * MiB  # file size
MAX_YAML_DEPTH = 64  # levels of nesting, counted through aliases
MAX_YAML_VALUES = 100_000  # values (scalars, lists, mappings, aliases) the file spells out
MAX_YAML_ALIAS_VALUES = 100_000  # values aliases may add to what the file spells out

# Sweeps (orchestrator/spec/sweep.py): cells a campaign may name before exclusions (--max-cells raises it).
DEFAULT_MAX_CELLS = 10_000

# JSON documents: golden values, Bridge cards, traces. Python's reader stops near 1,000 levels.
MAX_JSON_DEPTH = 1_000

# Megatron-LM / Megatron-Bridge golden-values files (reports/parsers/golden.py).
MAX_GOLDEN_BYTES = 8 * MiB
MAX_GOLDEN_VALUES = 100_000  # step values over every metric

# Training logs (reports/parsers/stream.py): any total size, read in chunks; a line carried from one read to
# the next (reads are at most 8 MiB) at most this many characters.
MAX_LOG_LINE_CHARS = 1 * MiB

# torch.profiler Chrome traces (reports/profile_trace.py): on disk and inflated (.json.gz) alike; read as a stream,
# so memory follows the events kept, not the bytes: at most MAX_TRACE_EVENTS events (each kept in ~0.4 KB), each
# event (and any other top-level value) at most MAX_TRACE_VALUE_CHARS, names kept to MAX_TRACE_NAME_CHARS.
MAX_TRACE_BYTES = 512 * MiB
MAX_TRACE_EVENTS = 150_000
MAX_TRACE_VALUE_CHARS = 4 * MiB
MAX_TRACE_NAME_CHARS = 1024

_CHUNK = 1 * MiB


def long_line(path: str | os.PathLike[str]) -> LimitError:
    """`file: a line longer than 1 MiB (the limit for a log line)`."""
    return LimitError(f"{path}: a line longer than {size_text(MAX_LOG_LINE_CHARS)} characters (the limit for "
                      "a log line): is this a training log?")  # fmt: skip


class LimitError(ValueError):
    """An input is over one of the limits above; the message names the file and the limit."""


def size_text(n: int) -> str:
    """`12.3 MiB`, `512 MiB`, `900 KiB`: sizes in messages."""
    if n >= MiB:
        value = n / MiB
        return f"{value:.0f} MiB" if value == int(value) else f"{value:.1f} MiB"
    return f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} bytes"


def too_large(path: str | os.PathLike[str], size: int | None, limit: int, what: str) -> LimitError:
    """`file: too large (12.3 MiB > 4 MiB limit for a campaign file)`; size None: only known to exceed."""
    shown = f"{size_text(size)} > {size_text(limit)}" if size is not None else f"more than {size_text(limit)}"
    return LimitError(f"{path}: too large ({shown} limit for {what})")


def read_bytes_bounded(path: str | os.PathLike[str], limit: int, what: str) -> bytes | bytearray:
    """A regular file's bytes, refused (LimitError) before reading when it is larger than `limit`; a .gz file
    is inflated in chunks and refused as soon as it passes `limit` (a gzip bomb never inflates further)."""
    path = Path(path)
    if path.name.endswith(".gz"):
        return _inflate_bounded(path, limit, what)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise too_large(path, size, limit, what)
        data = handle.read(limit + 1)
    if len(data) > limit:  # grew while read, or not a regular file
        raise too_large(path, None, limit, what)
    return data


def _inflate_bounded(path: Path, limit: int, what: str) -> bytearray:
    data = bytearray()
    try:
        with gzip.open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                if len(data) + len(chunk) > limit:
                    raise LimitError(f"{path}: too large (inflates to more than {size_text(limit)}; the limit "
                                     f"for {what})")  # fmt: skip
                data += chunk
    except (gzip.BadGzipFile, zlib.error) as err:
        raise ValueError(f"{path}: not a gzip file ({err})") from None
    return data


def text_chunks_bounded(path: str | os.PathLike[str], limit: int, what: str) -> Iterator[str]:
    """A UTF-8 file's text (a .gz file inflated; a byte order mark at its start dropped, as editors on Windows write
    one) in chunks of about 1 MiB, refused (LimitError) as soon as it passes `limit` bytes on disk or inflated: no
    more than one chunk is held here, whatever the file's size."""
    path = Path(path)
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    done = 0  # bytes decoded before the chunk at hand
    try:
        with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                if done + len(chunk) > limit:
                    inflated = "inflates to " if path.name.endswith(".gz") else ""
                    raise LimitError(f"{path}: too large ({inflated}more than {size_text(limit)}; the limit for {what})")
                yield decoder.decode(chunk)
                done += len(chunk)
            yield decoder.decode(b"", final=True)
    except (gzip.BadGzipFile, zlib.error, EOFError) as err:
        raise ValueError(f"{path}: not a gzip file ({err})") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} near byte {done + err.start:,})") from None


def json_loads_bounded(text: str | bytes | bytearray, path: str | os.PathLike[str]) -> Any:
    """json.loads, with nesting past MAX_JSON_DEPTH a LimitError naming `path` (not a RecursionError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise LimitError(
            f"{path}: nested too deeply (more than about {MAX_JSON_DEPTH:,} levels; the limit for a JSON file)"
        ) from None
