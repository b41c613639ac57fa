"""Run-to-run noise floor of a parity campaign: with repeats, a pair's gap no larger than the gap between
repeats of the same point (A/A) is inconclusive, never a failure of the toggle (GPU kernels with atomics, e.g.
cuDNN's attention backward, are not bitwise reproducible)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import combinations
from typing import Any

from orchestrator.store import CellRow
from reports.numerics import MetricParity, metric_parity

Matched = Iterable[tuple[str, int, CellRow | None, CellRow | None]]
RowsOf = Callable[[CellRow], "tuple[list[dict[str, Any]] | None, str]"]


def _completed_rows(cells: list[CellRow], rows_of: RowsOf) -> list[list[dict[str, Any]]]:
    found = []
    for cell in cells:
        rows, _ = rows_of(cell)
        if rows is not None:
            found.append(rows)
    return found


def noise_floors(matched: Matched, metrics: Iterable[str], rows_of: RowsOf) -> dict[str, dict[str, float]]:
    """label → metric → the largest per-step |Δ| between two repeats of the same side (off or on) of that
    combination; labels with fewer than two completed repeats on both sides get none."""
    sides: dict[str, dict[str, list[CellRow]]] = {}
    for label, _repeat, off, on in matched:
        entry = sides.setdefault(label, {"off": [], "on": []})
        entry["off"] += [off] if off is not None else []
        entry["on"] += [on] if on is not None else []
    floors: dict[str, dict[str, float]] = {}
    for label, entry in sides.items():
        runs = [_completed_rows(cells, rows_of) for cells in entry.values()]
        couples = [c for rows in runs for c in combinations(rows, 2)]
        if not couples:
            continue
        floor: dict[str, float] = {}
        for metric in metrics:
            gaps = [metric_parity(metric, a, b, exact=True).max_abs for a, b in couples]
            gaps = [g for g in gaps if g is not None and math.isfinite(g)]
            if gaps:
                floor[metric] = max(gaps)
        floors[label] = floor
    return floors


def within_noise(metric: MetricParity, floor: float | None) -> MetricParity:
    """A failed metric whose largest gap is no larger than the A/A floor becomes inconclusive (with both
    figures); a non-finite mismatch stays a failure."""
    if (
        metric.verdict != "fail"
        or floor is None
        or metric.max_abs is None
        or not math.isfinite(metric.max_abs)
    ):
        return metric
    if metric.max_abs > floor:
        return replace(metric, reason=f"{metric.reason} (beyond the run-to-run noise: A/A |Δ| {floor:.3g})")
    return replace(
        metric,
        verdict="inconclusive",
        reason=f"|Δ| {metric.max_abs:.3g} is within the run-to-run noise (A/A |Δ| {floor:.3g} between repeats "
        f"of the same point): more steps or a deterministic setting can decide",
    )
