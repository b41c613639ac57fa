"""Megatron-LM / Megatron-Bridge logs and golden values into mbx step rows (the metrics.jsonl contract).

    rows = parse_log("logs/rank7.log")                         # whole file, one row per step
    for row in iter_rows("logs/rank7.log"): ...                 # streaming, one row held at a time
    parser = make_parser(); parser.feed(chunk); ...; parser.close()  # a growing log, chunk by chunk
    rows = parse_rank_logs(["rank0.log", "rank7.log"])          # ranks of one run, merged by step

A row: `step` (Megatron's iteration number), `loss` ("lm loss"), `grad_norm`, `lr`, `step_time_ms`
("elapsed time per iteration (ms)"), `tflops_per_gpu` ("throughput per GPU (TFLOP/s/GPU)", or
Bridge's "GPU utilization" of the matching `Step Time` line), `tokens_per_s_per_gpu` (global batch
size × seq_length / step time / GPUs, only when seq_length and GPU count are known), memory in GiB
(`mem_allocated_gib`, `mem_max_allocated_gib`, `mem_reserved_gib`, `mem_max_reserved_gib`: Megatron-LM
"MB" = MiB → / 1024, Bridge "GB" = 1e9 bytes → × 1e9 / 2**30; the largest over ranks), `skipped` and
`nan` (True when Megatron counted a skipped / NaN iteration in the logging interval ending here, or
the loss is not finite), `eval_loss` on steps with a validation line, `energy_j` (J per step per GPU,
"energy per GPU (J/iter/GPU)" of `--log-energy`; absent without it), and `extra` with every other
field as printed ("consumed samples", "global batch size", "loss scale", "num zeros", other losses
such as "mtp_1 loss" or "load_balancing_loss", the raw "number of skipped/nan iterations", "train
iters", "timestamp", Bridge's "Step Time (s)", "validation lm loss PPL", ...). What the log does not
show stays None.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import Literal

from reports.limits import long_line
from reports.parsers.golden import CardFigure, GoldenValues, read_card, read_golden_values
from reports.parsers.megatron_bridge import MegatronBridgeParser
from reports.parsers.megatron_lm import ITERATION_RE, MegatronLMParser
from reports.parsers.rows import MEM_FIELDS, ROW_FIELDS, Row, derive_tokens, merge_rows
from reports.parsers.stream import StreamParser

Format = Literal["auto", "megatron-lm", "megatron-bridge"]
FORMATS: tuple[str, ...] = ("auto", "megatron-lm", "megatron-bridge")
DETECT_BYTES = 8 << 20  # detect_format looks at the first 8 MiB
# Read 64 KiB at a time: the rows of one piece (a few hundred) are handed out before the next piece
# is parsed, so fewer than the 700 new container objects that trigger a garbage collection pass are
# alive at once, and they die young; with 1 MiB pieces thousands of rows were alive, the collector
# ran hundreds of times per 100 MB and moved rows to older generations (8-10 % of the parse time).
_READ_BUFFER = 1 << 16

__all__ = [
    "FORMATS",
    "MEM_FIELDS",
    "ROW_FIELDS",
    "CardFigure",
    "GoldenValues",
    "MegatronBridgeParser",
    "MegatronLMParser",
    "StreamParser",
    "detect_format",
    "iter_rows",
    "make_parser",
    "merge_rows",
    "parse_log",
    "parse_rank_logs",
    "read_card",
    "read_golden_values",
]


def make_parser(
    format: Format = "auto",
    *,
    lag: int | None = 1,
    seq_length: int | None = None,
    num_gpus: int | None = None,
) -> StreamParser:
    """A streaming parser: `feed(chunk)` / `push(line)` return finished rows, `close()` the rest.

    "auto" reads both dialects (the Megatron-Bridge parser understands every Megatron-LM line too).
    `seq_length`/`num_gpus` let `tokens_per_s_per_gpu` be derived when the log's own argument dump
    does not give `seq_length`/`world_size`.
    """
    if format == "megatron-lm":
        cls: type[StreamParser] = MegatronLMParser
    elif format in ("megatron-bridge", "auto"):
        cls = MegatronBridgeParser
    else:
        raise ValueError(f"unknown log format {format!r}; expected one of {', '.join(FORMATS)}")
    return cls(lag=lag, seq_length=seq_length, num_gpus=num_gpus)


def iter_rows(
    source: str | os.PathLike[str] | Iterable[str],
    format: Format = "auto",
    *,
    lag: int | None = 1,
    seq_length: int | None = None,
    num_gpus: int | None = None,
) -> Iterator[Row]:
    """Rows of a log file (path) or of an iterable of lines, read line by line, in log order.

    With `lag=1` only the newest row is held back, so memory stays bounded on any file size; a file with a
    line past limits.MAX_LOG_LINE_CHARS raises LimitError (a ValueError).
    """
    # The rows come in lists (those each chunk finished): chain hands them out without running
    # Python code per row.
    return chain.from_iterable(_row_lists(source, format, lag, seq_length, num_gpus))


def _row_lists(
    source: str | os.PathLike[str] | Iterable[str],
    format: Format,
    lag: int | None,
    seq_length: int | None,
    num_gpus: int | None,
) -> Iterator[Iterable[Row]]:
    parser = make_parser(format, lag=lag, seq_length=seq_length, num_gpus=num_gpus)
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as fh:
            while chunk := fh.read(_READ_BUFFER):
                yield parser.feed(chunk)
                if parser.overlong:
                    raise long_line(source)
        yield parser.close()
    elif isinstance(source, io.StringIO):
        yield parser.feed(source.getvalue())
        yield parser.close()
    else:
        yield parser.iter_lines(source)


def parse_log(
    text_or_path: str | os.PathLike[str],
    format: Format = "auto",
    *,
    seq_length: int | None = None,
    num_gpus: int | None = None,
) -> list[Row]:
    """Every step row of one log (a path, or the log text itself), one row per step, sorted by step.

    Lines about one step printed apart (memory, validation, Bridge's Step Time) are merged into its
    row; a step printed twice (a restart appending to the same log) keeps the later values.
    """
    source = _as_source(text_or_path)
    rows = iter_rows(source, format, lag=None, seq_length=seq_length, num_gpus=num_gpus)
    return merge_rows([rows])


def parse_rank_logs(
    paths: Iterable[str | os.PathLike[str]],
    format: Format = "auto",
    *,
    seq_length: int | None = None,
    num_gpus: int | None = None,
) -> list[Row]:
    """Rows of several logs of one run (e.g. `logs/rank*.log`) merged by step: the last rank's
    iteration lines and rank 0's memory lines end up in one row; memory takes the largest value
    over ranks. `tokens_per_s_per_gpu` uses an argument dump found in any of the files."""
    parsers: list[StreamParser] = []
    row_lists: list[list[Row]] = []
    for path in paths:
        parser = make_parser(format, lag=None, seq_length=seq_length, num_gpus=num_gpus)
        rows: list[Row] = []
        with open(path, "rb") as fh:
            while chunk := fh.read(_READ_BUFFER):
                rows.extend(parser.feed(chunk))
                if parser.overlong:
                    raise long_line(path)
        rows.extend(parser.close())
        row_lists.append(rows)
        parsers.append(parser)
    rows = merge_rows(row_lists)
    args: dict[str, str] = {}
    for parser in parsers:
        args.update(parser.args)
    seq = seq_length or _int(args.get("seq_length"))
    gpus = num_gpus or _int(args.get("world_size"))
    for row in rows:
        derive_tokens(row, seq, gpus)
    return rows


def detect_format(text_or_path: str | os.PathLike[str]) -> str:
    """ "megatron-bridge", "megatron-lm" or "unknown", from the first 8 MiB of a log (path or text).

    Bridge is recognised by its `Step Time :` or `memory (GB)` lines; Megatron-LM by its
    `iteration N/M |` lines (which Bridge prints too, so Bridge wins when both are present).
    """
    source = _as_source(text_or_path)
    if isinstance(source, io.StringIO):
        head = source.getvalue()[:DETECT_BYTES]
    else:
        with open(source, encoding="utf-8", errors="replace") as fh:
            head = fh.read(DETECT_BYTES)
    if "Step Time :" in head or "memory (GB)" in head or "mem-allocated-gigabytes" in head:
        return "megatron-bridge"
    if ITERATION_RE.search(head):
        return "megatron-lm"
    return "unknown"


def _as_source(text_or_path: str | os.PathLike[str]) -> str | os.PathLike[str] | io.StringIO:
    """A path stays a path; a string is a path only if it names an existing file, otherwise log text."""
    if isinstance(text_or_path, os.PathLike):
        return text_or_path
    if "\n" not in text_or_path and len(text_or_path) < 4096 and Path(text_or_path).is_file():
        return text_or_path
    return io.StringIO(text_or_path)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
