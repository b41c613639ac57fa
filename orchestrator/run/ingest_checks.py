"""What `mbx ingest` refuses to pass: impossible figures in a log's rows and logs that stop before their last step.

A step time or token rate must be a finite number above zero, a throughput (TFLOP/s), memory figure, learning
rate or grad norm a finite number not below zero; a loss may be NaN/Inf (that is a NaN iteration, counted by the gates). An
impossible value is taken out of its row (so no summary, report or baseline uses it) and named in the reason; a
run with one, or one whose log stops before its planned iterations (`iteration N/M`, or `mbx ingest --steps`), is
recorded failed with that reason, never passed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reports.parsers.rows import Row

POSITIVE = {"step_time_ms": "elapsed time per iteration (ms)", "tokens_per_s_per_gpu": "tokens/s per GPU"}
# Megatron prints TFLOP/s with one decimal: a tiny model's honest 0.0 is not impossible, a negative one is
NOT_NEGATIVE = {"tflops_per_gpu": "throughput per GPU (TFLOP/s/GPU)", "mem_allocated_gib": "allocated memory (GiB)", "mem_max_allocated_gib": "max allocated memory (GiB)",
                "mem_reserved_gib": "reserved memory (GiB)", "mem_max_reserved_gib": "max reserved memory (GiB)",
                "lr": "learning rate", "grad_norm": "grad norm"}  # fmt: skip
SHOWN = 3  # impossible values named in the reason (the rest counted)


@dataclass
class Checked:
    """A log's rows with impossible values taken out, and what was wrong."""

    rows: list[Row]
    impossible: list[str] = field(default_factory=list)  # "step 7: elapsed time per iteration (ms) = -1e+308 ..."

    def reason(self) -> str | None:
        if not self.impossible:
            return None
        more = len(self.impossible) - SHOWN
        shown = "; ".join(self.impossible[:SHOWN]) + (f"; and {more} more" if more > 0 else "")
        return f"impossible values in the log, left out of the figures: {shown}"


def _impossible(value: object, positive: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not math.isfinite(value) or (value <= 0 if positive else value < 0)


def check_rows(rows: list[Row]) -> Checked:
    """The rows with every impossible figure set to None (new row dicts; the input is left as it is)."""
    checked = Checked([])
    for row in rows:
        clean = dict(row)
        for fields, positive in ((POSITIVE, True), (NOT_NEGATIVE, False)):
            for key, name in fields.items():
                if _impossible(row.get(key), positive):
                    allowed = "a finite number above 0" if positive else "a finite number, not below 0"
                    checked.impossible.append(f"step {row.get('step')}: {name} = {row[key]!r} (must be {allowed})")
                    clean[key] = None
        checked.rows.append(clean)
    return checked


def truncated(last: int | None, planned: int | None) -> str | None:
    """Why a log that stops before its planned iterations is not a completed run (None: it did not)."""
    if planned and last is not None and last < planned:
        return f"truncated: the log stopped at step {last} of {planned}"
    return None
