"""A/B statistics of one metric: SAME / DIFFERENT / below-practical / UNKNOWN, relative change with a CI.

Pure (numpy + scipy, no torch, no store). `compare_samples(a, b)` takes, for each side, one value per repeat
(its window mean, peak or final value) and optionally the per-step window samples of each repeat, and
returns a `Decision`. `diagnose` reads the signature of a point's decisions.

The unit of evidence is the repeat. Steps inside one run are autocorrelated and share the run's
conditions (clocks, placement, allocator state): on the recorded H200 samples the base point's repeat means
spread 1.3% in step time (86.85 ms in r0 vs 87.7-88.0 ms after) while each run's steps spread about 1% around
their own mean. Treating 10 steps × 4 repeats as 40 independent samples (Pinpoint's KS / Mann-Whitney on the
pooled values) calls an A/A split of those repeats DIFFERENT far more often than its p-value promises
(benchmarks/compare_stats.py measures it). So, with ≥ 2 repeats per side:

- **Test and CI**: Welch's t-test on the logarithms of the repeat values (`scipy.stats.ttest_ind`,
  `equal_var=False`); its `confidence_interval` back-transformed is the CI of the ratio B/A, so the
  relative change and its CI come from one model. Rank tests cannot decide with the repeat counts GPUs
  afford: the smallest two-sided Mann-Whitney p at 4 vs 4 is 2/70 = 0.029 and KS is no better, so a rank
  rule at p ≤ 0.01 never says DIFFERENT below 5 repeats per side. A percentile bootstrap of 4 values
  under-covers badly. The t-test is robust enough for means of 10 steps (near-normal), and the benchmark
  checks its false-alarm rate on the real samples.
- **DIFFERENT** when p ≤ `alpha` (0.01, Pinpoint's low threshold) and |change| ≥ `min_effect` (1%).
  p ≤ alpha with a smaller change is **below-practical** ("DIFFERENT but below the practical threshold"),
  which counts as SAME in practice (asv's minimum factor).
- **SAME** when p is above a high threshold that depends on the sample sizes and on the practical effect in
  units of the measured noise (Pinpoint's idea, computed instead of tabulated): the p-value that a true
  change of exactly `min_effect` would exceed with probability only `beta` (noncentral t,
  `scipy.stats.nct`). Or when the whole CI lies inside ±`min_effect` (an equivalence test).
- **UNKNOWN** otherwise, with the repeats per side that would resolve it (power of the same t-test at the
  observed noise), capped at MAX_REPEATS.

One repeat on a side: the run-to-run spread cannot be estimated, so the verdict is never SAME. It is
DIFFERENT only when Mann-Whitney on the per-step window samples gives p ≤ alpha and the change is at least
SINGLE_RUN_FACTOR times the within-run coefficient of variation (and at least 2 × min_effect); else
UNKNOWN. Its CI is a t-interval on the per-step logs and ignores both autocorrelation and run-to-run drift.

A metric with no spread on either side (peak memory is deterministic for a fixed configuration) is
compared exactly: equal → SAME, else DIFFERENT or below-practical by the size of the change.

Curves (reports/numerics.py): `loss_divergence` says from which step the mean loss curves of B and A part by
more than their repeats' own spread and a relative tolerance, and stay apart (or part more and more);
`grad_norm_spikes` names the steps where a repeat's grad norm jumps far above its rolling median, with the
events (skipped or NaN steps, evaluations) just before.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, stats

from reports.numerics import Spike, curve_gap, find_spikes

SAME = "same"
DIFFERENT = "different"
BELOW_PRACTICAL = "below-practical"
UNKNOWN = "unknown"
DECISIONS = (SAME, DIFFERENT, BELOW_PRACTICAL, UNKNOWN)

MIN_EFFECT = 0.01  # the smallest relative change that matters in practice
ALPHA = 0.01  # DIFFERENT at p ≤ ALPHA (Pinpoint's low threshold)
BETA = 0.05  # SAME when a practical-sized change would have given a larger p only this often
CONFIDENCE = 0.95  # of the reported CI
SINGLE_RUN_FACTOR = 4.0  # one repeat: the change must be this many within-run CVs
MAX_REPEATS = 30  # repeats per side beyond which "more samples" is not suggested


@dataclass(frozen=True)
class Samples:
    """One side of one metric: a value per repeat, and optionally each repeat's per-step window samples."""

    repeats: list[float]
    steps: list[list[float]] = field(default_factory=list)


@dataclass(frozen=True)
class Decision:
    """The verdict on one metric: B relative to A (`change` = B/A − 1) and how it was reached."""

    decision: str
    change: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    high_threshold: float | None
    test: str
    n_a: int
    n_b: int
    mean_a: float | None
    mean_b: float | None
    reason: str
    more_repeats: int | None = None  # per side, when UNKNOWN and a finite number would resolve it

    def to_dict(self) -> dict[str, Any]:
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()
        }


def _clean(values: list[float]) -> np.ndarray:
    array = np.asarray([v for v in values if v is not None], dtype=float)
    return array[np.isfinite(array)]


def _ratio_ci(res: Any, confidence: float) -> tuple[float, float]:
    interval = res.confidence_interval(confidence_level=confidence)
    return math.expm1(interval.low), math.expm1(interval.high)


def _inside(cut: float, df: float, effect_se: float) -> float:
    """P(|T| < cut) for a t statistic whose true standardized effect is `effect_se` (noncentral t; the normal
    approximation where scipy's nct gives no finite value)."""
    value = stats.nct.cdf(cut, df, effect_se) - stats.nct.cdf(-cut, df, effect_se)
    if not math.isfinite(value):
        value = stats.norm.cdf(cut - effect_se) - stats.norm.cdf(-cut - effect_se)
    return float(value)


def high_threshold(df: float, effect_se: float, beta: float = BETA) -> float:
    """The p-value a true change of `effect_se` standard errors exceeds with probability `beta` (two-sided
    t-test with `df` degrees of freedom): p above it rejects "the change is at least that large"."""
    if math.isnan(effect_se) or effect_se <= 0:
        return 1.0  # no practical effect to rule out: p never proves sameness
    effect_se = min(effect_se, 40.0)  # beyond this the threshold is ~0 anyway
    upper = effect_se + 50.0
    if _inside(upper, df, effect_se) <= beta:
        return float(2 * stats.t.sf(upper, df))
    cut = optimize.brentq(lambda c: _inside(c, df, effect_se) - beta, 0.0, upper)
    return float(2 * stats.t.sf(cut, df))


def repeats_needed(sd: float, change: float, min_effect: float, alpha: float = ALPHA,
                   power: float = 0.8) -> int | None:  # fmt: skip
    """Repeats per side with which a Welch test at the noise `sd` (of log values) would decide: DIFFERENT with
    `power` when |change| ≥ min_effect, else SAME by the equivalence CI. None beyond MAX_REPEATS."""
    log_change = abs(math.log1p(change))
    log_min = math.log1p(min_effect)
    for n in range(2, MAX_REPEATS + 1):
        df = 2 * n - 2
        se = sd * math.sqrt(2.0 / n)
        if se == 0:
            return n
        if log_change >= log_min:
            crit = stats.t.ppf(1 - alpha / 2, df)
            if stats.nct.sf(crit, df, log_change / se) >= power:
                return n
        elif log_change + stats.t.ppf(1 - BETA, df) * se < log_min:
            return n
    return None


def _exact(a: np.ndarray, b: np.ndarray, min_effect: float) -> Decision:
    """Both sides without spread: the change is known exactly."""
    mean_a, mean_b = float(a[0]), float(b[0])
    change = mean_b / mean_a - 1 if mean_a else math.inf
    if change == 0:
        decision, reason = SAME, "identical values on both sides"
    elif abs(change) >= min_effect:
        decision, reason = DIFFERENT, "no spread on either side: the change is exact"
    else:
        decision, reason = BELOW_PRACTICAL, f"exact change below the {min_effect:.1%} practical threshold"
    return Decision(decision, change, change, change, None, None, "exact (no spread)", len(a), len(b),
                    mean_a, mean_b, reason)  # fmt: skip


def _repeats_test(a: np.ndarray, b: np.ndarray, min_effect: float, alpha: float, beta: float,
                  confidence: float) -> Decision:  # fmt: skip
    """≥ 2 repeats per side: Welch's t on log repeat values."""
    la, lb = np.log(a), np.log(b)
    res = stats.ttest_ind(lb, la, equal_var=False)
    p = float(res.pvalue)
    change = math.expm1(float(lb.mean() - la.mean()))
    low, high = _ratio_ci(res, confidence)
    va, vb = la.var(ddof=1) / len(la), lb.var(ddof=1) / len(lb)
    se = math.sqrt(va + vb)
    h = high_threshold(float(res.df), math.log1p(min_effect) / se if se else math.inf, beta)
    common = dict(ci_low=low, ci_high=high, p_value=p, high_threshold=h, test="welch-t on log repeat values",
                  n_a=len(a), n_b=len(b), mean_a=float(a.mean()), mean_b=float(b.mean()))  # fmt: skip
    if p <= alpha:
        if abs(change) >= min_effect:
            return Decision(DIFFERENT, change, reason=f"p={p:.2g} ≤ {alpha:g}", **common)
        return Decision(BELOW_PRACTICAL, change, reason=f"p={p:.2g} ≤ {alpha:g} but the change is below the "
                        f"{min_effect:.1%} practical threshold", **common)  # fmt: skip
    if p > h:
        return Decision(SAME, change, reason=f"p={p:.2g} above the high threshold {h:.2g}", **common)
    if -min_effect < low and high < min_effect:
        return Decision(SAME, change, reason=f"the CI lies within ±{min_effect:.1%}", **common)
    sd = math.sqrt((la.var(ddof=1) + lb.var(ddof=1)) / 2)
    more = repeats_needed(sd, change, min_effect, alpha)
    have = min(len(a), len(b))
    more = None if more is None else max(more - have, 1)
    return Decision(UNKNOWN, change, reason=f"p={p:.2g} between {alpha:g} and {h:.2g}", more_repeats=more,
                    **common)  # fmt: skip


def within_cv(steps: list[list[float]]) -> float | None:
    """Mean coefficient of variation of the per-step samples inside each run (None without ≥ 2 steps)."""
    cvs = [
        float(np.std(s, ddof=1) / np.mean(s))
        for s in (_clean(x) for x in steps)
        if len(s) >= 2 and np.mean(s)
    ]
    return float(np.mean(cvs)) if cvs else None


def _single_run(a: Samples, b: Samples, ra: np.ndarray, rb: np.ndarray, min_effect: float, alpha: float,
                confidence: float) -> Decision:  # fmt: skip
    """A side with one repeat: per-step samples may show a large change, never sameness."""
    mean_a, mean_b = float(ra.mean()), float(rb.mean())
    change = mean_b / mean_a - 1
    sa = _clean([v for s in a.steps for v in s])
    sb = _clean([v for s in b.steps for v in s])
    base = dict(n_a=len(ra), n_b=len(rb), mean_a=mean_a, mean_b=mean_b, high_threshold=None)
    if len(sa) < 3 or len(sb) < 3 or min(sa.min(), sb.min()) <= 0:
        return Decision(UNKNOWN, change, None, None, None, test="one repeat, no step samples",
                        reason="one repeat and no per-step samples: no spread to judge by", more_repeats=1,
                        **base)  # fmt: skip
    p = float(stats.mannwhitneyu(sb, sa, alternative="two-sided").pvalue)
    low, high = _ratio_ci(stats.ttest_ind(np.log(sb), np.log(sa), equal_var=False), confidence)
    cv = max(within_cv(a.steps) or 0.0, within_cv(b.steps) or 0.0)
    needed = max(2 * min_effect, SINGLE_RUN_FACTOR * cv)
    common = dict(
        ci_low=low, ci_high=high, p_value=p, test="one repeat: mann-whitney on window steps", **base
    )
    if p <= alpha and abs(change) >= needed:
        return Decision(DIFFERENT, change, reason=f"p={p:.2g} and |change| ≥ {needed:.1%} "
                        f"({SINGLE_RUN_FACTOR:g} × within-run CV)", **common)  # fmt: skip
    return Decision(UNKNOWN, change, reason=f"one repeat on a side: run-to-run spread unknown (DIFFERENT needs "
                    f"p ≤ {alpha:g} and |change| ≥ {needed:.1%})", more_repeats=3 - min(len(ra), len(rb)),
                    **common)  # fmt: skip


def compare_samples(a: Samples, b: Samples, min_effect: float = MIN_EFFECT, alpha: float = ALPHA,
                    beta: float = BETA, confidence: float = CONFIDENCE) -> Decision:  # fmt: skip
    """Decide whether metric samples B differ from A (see the module docstring for the rule)."""
    ra, rb = _clean(a.repeats), _clean(b.repeats)
    if not len(ra) or not len(rb):
        return Decision(UNKNOWN, None, None, None, None, None, "none", len(ra), len(rb),
                        float(ra.mean()) if len(ra) else None, float(rb.mean()) if len(rb) else None,
                        "no values on one side")  # fmt: skip
    if min(ra.min(), rb.min()) <= 0:
        return Decision(UNKNOWN, None, None, None, None, None, "none", len(ra), len(rb), float(ra.mean()),
                        float(rb.mean()), "non-positive values: relative change undefined")  # fmt: skip
    steps = [_clean(s) for s in a.steps + b.steps]
    steps_flat = bool(a.steps and b.steps) and all(len(s) and np.ptp(s) == 0 for s in steps)
    if np.ptp(ra) == 0 and np.ptp(rb) == 0 and (min(len(ra), len(rb)) >= 2 or steps_flat):
        return _exact(ra, rb, min_effect)
    with warnings.catch_warnings():  # scipy's precision notes on near-identical data: not for the user
        warnings.simplefilter("ignore", RuntimeWarning)
        if min(len(ra), len(rb)) < 2:
            return _single_run(a, b, ra, rb, min_effect, alpha, confidence)
        return _repeats_test(ra, rb, min_effect, alpha, beta, confidence)


def is_bad(decision: Decision, higher_is_worse: bool) -> bool:
    """A practical DIFFERENT in the bad direction (a regression)."""
    if decision.decision != DIFFERENT or decision.change is None:
        return False
    return decision.change > 0 if higher_is_worse else decision.change < 0


def diagnose(decisions: dict[str, Decision], time_key: str, memory_keys: tuple[str, ...],
             loss_key: str) -> list[str]:  # fmt: skip
    """Signature lines: time↑ with memory↓ → recompute/offload on; time↓ with memory↑ → off (or a buffer kept);
    memory↑ with time flat → an extra buffer."""
    lines: list[str] = []
    time = decisions.get(time_key)
    mems = [decisions[k] for k in memory_keys if k in decisions]
    mem_down = [m for m in mems if m.decision == DIFFERENT and (m.change or 0) < 0]
    mem_up = [m for m in mems if m.decision == DIFFERENT and (m.change or 0) > 0]
    time_up = time is not None and is_bad(time, higher_is_worse=True)
    time_flat = time is not None and time.decision in (SAME, BELOW_PRACTICAL)
    if time_up and mem_down and time is not None:
        lines.append(f"time↑ {time.change:+.1%} with memory↓ {mem_down[0].change:+.1%}: recompute (or offload) "
                     "newly on?")  # fmt: skip
    time_down = time is not None and time.decision == DIFFERENT and (time.change or 0) < 0
    if time_down and mem_up and time is not None:
        lines.append(f"time↓ {time.change:+.1%} with memory↑ {mem_up[0].change:+.1%}: recompute (or offload) newly "
                     "off, or an unfused path keeping a large buffer (e.g. full fp32 logits)?")  # fmt: skip
    if mem_up and time_flat:
        lines.append(f"memory↑ {mem_up[0].change:+.1%} with time flat: an extra buffer?")
    loss = decisions.get(loss_key)
    if loss is not None and loss.decision == DIFFERENT:
        lines.append(f"final loss {loss.change:+.2%}: numerics changed (compare the loss curves)")
    return lines


# ---- curves: loss divergence and grad-norm spikes (reports/numerics.py) -----------------------------------
def _curve(rows: list[dict[str, Any]], key: str) -> dict[int, float]:
    """step → finite value of `key` in one run's rows."""
    out = {}
    for row in rows:
        step, value = row.get("step"), row.get(key)
        if isinstance(step, int) and isinstance(value, (int, float)) and math.isfinite(value):
            out[step] = float(value)
    return out


def mean_curve(runs: list[list[dict[str, Any]]], key: str) -> tuple[dict[int, float], float]:
    """The per-step mean of `key` over the runs that logged the step, and the widest per-step spread
    (max − min) between those runs: the repeat-to-repeat noise of the curve."""
    curves = [_curve(rows, key) for rows in runs]
    steps = sorted(set().union(*curves)) if curves else []
    mean, spread = {}, 0.0
    for step in steps:
        values = [c[step] for c in curves if step in c]
        mean[step] = float(np.mean(values))
        spread = max(spread, float(np.ptp(values)))
    return mean, spread


def loss_divergence(runs_a: list[list[dict[str, Any]]], runs_b: list[list[dict[str, Any]]],
                    tolerance_rel: float) -> str | None:  # fmt: skip
    """ "loss diverges from step N" when the mean loss curves part by more than the repeats' own spread and
    `tolerance_rel` of the loss, and stay apart to the last common step (or the gap grows)."""
    a, noise_a = mean_curve(runs_a, "loss")
    b, noise_b = mean_curve(runs_b, "loss")
    common = sorted(set(a) & set(b))
    if len(common) < 3:
        return None
    gap = curve_gap(list(a), list(a.values()), list(b), list(b.values()),
                    tolerance_abs=max(noise_a, noise_b), tolerance_rel=tolerance_rel)  # fmt: skip
    last = common[-1]
    band = max(max(noise_a, noise_b), tolerance_rel * abs(a[last]))
    persists = abs(b[last] - a[last]) > band
    if gap.first_outside is None or not (persists or gap.growing):
        return None
    trend = f"|gap| growing (p={gap.slope_p:.2g})" if gap.growing else "still apart at the last step"
    return (f"loss diverges from step {gap.first_outside}: B − A reaches {gap.max_abs:.4g} ({gap.max_rel:.2%}), "
            f"beyond the repeats' spread and {tolerance_rel:.1%}; {trend}")  # fmt: skip


def _events(rows: list[dict[str, Any]]) -> dict[int, str]:
    """What happened at a step that can explain a spike: skipped steps, NaN steps, evaluations."""
    events = {}
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int):
            continue
        what = [w for w, key in (("skipped step", "skipped"), ("NaN step", "nan")) if row.get(key)]
        what += ["eval"] if any(k.startswith("eval") and row.get(k) is not None for k in row) else []
        if what:
            events[step] = f"{' and '.join(what)} at step {step}"
    return events


def spikes_by_step(runs: list[list[dict[str, Any]]]) -> dict[int, list[Spike]]:
    """Grad-norm spikes of every run (its whole curve), by step: one entry per run that spiked there."""
    found: dict[int, list[Spike]] = {}
    for rows in runs:
        curve = _curve(rows, "grad_norm")
        for spike in find_spikes(list(curve), list(curve.values()), events=_events(rows)):
            found.setdefault(spike.step, []).append(spike)
    return found


def _spike_line(side: str, other: str, steps: dict[int, list[Spike]], runs: int) -> str:
    shown = sorted(steps)[:5]
    where = ", ".join(f"{step} ({len(steps[step])}/{runs} repeats)" for step in shown)
    where += ", …" if len(steps) > len(shown) else ""
    top = max((s for found in steps.values() for s in found), key=lambda s: s.score)
    score = "∞" if math.isinf(top.score) else f"{top.score:.1f}"
    after = f"; after {', '.join(top.preceded_by)}" if top.preceded_by else ""
    return (f"grad-norm spikes in {side}, none in {other} at those steps: step {where} (largest {top.value:.4g} at "
            f"step {top.step}, robust z {score}{after})")  # fmt: skip


def grad_norm_spikes(runs_a: list[list[dict[str, Any]]], runs_b: list[list[dict[str, Any]]]) -> list[str]:
    """Lines for the grad-norm spikes one side has and the other has not (at the same step, in no repeat):
    spikes both sides share belong to the data or schedule, not to the change."""
    a, b = spikes_by_step(runs_a), spikes_by_step(runs_b)
    lines = []
    for side, other, mine, theirs, runs in (("B", "A", b, a, runs_b), ("A", "B", a, b, runs_a)):
        only = {step: found for step, found in mine.items() if step not in theirs}
        if only:
            lines.append(_spike_line(side, other, only, len(runs)))
    return lines
