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
  afford (the smallest two-sided Mann-Whitney p at 4 vs 4 is 2/70 = 0.029), and a percentile bootstrap of 4
  values under-covers badly.
- **DIFFERENT** when p ≤ `alpha` (0.01) and |change| ≥ `min_effect` (1%).
- **SAME** only by equivalence: two one-sided Welch tests (TOST, `scipy.stats.ttest_ind` with
  `alternative=`) reject a change of −`min_effect` and of +`min_effect`, each at `EQUIVALENCE_ALPHA` (0.025),
  which is the same as the whole 95% CI lying inside ±`min_effect`. A high p-value is not evidence of
  sameness: a wide CI is UNKNOWN whatever its p. When the change is also significant (p ≤ alpha) it is
  **below-practical** ("SAME in practice"): real but smaller than anything that matters.
- **UNKNOWN** otherwise, with the repeats per side that would likely resolve it (power of the same tests at
  the observed noise), capped at MAX_REPEATS.

Several looks (`looks` = K, `mbx compare --until-conclusive`, which compares again after every round of extra
repeats): each look is tested at alpha / K and EQUIVALENCE_ALPHA / K (Bonferroni), and the CI shown is the
1 − 2·EQUIVALENCE_ALPHA / K interval, so over all K looks the chance of a false DIFFERENT stays ≤ alpha and
of a false SAME ≤ EQUIVALENCE_ALPHA however the looks fall (benchmarks/compare_stats.py measures both).

One repeat on a side: the steps of one run say nothing of how far the next run of the same point would land
(clocks, placement, allocator state: on the recorded H200 samples 0.2-0.7% run to run on one machine, ~1.4%
across machines), so the within-run interval is widened by a run-to-run floor (`RunFloor`: the workspace's own
A/A repeats of that trainer and GPU where they exist, orchestrator/judge/run_floor.py, else DEFAULT_RUN_FLOOR,
1%): the standard error of the log change is sqrt(se_steps² + floor² (1/n_a + 1/n_b)) (a side with repeats
uses its own spread when larger), and the test is a z test on it (`scipy.stats.norm`). DIFFERENT when p ≤ alpha
and |change| ≥ min_effect; never SAME (an assumed spread is no evidence of sameness); else UNKNOWN. With the
default floor a change must be about 3.6% to be DIFFERENT at one run a side (benchmarks/compare_stats.py:
false DIFFERENT on the H200 A/A samples ≤ 1%).

Deterministic figures (peak memory allocated and reserved: fixed for a fixed configuration, up to allocator
rounding) are compared against a stated measurement floor (`Floor`; MEMORY_FLOOR: 1% or 0.25 GiB, whichever
is larger) whenever each side's values spread less than that floor — with one run a side too: a change
within the floor is SAME, beyond it DIFFERENT (below-practical when under `min_effect`). Any other metric
with no spread at all on both sides (a CPU's final loss at a fixed seed) is compared exactly.

Curves (reports/numerics.py): `loss_divergence` says from which step the mean loss curves of B and A part by
more than their repeats' own spread and a relative tolerance, and stay apart to the end (or part more and
more); `grad_norm_spikes` names the steps where a repeat's grad norm jumps far above its rolling median, with
the events (skipped or NaN steps, evaluations) just before.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from reports.numerics import Spike, curve_gap, find_spikes
from reports.pvalue import p_claim

SAME = "same"
DIFFERENT = "different"
BELOW_PRACTICAL = "below-practical"
UNKNOWN = "unknown"
DECISIONS = (SAME, DIFFERENT, BELOW_PRACTICAL, UNKNOWN)

MIN_EFFECT = 0.01  # the smallest relative change that matters in practice
ALPHA = 0.01  # DIFFERENT at p ≤ ALPHA (the false-alarm rate of one look)
EQUIVALENCE_ALPHA = 0.025  # each one-sided test of TOST (the false-SAME rate of one look)
CONFIDENCE = 1 - 2 * EQUIVALENCE_ALPHA  # of the reported CI: SAME ⟺ this CI inside ±min_effect
MAX_REPEATS = 30  # repeats per side beyond which "more samples" is not suggested
FLOOR_TEST = "exact within a floor of"  # the test named by a deterministic figure's decision


@dataclass(frozen=True)
class Floor:
    """The measurement floor of a deterministic figure: changes within max(rel × A, absolute) are noise."""

    rel: float
    absolute: float
    unit: str

    def width(self, reference: float) -> float:
        return max(self.rel * abs(reference), self.absolute)

    def text(self) -> str:
        return f"{self.rel:.0%} or {self.absolute:g} {self.unit}, whichever is larger"


MEMORY_FLOOR = Floor(0.01, 0.25, "GiB")  # peak memory: allocator rounding and fragmentation stay far below


@dataclass(frozen=True)
class RunFloor:
    """The run-to-run spread of one run's value (relative standard deviation) that the steps of a single run
    cannot show, and where it comes from (the workspace's A/A repeats, or the stated default)."""

    rel: float
    source: str

    def text(self) -> str:
        return f"{self.rel:.2%} ({self.source})"


DEFAULT_RUN_FLOOR = RunFloor(0.01, "default: no A/A repeats of this trainer and GPU in the workspace")


@dataclass(frozen=True)
class Levels:
    """The error rates of one look: DIFFERENT at p ≤ alpha, SAME when TOST's p ≤ equivalence_alpha."""

    alpha: float = ALPHA
    equivalence_alpha: float = EQUIVALENCE_ALPHA

    @classmethod
    def for_looks(cls, looks: int) -> Levels:
        """Bonferroni over at most `looks` looks: each at alpha / looks."""
        looks = max(int(looks), 1)
        return cls(ALPHA / looks, EQUIVALENCE_ALPHA / looks)

    @property
    def confidence(self) -> float:
        return 1 - 2 * self.equivalence_alpha


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
    equivalence_p: float | None  # TOST: the larger of the two one-sided p-values against ±min_effect
    test: str
    n_a: int
    n_b: int
    mean_a: float | None
    mean_b: float | None
    reason: str
    more_repeats: int | None = None  # per side, when UNKNOWN and a finite number would resolve it
    run_floor: float | None = None  # fewer than 2 runs on a side: the run-to-run floor the CI was widened by

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


def equivalence_p(la: np.ndarray, lb: np.ndarray, min_effect: float) -> float:
    """TOST on log values (Welch, `scipy.stats.ttest_ind_from_stats`): the larger p of H0 "B/A ≤ 1 − min_effect"
    and H0 "B/A ≥ 1 + min_effect"; SAME needs it ≤ the equivalence level."""
    from scipy import stats  # here, not at import: status tables and pages without repeats never need it

    if min_effect <= 0:
        return 1.0
    sides = (float(lb.mean()), float(lb.std(ddof=1)), len(lb), float(la.mean()), float(la.std(ddof=1)), len(la))
    mean_b, *rest = sides
    above = stats.ttest_ind_from_stats(mean_b - math.log1p(-min_effect), *rest, equal_var=False,
                                       alternative="greater").pvalue  # fmt: skip
    below = stats.ttest_ind_from_stats(mean_b - math.log1p(min_effect), *rest, equal_var=False,
                                       alternative="less").pvalue  # fmt: skip
    return float(max(above, below))


def repeats_needed(sd: float, change: float, min_effect: float, alpha: float = ALPHA,
                   power: float = 0.8, equivalence_alpha: float = EQUIVALENCE_ALPHA) -> int | None:  # fmt: skip
    """Repeats per side with which Welch tests at the noise `sd` (of log values) would decide: DIFFERENT with
    `power` when |change| ≥ min_effect, else SAME by the equivalence CI. None beyond MAX_REPEATS."""
    from scipy import stats  # here, not at import: status tables and pages without repeats never need it

    log_change = abs(math.log1p(change))
    log_min = math.log1p(min_effect)
    n = np.arange(2, MAX_REPEATS + 1)
    df = 2 * n - 2
    se = sd * np.sqrt(2.0 / n)
    if sd == 0:
        return 2
    if log_change >= log_min:
        ok = stats.nct.sf(stats.t.ppf(1 - alpha / 2, df), df, log_change / se) >= power
    else:
        ok = log_change + stats.t.ppf(1 - equivalence_alpha, df) * se < log_min
    return int(n[np.argmax(ok)]) if ok.any() else None


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


def within_floor(values: np.ndarray, floor: Floor) -> bool:
    """The values of one side agree to within the floor (one value always does)."""
    return float(np.ptp(values)) <= floor.width(float(values.mean()))


def _floored(a: np.ndarray, b: np.ndarray, min_effect: float, floor: Floor) -> Decision:
    """A deterministic figure: the change of the means against the measurement floor."""
    mean_a, mean_b = float(a.mean()), float(b.mean())
    change = mean_b / mean_a - 1
    width = floor.width(mean_a)
    band = width / mean_a
    test = f"{FLOOR_TEST} {floor.text()}"
    common = dict(ci_low=change - band, ci_high=change + band, p_value=None, equivalence_p=None, test=test,
                  n_a=len(a), n_b=len(b), mean_a=mean_a, mean_b=mean_b)  # fmt: skip
    delta = f"{mean_b - mean_a:+.3g} {floor.unit}"
    if abs(mean_b - mean_a) <= width:
        return Decision(SAME, change, reason=f"{delta} is within the floor ({floor.text()})", **common)
    if abs(change) >= min_effect:
        return Decision(DIFFERENT, change, reason=f"{delta} is beyond the floor ({floor.text()})", **common)
    return Decision(BELOW_PRACTICAL, change, reason=f"{delta} is beyond the floor but below the {min_effect:.1%} "
                    "practical threshold", **common)  # fmt: skip


def _repeats_test(a: np.ndarray, b: np.ndarray, min_effect: float, levels: Levels) -> Decision:
    """≥ 2 repeats per side: Welch's t on log repeat values; SAME by TOST."""
    from scipy import stats  # here, not at import: status tables and pages without repeats never need it

    la, lb = np.log(a), np.log(b)
    res = stats.ttest_ind(lb, la, equal_var=False)
    p = float(res.pvalue)
    change = math.expm1(float(lb.mean() - la.mean()))
    low, high = _ratio_ci(res, levels.confidence)
    p_eq = equivalence_p(la, lb, min_effect)
    common = dict(ci_low=low, ci_high=high, p_value=p, equivalence_p=p_eq, test="welch-t on log repeat values",
                  n_a=len(a), n_b=len(b), mean_a=float(a.mean()), mean_b=float(b.mean()))  # fmt: skip
    alpha, eq_alpha = levels.alpha, levels.equivalence_alpha
    if p <= alpha and abs(change) >= min_effect:
        return Decision(DIFFERENT, change, reason=f"{p_claim(p)} ≤ {alpha:.2g}", **common)
    inside = f"the {levels.confidence:.4g} CI lies within ±{min_effect:.1%} ({p_claim(p_eq, 'TOST p')} ≤ {eq_alpha:.2g})"
    if p_eq <= eq_alpha:
        if p <= alpha:
            return Decision(BELOW_PRACTICAL, change, reason=f"{p_claim(p)} ≤ {alpha:.2g} but {inside}", **common)
        return Decision(SAME, change, reason=inside, **common)
    sd = math.sqrt((la.var(ddof=1) + lb.var(ddof=1)) / 2)
    more = repeats_needed(sd, change, min_effect, alpha, equivalence_alpha=eq_alpha)
    have = min(len(a), len(b))
    more = None if more is None else max(more - have, 1)
    why = (f"{p_claim(p)} > {alpha:.2g}" if p > alpha else f"{p_claim(p)} but |change| < {min_effect:.1%}")
    return Decision(UNKNOWN, change, reason=f"{why} and the CI is not within ±{min_effect:.1%} ({p_claim(p_eq, 'TOST p')} "
                    f"> {eq_alpha:.2g})", more_repeats=more, **common)  # fmt: skip


def single_run_note(n_a: int, n_b: int, floor: RunFloor | float) -> str:
    """`1 run a side: within-run CI widened by the run-to-run floor 1.00% (its source)` (or `1 run on A`; a bare
    number: without the source)."""
    who = "1 run a side" if n_a < 2 and n_b < 2 else f"1 run on {'A' if n_a < 2 else 'B'}"
    shown = floor.text() if isinstance(floor, RunFloor) else f"{floor:.2%}"
    return f"{who}: within-run CI widened by the run-to-run floor {shown}"


def _run_spread(logs: np.ndarray, floor: float) -> float:
    """A side's run-to-run spread (of log values): its own repeats' when it has ≥ 2 and they spread more."""
    return max(floor, float(logs.std(ddof=1))) if len(logs) >= 2 else floor


def _single_run(a: Samples, b: Samples, ra: np.ndarray, rb: np.ndarray, min_effect: float,
                levels: Levels, run_floor: RunFloor) -> Decision:  # fmt: skip
    """A side with one repeat: the within-run interval of the per-step samples widened by the run-to-run floor; a
    large change may be DIFFERENT, nothing is SAME."""
    la, lb = np.log(ra), np.log(rb)
    change = math.expm1(float(lb.mean() - la.mean()))
    sa = _clean([v for s in a.steps for v in s])
    sb = _clean([v for s in b.steps for v in s])
    note = single_run_note(len(ra), len(rb), run_floor)
    base = dict(n_a=len(ra), n_b=len(rb), mean_a=float(ra.mean()), mean_b=float(rb.mean()), equivalence_p=None,
                run_floor=run_floor.rel)  # fmt: skip
    if len(sa) < 3 or len(sb) < 3 or min(sa.min(), sb.min()) <= 0:
        return Decision(UNKNOWN, change, None, None, None, test="one repeat, no step samples",
                        reason="one repeat and no per-step samples: no spread to judge by", more_repeats=1,
                        **base)  # fmt: skip
    from scipy import stats  # here, not at import: status tables and pages without repeats never need it

    within = float(np.var(np.log(sa), ddof=1) / len(sa) + np.var(np.log(sb), ddof=1) / len(sb))
    between = _run_spread(la, run_floor.rel) ** 2 / len(la) + _run_spread(lb, run_floor.rel) ** 2 / len(lb)
    se = math.sqrt(within + between)
    log_change = float(lb.mean() - la.mean())
    p = float(2 * stats.norm.sf(abs(log_change) / se)) if se > 0 else (0.0 if log_change else 1.0)
    half = float(stats.norm.ppf(1 - levels.equivalence_alpha)) * se
    common = dict(ci_low=math.expm1(log_change - half), ci_high=math.expm1(log_change + half), p_value=p,
                  test="one repeat: z on window-step logs, widened by the run-to-run floor", **base)  # fmt: skip
    alpha = levels.alpha
    if p <= alpha and abs(change) >= min_effect:
        return Decision(DIFFERENT, change, reason=f"{p_claim(p)} ≤ {alpha:.2g}; {note}", **common)
    return Decision(UNKNOWN, change, reason=f"{note}; DIFFERENT needs p ≤ {alpha:.2g} and |change| ≥ "
                    f"{min_effect:.1%}; SAME needs 2 runs a side", more_repeats=3 - min(len(ra), len(rb)), **common)  # fmt: skip


def compare_samples(a: Samples, b: Samples, min_effect: float = MIN_EFFECT, *, floor: Floor | None = None,
                    looks: int = 1, run_floor: RunFloor = DEFAULT_RUN_FLOOR) -> Decision:  # fmt: skip
    """Decide whether metric samples B differ from A (see the module docstring for the rule). `floor`: the
    metric is deterministic, compared against that measurement floor; `looks`: the most looks of a sequential
    comparison, each tested at the levels divided by it; `run_floor`: the run-to-run spread a side with one
    run is widened by."""
    levels = Levels.for_looks(looks)
    ra, rb = _clean(a.repeats), _clean(b.repeats)
    if not len(ra) or not len(rb):
        return Decision(UNKNOWN, None, None, None, None, None, "none", len(ra), len(rb),
                        float(ra.mean()) if len(ra) else None, float(rb.mean()) if len(rb) else None,
                        "no values on one side")  # fmt: skip
    if min(ra.min(), rb.min()) <= 0:
        return Decision(UNKNOWN, None, None, None, None, None, "none", len(ra), len(rb), float(ra.mean()),
                        float(rb.mean()), "non-positive values: relative change undefined")  # fmt: skip
    if floor is not None and within_floor(ra, floor) and within_floor(rb, floor):
        return _floored(ra, rb, min_effect, floor)
    steps = [_clean(s) for s in a.steps + b.steps]
    steps_flat = bool(a.steps and b.steps) and all(len(s) and np.ptp(s) == 0 for s in steps)
    if np.ptp(ra) == 0 and np.ptp(rb) == 0 and (min(len(ra), len(rb)) >= 2 or steps_flat):
        return _exact(ra, rb, min_effect)
    with warnings.catch_warnings():  # scipy's precision notes on near-identical data: not for the user
        warnings.simplefilter("ignore", RuntimeWarning)
        if min(len(ra), len(rb)) < 2:
            return _single_run(a, b, ra, rb, min_effect, levels, run_floor)
        return _repeats_test(ra, rb, min_effect, levels)


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
    if not steps:
        return {}, 0.0
    column = {step: i for i, step in enumerate(steps)}
    grid = np.full((len(curves), len(steps)), np.nan)  # runs × steps, NaN where a run did not log the step
    for row, curve in enumerate(curves):
        grid[row, [column[step] for step in curve]] = list(curve.values())
    spread = float(np.max(np.nanmax(grid, axis=0) - np.nanmin(grid, axis=0)))  # every step has a value
    return dict(zip(steps, np.nanmean(grid, axis=0).tolist(), strict=True)), spread


def loss_divergence(runs_a: list[list[dict[str, Any]]], runs_b: list[list[dict[str, Any]]],
                    tolerance_rel: float) -> str | None:  # fmt: skip
    """ "loss diverges from step N" when the mean loss curves part by more than the repeats' own spread and
    `tolerance_rel` of the loss from step N on and stay apart to the last common step: at least
    max(3 steps, 10% of the common steps) in a row, so a few noisy steps (or a last step that happens to be
    outside) are not a divergence."""
    a, noise_a = mean_curve(runs_a, "loss")
    b, noise_b = mean_curve(runs_b, "loss")
    common = sorted(set(a) & set(b))
    if len(common) < 3:
        return None
    tolerance_abs = max(noise_a, noise_b)
    va, vb = np.array([a[s] for s in common]), np.array([b[s] for s in common])
    outside = (np.abs(vb - va) > tolerance_abs) & (np.abs(vb - va) > tolerance_rel * np.abs(va))
    inside_at = np.flatnonzero(~outside)
    apart = len(common) - (int(inside_at[-1]) + 1 if len(inside_at) else 0)  # steps apart at the end
    if apart < max(3, math.ceil(0.1 * len(common))):
        return None
    start = common[len(common) - apart]
    gap = curve_gap(list(a), list(a.values()), list(b), list(b.values()),
                    tolerance_abs=tolerance_abs, tolerance_rel=tolerance_rel)  # fmt: skip
    trend = f"; |gap| growing ({p_claim(gap.slope_p)})" if gap.growing else ""
    return (f"loss diverges from step {start}: B − A reaches {gap.max_abs:.4g} ({gap.max_rel:.2%}), beyond the "
            f"repeats' spread and {tolerance_rel:.1%}, and stays apart for the last {apart} of {len(common)} "
            f"common steps{trend}")  # fmt: skip


def _events(rows: list[dict[str, Any]]) -> dict[int, str]:
    """What happened at a step that can explain a spike: skipped steps, NaN steps, evaluations."""
    events = {}
    evals = [key for key in set().union(*rows) if key.startswith("eval")]  # the keys of every row, once
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int):
            continue
        what = [w for w, key in (("skipped step", "skipped"), ("NaN step", "nan")) if row.get(key)]
        what += ["eval"] if any(row.get(k) is not None for k in evals) else []
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
