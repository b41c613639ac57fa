"""Megatron-Bridge stdout to step rows: the Megatron-LM lines it also prints, plus `Step Time :` lines and `memory (GB)` lines.

Format strings (src/megatron/bridge/training/utils/train_utils.py) are quoted in
tests/data/megatron/SOURCES.md. Units: "Step Time : 14.26s" is seconds; "GPU utilization: 58.2TFLOP/s/GPU"
(before Nov 2025) and "...MODEL_TFLOP/s/GPU" (since) are model TFLOP/s per GPU; `mem-*-gigabytes`
values are bytes / 1e9 (decimal GB) and become GiB by × 1e9 / 2**30. Older Bridge printed Megatron's
"memory (MB)" line, which the Megatron-LM parser reads.
"""

from __future__ import annotations

import re

from reports.parsers.megatron_lm import MegatronLMParser
from reports.parsers.rows import Row, gb_to_gib
from reports.parsers.text import key_values, to_float, to_number

_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
STEP_TIME_RE = re.compile(
    r"Step Time :\s*" + _NUM + r"s\b(?:\s*GPU utilization:\s*" + _NUM + r"\s*(MODEL_)?TFLOP/s/GPU)?"
)

MEMORY_GB_FIELDS: dict[str, str] = {
    "mem-allocated-gigabytes": "mem_allocated_gib",
    "mem-max-allocated-gigabytes": "mem_max_allocated_gib",
    "mem-reserved-gigabytes": "mem_reserved_gib",
    "mem-max-reserved-gigabytes": "mem_max_reserved_gib",
}

# "Step Time : {:.2f}s" and "elapsed time per iteration (ms): {:.1f}" come from the same number.
STEP_TIME_TOLERANCE_S = 0.0051


def parse_step_time(line: str) -> tuple[float, float | None] | None:
    """(step time in s, model TFLOP/s/GPU or None) of a `Step Time : ...` line, else None."""
    m = STEP_TIME_RE.search(line)
    if m is None:
        return None
    seconds = to_float(m.group(1))
    if seconds is None:
        return None
    return seconds, to_float(m.group(2)) if m.group(2) else None


def parse_memory_gb(body: str, complete: bool = True) -> Row:
    """Memory fields (GiB) of the text after `memory (GB)`; other `mem-*` keys go to `extra` as printed."""
    fields: Row = {"extra": {}}
    for key, value in key_values(body, complete):
        key = key.strip().replace(" ", "")
        number = to_number(value)
        if number is None or not key:
            continue
        target = MEMORY_GB_FIELDS.get(key)
        if target is not None:
            fields[target] = gb_to_gib(float(number))
        else:
            fields["extra"][key] = number
    return fields


def step_time_matches(row: Row, seconds: float) -> bool:
    """Whether a `Step Time` of `seconds` is this row's "elapsed time per iteration"."""
    ms = row.get("step_time_ms")
    return ms is not None and abs(ms / 1000.0 - seconds) <= STEP_TIME_TOLERANCE_S


class MegatronBridgeParser(MegatronLMParser):
    """Streaming parser of Megatron-Bridge logs.

    Bridge prints `Step Time` on rank 0 and the iteration line on the last rank, so the two come in
    either order and carry no common step number; a `Step Time` line joins the iteration row whose
    elapsed time it equals (to its 2 printed decimals): the newest row if it matches, else the next
    one. One that matches neither is dropped rather than guessed.
    """

    format = "megatron-bridge"
    handles_gb_memory = True
    MARKERS = (*MegatronLMParser.MARKERS, "Step Time")
    RARE_MARKERS = (*MegatronLMParser.RARE_MARKERS, "Step Time")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._step_time: tuple[float, float | None] | None = None

    def _other(self, line: str, eol: bool) -> None:
        if "Step Time" not in line:
            return
        parsed = parse_step_time(line)
        if parsed is None:
            return
        latest = self._latest()
        if (
            latest is not None
            and "Step Time (s)" not in latest["extra"]
            and step_time_matches(latest, parsed[0])
        ):
            _apply_step_time(latest, *parsed)
        else:
            self._step_time = parsed

    def _add_iteration(self, row: Row) -> None:
        held = self._step_time
        if held is not None:
            self._step_time = None
            if step_time_matches(row, held[0]):
                _apply_step_time(row, *held)
        super()._add_iteration(row)

    def _bulk_ok(self) -> bool:
        return self._step_time is None and super()._bulk_ok()

    def _memory_gb(self, body: str, complete: bool) -> Row:
        return parse_memory_gb(body, complete)


def _apply_step_time(row: Row, seconds: float, tflops: float | None) -> None:
    row["extra"]["Step Time (s)"] = seconds
    if tflops is not None:
        row["extra"]["GPU utilization"] = tflops
        if row.get("tflops_per_gpu") is None:
            row["tflops_per_gpu"] = tflops
