"""The step-row contract shared with metrics.jsonl: field names, unit conversions and merging rows by step."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

Row = dict[str, Any]

#: Every row carries these keys (value None when the log did not show it), plus `extra` and, on
#: evaluation steps, `eval_loss`.
ROW_FIELDS: tuple[str, ...] = (
    "step",
    "loss",
    "grad_norm",
    "lr",
    "step_time_ms",
    "tflops_per_gpu",
    "tokens_per_s_per_gpu",
    "mem_allocated_gib",
    "mem_max_allocated_gib",
    "mem_reserved_gib",
    "mem_max_reserved_gib",
    "skipped",
    "nan",
)
MEM_FIELDS: tuple[str, ...] = (
    "mem_allocated_gib",
    "mem_max_allocated_gib",
    "mem_reserved_gib",
    "mem_max_reserved_gib",
)

# Megatron-LM prints "memory (MB)" but divides bytes by 1024*1024 (MiB); Megatron-Bridge prints
# "memory (GB)" dividing by 1e9 (decimal GB); Megatron goldens store bytes. Rows hold GiB = 2**30 bytes.
GIB = float(2**30)


def mib_to_gib(value: float) -> float:
    """Megatron-LM's "MB" (really MiB, bytes / 1024**2) to GiB."""
    return value / 1024.0


def gb_to_gib(value: float) -> float:
    """Megatron-Bridge's "GB" (bytes / 1e9) to GiB."""
    return value * 1e9 / GIB


def new_row(step: int) -> Row:
    """A row for `step` with every contract field unset."""
    row: Row = dict.fromkeys(ROW_FIELDS)
    row["step"] = step
    row["extra"] = {}
    return row


def merge_row(into: Row, other: Row) -> Row:
    """Fold `other` into `into` (same step): set values win over None, memory keeps the larger
    value (the worst rank), anything else from `other` overrides (a later print of the same step)."""
    for key, value in other.items():
        if key == "extra":
            into.setdefault("extra", {}).update(value)
        elif value is None:
            into.setdefault(key, None)
        elif key in MEM_FIELDS and into.get(key) is not None:
            into[key] = max(into[key], value)
        else:
            into[key] = value
    return into


def merge_rows(row_lists: Iterable[Iterable[Row]]) -> list[Row]:
    """Rows of several logs of one run (e.g. one file per rank) merged into one row per step, by step.

    The last pipeline rank prints the iteration lines and the data-parallel rank 0 the memory lines,
    so fields of one step come from different files; a step is never duplicated.
    """
    by_step: dict[int, Row] = {}
    for rows in row_lists:
        for row in rows:
            step = row["step"]
            if step in by_step:
                merge_row(by_step[step], row)
            else:
                by_step[step] = merge_row(new_row(step), row)
    return [by_step[s] for s in sorted(by_step)]


def derive_tokens(row: Row, seq_length: int | None, num_gpus: int | None) -> None:
    """Fill `tokens_per_s_per_gpu` = global batch size × sequence length / step time / GPUs, when
    every input is known (global batch size from the log line, the other two from the caller or
    Megatron's argument dump); otherwise leave it None."""
    if row.get("tokens_per_s_per_gpu") is not None or not seq_length or not num_gpus:
        return
    batch = row.get("extra", {}).get("global batch size")
    step_ms = row.get("step_time_ms")
    if isinstance(batch, (int, float)) and isinstance(step_ms, (int, float)) and step_ms > 0:
        if math.isfinite(step_ms):
            row["tokens_per_s_per_gpu"] = batch * seq_length / (step_ms / 1000.0) / num_gpus
