"""Run-to-run noise of a parity campaign: with repeats, a pair's per-step gap is tested against the gap between
repeats of the same point (A/A); a failure that the A/A gaps explain is inconclusive, never a failure of the
toggle (GPU kernels with atomics, e.g. cuDNN's attention backward, are not bitwise reproducible)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Any

from orchestrator.run.store import CellRow
from reports.numerics import MetricParity, step_series
from reports.pvalue import p_claim

Matched = Iterable[tuple[str, int, CellRow | None, CellRow | None]]
RowsOf = Callable[[CellRow], "tuple[list[dict[str, Any]] | None, str]"]
Rows = Sequence[Mapping[str, object]]
ALPHA = 0.05


@dataclass(frozen=True)
class Noise:
    """The A/A gaps of one metric of one combination: per step the mean |Δ| over every couple of repeats."""

    max_abs: float
    per_step: dict[int, float]
    couples: int


def step_gaps(a: Rows, b: Rows, metric: str) -> dict[int, float]:
    """step → |a − b| of `metric` on the steps both recorded with finite values."""
    x, y = step_series(a, metric), step_series(b, metric)
    return {
        s: abs(x[s] - y[s]) for s in sorted(set(x) & set(y)) if math.isfinite(x[s]) and math.isfinite(y[s])
    }


def _completed_rows(cells: list[CellRow], rows_of: RowsOf) -> list[list[dict[str, Any]]]:
    return [rows for rows, _ in (rows_of(cell) for cell in cells) if rows is not None]


def noise_floors(matched: Matched, metrics: Iterable[str], rows_of: RowsOf) -> dict[str, dict[str, Noise]]:
    """label → metric → its Noise, from every couple of completed repeats of the same side (off or on) of that
    combination; labels with no such couple get none."""
    sides: dict[str, dict[str, list[CellRow]]] = {}
    for label, _repeat, off, on in matched:
        entry = sides.setdefault(label, {"off": [], "on": []})
        entry["off"] += [off] if off is not None else []
        entry["on"] += [on] if on is not None else []
    floors: dict[str, dict[str, Noise]] = {}
    for label, entry in sides.items():
        runs = [_completed_rows(cells, rows_of) for cells in entry.values()]
        couples = [c for rows in runs for c in combinations(rows, 2)]
        found = {m: _noise([step_gaps(a, b, m) for a, b in couples]) for m in metrics} if couples else {}
        if found := {m: noise for m, noise in found.items() if noise is not None}:
            floors[label] = found
    return floors


def _noise(gaps: list[dict[int, float]]) -> Noise | None:
    steps = sorted({s for g in gaps for s in g})
    if not steps:
        return None
    per_step = {s: sum(g[s] for g in gaps if s in g) / sum(1 for g in gaps if s in g) for s in steps}
    return Noise(max(max(g.values(), default=0.0) for g in gaps), per_step, len(gaps))


def within_noise(metric: MetricParity, noise: Noise | None, off_rows: Rows, on_rows: Rows) -> MetricParity:
    """A failed metric stays a failure only when its per-step gaps are larger than the A/A gaps (one-sided
    Wilcoxon signed-rank test over the common steps, scipy, p < 0.05); otherwise it is inconclusive, with the
    figures. A non-finite mismatch stays a failure."""
    if (
        metric.verdict != "fail"
        or noise is None
        or metric.max_abs is None
        or not math.isfinite(metric.max_abs)
    ):
        return metric
    gaps = step_gaps(off_rows, on_rows, metric.metric)
    excess = [gaps[s] - noise.per_step[s] for s in gaps if s in noise.per_step]
    p = _p_larger(excess)
    figures = f"A/A |Δ| up to {noise.max_abs:.3g} over {noise.couples} couple(s) of repeats"
    if p is not None and p < ALPHA:
        return replace(metric, reason=f"{metric.reason}; larger than the run-to-run noise ({figures}, "
                                      f"Wilcoxon {p_claim(p)} over {len(excess)} steps)")  # fmt: skip
    shown = p_claim(p) if p is not None else "no step differs"
    return replace(metric, verdict="inconclusive",
                   reason=f"|Δ| {metric.max_abs:.3g} is not larger than the run-to-run noise ({figures}; Wilcoxon "
                          f"{shown}): more repeats, more steps or a deterministic setting can decide")  # fmt: skip


def _p_larger(excess: list[float]) -> float | None:
    """p of 'the pair's per-step gaps exceed the A/A gaps' (None when every difference is zero)."""
    if not any(excess):
        return None
    from scipy import stats  # here, not at import: campaign.py (the CLI's load path) imports this module

    return float(stats.wilcoxon(excess, alternative="greater", zero_method="wilcox").pvalue)
