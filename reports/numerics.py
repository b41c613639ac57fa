"""Numerics of step curves: robust spike detection and the gap between two curves (numpy/scipy only)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reports.pvalue import p_claim

LOOKBACK = 3  # steps before a spike whose events are named as what preceded it
MIN_HISTORY = 10  # points before a value for it to be judged (the first steps of a run are a transient)
TREND_ALPHA = 0.05  # a gap "grows" when |gap| rises with steps at this significance


@dataclass(frozen=True)
class Spike:
    """One point far above its rolling median, and the events just before it."""

    step: int
    value: float
    score: float  # robust z: (value - rolling median) / (1.4826 * MAD)
    preceded_by: tuple[str, ...]  # e.g. ("eval at step 20",) from `events`


def _preceding(step: int, prior_step: int | None, events: Mapping[int, str]) -> tuple[str, ...]:
    """Events at the steps from the previous recorded step (or LOOKBACK back) up to this one."""
    low = step - LOOKBACK if prior_step is None else min(prior_step, step - 1)
    return tuple(events[s] for s in sorted(events) if low <= s <= step)


def find_spikes(
    steps: Sequence[int],
    values: Sequence[float],
    *,
    window: int = 20,
    threshold: float = 6.0,
    events: Mapping[int, str] | None = None,
) -> list[Spike]:
    """Upward outliers: robust z of each value against the median/MAD of the `window` values before it.

    The scale is the window's MAD, floored by the curve's own step-to-step noise (MAD of first differences
    over sqrt 2), so a calm stretch does not turn ordinary noise into alarms. Non-finite values are skipped.
    A point needs MIN_HISTORY (10) finite predecessors (or `window`, if fewer) to be judged: the first steps
    of a run are a transient, not spikes. When the scale is 0 (a flat curve), a point is a spike only if it
    differs from the median at all, with an infinite score. `events` maps a step to what happened there (eval,
    checkpoint, LR-schedule change, skipped step); a spike names the events from its previous recorded step
    up to its own.
    """
    import numpy as np
    from scipy import stats

    if len(steps) != len(values):
        raise ValueError(f"steps and values differ in length ({len(steps)} vs {len(values)})")
    order = np.argsort(np.asarray(steps, dtype=np.int64), kind="stable")
    s = np.asarray(steps, dtype=np.int64)[order]
    v = np.asarray(values, dtype=np.float64)[order]
    keep = np.isfinite(v)
    s, v = s[keep], v[keep]
    # scale="normal": 1.4826 × MAD (scipy divides by 0.6745). Noise floor of the whole curve (robust to spikes):
    # a 20-point window alone can show a tiny MAD by chance.
    floor = (
        float(stats.median_abs_deviation(np.diff(v), scale="normal")) / math.sqrt(2) if len(v) > 2 else 0.0
    )
    found: list[Spike] = []
    for i in range(min(MIN_HISTORY, window), len(v)):
        history = v[max(0, i - window) : i]
        median = float(np.median(history))
        mad = max(float(stats.median_abs_deviation(history, scale="normal")), floor)
        excess = float(v[i]) - median
        if mad > 0:
            score = excess / mad
        else:
            score = math.inf if excess > 0 else 0.0
        if score >= threshold:
            prior = int(s[i - 1])
            found.append(Spike(int(s[i]), float(v[i]), score, _preceding(int(s[i]), prior, events or {})))
    return found


@dataclass(frozen=True)
class Gap:
    """The gap between two curves on their common steps, against a tolerance band."""

    tolerance_abs: float
    tolerance_rel: float
    max_abs: float
    max_rel: float
    first_outside: int | None  # first step the gap leaves the band (None: never)
    growing: bool
    slope_p: float  # trend of |gap| over steps (scipy.stats.linregress)
    common_steps: int = 0


def _aligned(steps: Sequence[int], values: Sequence[float]) -> dict[int, float]:
    """step → value, finite values only; the last value wins for a repeated step."""
    return {int(k): float(x) for k, x in zip(steps, values, strict=True) if math.isfinite(float(x))}


def curve_gap(
    steps_a: Sequence[int],
    values_a: Sequence[float],
    steps_b: Sequence[int],
    values_b: Sequence[float],
    *,
    tolerance_abs: float = 0.0,
    tolerance_rel: float = 0.0,
) -> Gap:
    """Gap b - a on the common steps. A step is inside the band when |gap| <= tolerance_abs or
    |gap| <= tolerance_rel * |a| (either tolerance suffices; both 0 means bitwise equal).

    `growing` is true when linregress of |gap| on step has a positive slope with p < 0.05; with fewer
    than 3 common steps or a constant |gap| there is no trend (slope_p is nan, growing False).
    """
    import numpy as np
    from scipy import stats

    a, b = _aligned(steps_a, values_a), _aligned(steps_b, values_b)
    common = sorted(set(a) & set(b))
    if not common:
        return Gap(tolerance_abs, tolerance_rel, math.nan, math.nan, None, False, math.nan, 0)
    va = np.array([a[k] for k in common])
    vb = np.array([b[k] for k in common])
    gap = np.abs(vb - va)
    scale = np.abs(va)
    rel = np.divide(gap, scale, out=np.where(gap > 0, np.inf, 0.0), where=scale > 0)
    outside = (gap > tolerance_abs) & (gap > tolerance_rel * scale)
    first = int(common[int(np.argmax(outside))]) if outside.any() else None
    growing, slope_p = False, math.nan
    if len(common) >= 3 and float(np.ptp(gap)) > 0:
        fit = stats.linregress(np.asarray(common, dtype=np.float64), gap)
        slope_p = float(fit.pvalue)
        growing = bool(fit.slope > 0 and slope_p < TREND_ALPHA)
    return Gap(
        tolerance_abs, tolerance_rel, float(gap.max()), float(rel.max()), first, growing, slope_p, len(common)
    )


@dataclass(frozen=True)
class MetricParity:
    """One metric of an on/off pair against its tolerance: pass, fail (where first), inconclusive or n/a."""

    metric: str
    verdict: str  # "pass" | "fail" | "inconclusive" | "n/a" (recorded by neither side)
    max_abs: float | None = None
    max_rel: float | None = None
    first_exceeded: int | None = None  # first step outside the tolerance band
    growing: bool = False
    slope_p: float | None = None
    steps: int = 0  # common steps compared
    reason: str = ""


def step_series(rows: Sequence[Mapping[str, object]], metric: str) -> dict[int, float]:
    """step → value of `metric` (None and missing skipped; NaN/inf kept: both sides must agree on them)."""
    out: dict[int, float] = {}
    for row in rows:
        step, value = row.get("step"), row.get(metric)
        if isinstance(step, int) and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[step] = float(value)
    return out


def _nonfinite_mismatch(a: dict[int, float], b: dict[int, float]) -> int | None:
    """First common step where the sides disagree on a non-finite value (NaN, ±inf)."""
    for step in sorted(set(a) & set(b)):
        x, y = a[step], b[step]
        if (math.isfinite(x) and math.isfinite(y)) or (math.isnan(x) and math.isnan(y)) or x == y:
            continue
        return step
    return None


def metric_parity(
    metric: str,
    off_rows: Sequence[Mapping[str, object]],
    on_rows: Sequence[Mapping[str, object]],
    *,
    exact: bool,
    max_abs: float = 0.0,
    max_rel: float = 0.0,
    trend: bool = False,
) -> MetricParity:
    """Compare one metric per step. `exact`: bitwise equal at every step. Otherwise a step is inside when
    |on - off| <= max_abs or <= max_rel × |off|; `trend` also fails a gap that grows (linregress, p < 0.05).
    A failure at a common step stands even when the step sets differ; otherwise differing steps, or a
    metric only one side recorded, are inconclusive (never a pass)."""
    a, b = step_series(off_rows, metric), step_series(on_rows, metric)
    if not a and not b:
        return MetricParity(metric, "n/a", reason="recorded by neither side")
    if not a or not b:
        return MetricParity(
            metric, "inconclusive", reason=f"recorded only by the {'on' if b else 'off'} side"
        )
    tol_abs, tol_rel = (0.0, 0.0) if exact else (max_abs, max_rel)
    gap = curve_gap(
        list(a), list(a.values()), list(b), list(b.values()), tolerance_abs=tol_abs, tolerance_rel=tol_rel
    )
    bad_nonfinite = _nonfinite_mismatch(a, b)
    firsts = [s for s in (gap.first_outside, bad_nonfinite) if s is not None]
    first = min(firsts) if firsts else None
    figures = dict(
        max_abs=None if math.isnan(gap.max_abs) else gap.max_abs,
        max_rel=None if math.isnan(gap.max_rel) else gap.max_rel,
        first_exceeded=first,
        growing=gap.growing,
        slope_p=None if math.isnan(gap.slope_p) else gap.slope_p,
        steps=gap.common_steps,
    )
    band = "bitwise" if exact else f"max_abs {tol_abs:g} / max_rel {tol_rel:g}"
    if first is not None:
        why = (
            "non-finite on one side only"
            if first == bad_nonfinite
            else f"|Δ| {gap.max_abs:.3g} outside {band}"
        )
        return MetricParity(metric, "fail", **figures, reason=f"{why}, first at step {first}")
    if trend and gap.growing:
        return MetricParity(metric, "fail", **figures, reason=f"|Δ| grows over the run ({p_claim(gap.slope_p)})")
    if set(a) != set(b):
        only = sorted(set(a) ^ set(b))
        return MetricParity(
            metric,
            "inconclusive",
            **figures,
            reason=f"the sides logged different steps (e.g. step {only[0]} on one side only)",
        )
    return MetricParity(metric, "pass", **figures, reason=f"within {band} over {gap.common_steps} steps")


def step_events(rows: Sequence[Mapping[str, object]]) -> dict[int, str]:
    """What happened at each step, from metrics rows: an evaluation (an `eval_loss`), a skipped step, a
    checkpoint (a truthy `checkpoint`), and an LR-schedule change (the LR stops rising, or starts or stops
    changing: the end of warm-up, a constant phase)."""
    import numpy as np

    found: dict[int, list[str]] = {}
    lrs: list[tuple[int, float]] = []
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int):
            continue
        if row.get("eval_loss") is not None:
            found.setdefault(step, []).append(f"eval at step {step}")
        if row.get("skipped"):
            found.setdefault(step, []).append(f"skipped step {step}")
        if row.get("checkpoint"):
            found.setdefault(step, []).append(f"checkpoint at step {step}")
        lr = row.get("lr")
        if isinstance(lr, (int, float)) and math.isfinite(float(lr)):
            lrs.append((step, float(lr)))
    lrs.sort()
    slopes = [(s1, float(np.sign(v1 - v0))) for (_, v0), (s1, v1) in zip(lrs, lrs[1:], strict=False)]
    for (step, before), (_, after) in zip(slopes, slopes[1:], strict=False):
        if before != after:  # `step` is where the old slope ended (e.g. the last warm-up step)
            found.setdefault(step, []).append(f"LR-schedule change at step {step}")
    return {step: "; ".join(words) for step, words in found.items()}


def grad_norm_spikes(
    rows: Sequence[Mapping[str, object]], *, window: int = 20, threshold: float = 6.0
) -> list[Spike]:
    """Spikes of a run's grad-norm curve, each with the events (step_events) just before it."""
    series = step_series(rows, "grad_norm")
    return find_spikes(
        list(series), list(series.values()), window=window, threshold=threshold, events=step_events(rows)
    )
