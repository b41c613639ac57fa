"""Structured pass/fail gates over a Summary, with a verdict per attempt and per point (all its repeats, with a
confidence interval from scipy)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from reports.numerics import Spike
from reports.window import Summary

Verdict = Literal["pass", "fail", "inconclusive"]


class GateSpec(BaseModel):
    """Limits a cell must meet. Unset limits are not checked."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    tflops_per_gpu_min: float | None = Field(
        None, ge=0, description="Window TFLOP/s/GPU must be at least this."
    )
    step_time_ms_max: float | None = Field(
        None, gt=0, description="Window mean step time must be at most this (ms)."
    )
    tokens_per_s_per_gpu_min: float | None = Field(
        None, ge=0, description="Window tokens/s/GPU must be at least this."
    )
    peak_alloc_gib_max: float | None = Field(
        None, gt=0, description="Peak allocated memory must be at most this (GiB)."
    )
    peak_reserved_gib_max: float | None = Field(
        None, gt=0, description="Peak reserved memory must be at most this (GiB)."
    )
    headroom_gib_min: float | None = Field(
        None,
        ge=0,
        description="GPU memory − peak allocated memory must be at least this (GiB); the GPU memory is "
        "gpu_memory_gib, else that of the campaign's GPU (resources.gpu or `--gpu`).",
    )
    gpu_memory_gib: float | None = Field(
        None,
        gt=0,
        description="Memory of one GPU in GiB for headroom_gib_min (default: from the campaign's GPU, e.g. H200 "
        "139.8 as torch reports it).",
    )
    loss_finite: bool = Field(True, description="Every logged training loss must be finite.")
    nan_iterations_max: int | None = Field(None, ge=0, description="At most this many NaN iterations.")
    skipped_iterations_max: int | None = Field(
        None,
        ge=0,
        validation_alias=AliasChoices("skipped_iterations_max", "skipped_max"),
        description="At most this many skipped iterations (alias: skipped_max).",
    )
    last_loss_max: float | None = Field(None, description="Final training loss must be at most this.")
    step_time_cv_max: float | None = Field(
        None,
        gt=0,
        description="Coefficient of variation of window step times must be at most this (e.g. 0.02).",
    )
    tflops_rel_baseline_min: float | None = Field(
        None, description="TFLOP/s/GPU ≥ baseline × (1 + this); e.g. -0.03 allows 3% below the baseline."
    )
    step_time_rel_baseline_max: float | None = Field(
        None, description="Step time ≤ baseline × (1 + this); e.g. 0.05 allows 5% slower than the baseline."
    )
    loss_rel_baseline_tol: float | None = Field(
        None, ge=0, description="|last loss − baseline last loss| ≤ this × |baseline last loss|."
    )
    grad_norm_spikes_max: int | None = Field(
        None,
        ge=0,
        description="At most this many grad-norm spikes (robust z ≥ 6 against the rolling median/MAD of the 20 "
        "steps before; reports/numerics.py), each named with what preceded it (eval, skipped step, LR change).",
    )


@dataclass
class Check:
    """One gate applied to one figure; over several repeats `value` is their mean and `low`–`high` its
    confidence interval."""

    gate: str
    value: float | None
    limit: float | None
    ok: bool | None  # None: could not be checked (figure missing), or the interval straddles the limit
    message: str
    low: float | None = None
    high: float | None = None
    repeats: int = 1


@dataclass
class GateResult:
    """The verdict for one attempt (or a repeated point) and the checks behind it."""

    verdict: Verdict
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    @property
    def unchecked(self) -> list[Check]:
        """Checks that could not decide: a missing figure, or an interval across the limit."""
        return [c for c in self.checks if c.ok is None]

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "checks": [asdict(c) for c in self.checks]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GateResult:
        return cls(verdict=data["verdict"], checks=[Check(**c) for c in data.get("checks", [])])


@dataclass
class Repeat:
    """One finished repeat of a point, as a point verdict takes it."""

    name: str  # e.g. "repeat 1" (shown in messages)
    state: str
    reason: str | None
    summary: Summary | None
    spikes: list[Spike] | None = None  # grad-norm spikes of its curve; None: not read (the gate is unset)


CONFIDENCE = 0.95  # of the interval over repeat means


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def fmt_distinct(*values: float | None) -> list[str]:
    """The values with 4 significant digits, or as many more as it takes for the differences between them to
    read right (`5.35812` vs `5.358155`, not `5.358` twice): each shown within 1/20 of the smallest gap."""
    finite = sorted({float(v) for v in values if v is not None and math.isfinite(v)})
    gaps = [b - a for a, b in zip(finite, finite[1:], strict=False)]
    tolerance = min(gaps) / 20 if gaps else math.inf
    digits = 4
    while digits < 17 and any(abs(float(f"{v:.{digits}g}") - v) > tolerance for v in finite):
        digits += 1
    shown = (
        (lambda v: repr(float(v))) if digits == 17 else (lambda v: f"{v:.{digits}g}")
    )  # repr: shortest exact
    return [_fmt(v) if v is None or not math.isfinite(v) else shown(v) for v in values]


def interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean of repeat values and its Student-t confidence interval (scipy); a single
    value, or values that do not vary, give a zero-width interval."""
    import numpy as np
    from scipy import stats

    data = np.asarray(values, dtype=float)
    mean = float(data.mean())
    sem = float(stats.sem(data)) if len(data) > 1 else 0.0
    if not sem > 0:
        return mean, mean, mean
    low, high = stats.t.interval(CONFIDENCE, len(data) - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def _bound(gate: str, values: list[float], limit: float, upper: bool, unit: str = "") -> Check:
    """value ≤ limit (`upper`) or ≥ limit; over several repeats the whole confidence interval must be on the
    right side to pass and on the wrong side to fail, else the check is inconclusive."""
    if not values:
        return Check(
            gate, None, limit, None, f"{gate}: no measured value to compare with {_fmt(limit)}{unit}"
        )
    word = "maximum" if upper else "minimum"
    if len(values) == 1:
        value = values[0]
        ok: bool | None = value <= limit if upper else value >= limit
        shown, bound = fmt_distinct(value, limit)
        wrong = "above" if upper else "below"
        message = f"{gate}: {shown}{unit} " + ("ok" if ok else f"is {wrong} the {word} {bound}{unit}")
        return Check(gate, value, limit, ok, message)
    mean, low, high = interval(values)
    right, wrong = (high <= limit, low > limit) if upper else (low >= limit, high < limit)
    ok = True if right else False if wrong else None
    m, lo, hi, bound = fmt_distinct(mean, low, high, limit)
    figure = f"mean {m}{unit} ({CONFIDENCE:.0%} CI {lo}–{hi}, {len(values)} repeats)"
    verdict = {True: "ok", False: f"is {'above' if upper else 'below'} the {word} {bound}{unit}",
               None: f"straddles the {word} {bound}{unit}: inconclusive, more repeats may decide"}[ok]  # fmt: skip
    return Check(gate, mean, limit, ok, f"{gate}: {figure} {verdict}", low, high, len(values))


def evaluate(
    spec: GateSpec,
    summary: Summary | None,
    state: str = "completed",
    reason: str | None = None,
    baseline: Summary | None = None,
    spikes: list[Spike] | None = None,
) -> GateResult:
    """Apply every configured gate to one attempt. A run that did not complete fails; a missing figure is
    inconclusive."""
    return judge_point(spec, [Repeat("", state, reason, summary, spikes)], baseline)


def judge_point(spec: GateSpec, repeats: list[Repeat], baseline: Summary | None = None) -> GateResult:
    """The verdict of a point from all its finished repeats: a repeat that did not complete fails the point;
    each figure's gate is judged on the repeats' mean and confidence interval (one repeat: on its value)."""
    if not repeats:
        return GateResult("inconclusive", [Check("repeats", None, None, None, "no repeat has finished")])
    several = len(repeats) > 1
    unfinished = [r for r in repeats if r.state != "completed"]
    if unfinished:
        checks = [Check("completed", None, None, False, (f"{r.name}: " if several else "") + f"run {r.state}"
                        + (f": {r.reason}" if r.reason else "")) for r in unfinished]  # fmt: skip
        return GateResult("fail", checks)
    summaries = [r.summary for r in repeats if r.summary is not None]
    missing = [r for r in repeats if r.summary is None]
    checks = [Check("metrics", None, None, None, (f"{r.name}: " if several else "") + "no metrics were collected")
              for r in missing]  # fmt: skip
    if summaries:
        checks += _figure_checks(spec, summaries) + _baseline_checks(spec, summaries, baseline)
    if spec.grad_norm_spikes_max is not None and summaries:
        checks.append(spike_check(spec.grad_norm_spikes_max, [r.spikes for r in repeats], several))
    if any(c.ok is False for c in checks):
        return GateResult("fail", checks)
    if any(c.ok is None for c in checks):
        return GateResult("inconclusive", checks)
    return GateResult("pass", checks)


def _values(summaries: list[Summary], name: str) -> list[float]:
    values = [getattr(s, name) for s in summaries]
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _figure_checks(spec: GateSpec, summaries: list[Summary]) -> list[Check]:
    """Absolute limits; counts (NaN, skipped iterations) are not noise: the worst repeat counts."""
    checks: list[Check] = []
    bounds: list[tuple[str, str, float | None, bool, str]] = [
        ("tflops_per_gpu_min", "tflops_per_gpu", spec.tflops_per_gpu_min, False, " TFLOP/s"),
        ("step_time_ms_max", "step_time_ms", spec.step_time_ms_max, True, " ms"),
        ("tokens_per_s_per_gpu_min", "tokens_per_s_per_gpu", spec.tokens_per_s_per_gpu_min, False, " tok/s"),
        ("peak_alloc_gib_max", "peak_alloc_gib", spec.peak_alloc_gib_max, True, " GiB"),
        ("peak_reserved_gib_max", "peak_reserved_gib", spec.peak_reserved_gib_max, True, " GiB"),
        ("nan_iterations_max", "nan_iterations", spec.nan_iterations_max, True, ""),
        ("skipped_iterations_max", "skipped_iterations", spec.skipped_iterations_max, True, ""),
        ("last_loss_max", "last_loss", spec.last_loss_max, True, ""),
        ("step_time_cv_max", "step_time_cv", spec.step_time_cv_max, True, ""),
    ]
    for gate, figure, limit, upper, unit in bounds:
        if limit is None:
            continue
        values = _values(summaries, figure)
        if figure in ("nan_iterations", "skipped_iterations") and values:
            values = [max(values)]
        checks.append(_bound(gate, values, limit, upper, unit))
    if spec.headroom_gib_min is not None:
        checks.append(headroom_check(spec.headroom_gib_min, spec.gpu_memory_gib, summaries))
    if spec.loss_finite:
        ok = all(s.loss_finite for s in summaries)
        message = "every loss finite" if ok else "a non-finite loss was logged"
        checks.append(Check("loss_finite", None, None, ok, f"loss_finite: {message}"))
    return checks


def headroom_check(limit: float, gpu_gib: float | None, summaries: list[Summary]) -> Check:
    """headroom_gib_min: GPU memory − peak allocated memory ≥ limit, per repeat (over repeats on the interval
    of the mean), on each repeat's own GPU as its node recorded it (Summary.gpu_memory_gib), else on `gpu_gib`
    (gates.gpu_memory_gib, or the campaign's GPU); without either it cannot be decided."""
    gate = "headroom_gib_min"
    memories = [s.gpu_memory_gib if s.gpu_memory_gib is not None else gpu_gib for s in summaries]
    if any(m is None for m in memories):
        return Check(gate, None, limit, None, f"{gate}: the GPU's memory is not known (set resources.gpu, "
                     "`mbx campaign run --gpu`, or gates.gpu_memory_gib)")  # fmt: skip
    pairs = [(float(m), float(s.peak_alloc_gib)) for s, m in zip(summaries, memories, strict=True)
             if s.peak_alloc_gib is not None and math.isfinite(s.peak_alloc_gib) and s.peak_alloc_gib > 0]  # fmt: skip
    if len(pairs) < len(summaries):  # 0: nothing measured (a CPU run)
        return Check(gate, None, limit, None, f"{gate}: no GPU peak allocated memory was measured "
                     f"({len(summaries) - len(pairs)} of {len(summaries)} run(s); CPU runs have none)")  # fmt: skip
    check = _bound(gate, [memory - peak for memory, peak in pairs], limit, False, " GiB")
    check.message += f" ({_gpu_of(summaries, gpu_gib)})"
    return check


def _gpu_of(summaries: list[Summary], gpu_gib: float | None) -> str:
    """Which GPU memory the headroom was measured against: the GPU each node recorded, else the campaign's."""
    recorded = [s for s in summaries if s.gpu_memory_gib is not None]
    shown = "; ".join(f"{name}, {memory:.1f} GiB" for name, memory in
                      sorted({(s.gpu_name or "GPU", float(s.gpu_memory_gib or 0)) for s in recorded}))  # fmt: skip
    if recorded and len(recorded) == len(summaries):
        return f"GPU as its node recorded it: {shown}"
    if recorded:
        return f"GPU as recorded: {shown}; else the campaign's, {gpu_gib:.1f} GiB"
    return f"the campaign's GPU, {gpu_gib:.1f} GiB"


def _baseline_checks(spec: GateSpec, summaries: list[Summary], baseline: Summary | None) -> list[Check]:
    wanted = [spec.tflops_rel_baseline_min, spec.step_time_rel_baseline_max, spec.loss_rel_baseline_tol]
    if all(w is None for w in wanted):
        return []
    if baseline is None:
        return [Check("baseline", None, None, None, "baseline: no baseline figures for this cell")]
    checks: list[Check] = []
    if spec.tflops_rel_baseline_min is not None and baseline.tflops_per_gpu is not None:
        limit = baseline.tflops_per_gpu * (1 + spec.tflops_rel_baseline_min)
        values = _values(summaries, "tflops_per_gpu")
        checks.append(_bound("tflops_rel_baseline_min", values, limit, False, " TFLOP/s"))
    if spec.step_time_rel_baseline_max is not None and baseline.step_time_ms is not None:
        limit = baseline.step_time_ms * (1 + spec.step_time_rel_baseline_max)
        checks.append(
            _bound("step_time_rel_baseline_max", _values(summaries, "step_time_ms"), limit, True, " ms")
        )
    if spec.loss_rel_baseline_tol is not None and baseline.last_loss is not None:
        checks.append(
            _loss_check(_values(summaries, "last_loss"), baseline.last_loss, spec.loss_rel_baseline_tol)
        )
    return checks


def _loss_check(losses: list[float], base: float, tol: float) -> Check:
    """|last loss − baseline last loss| ≤ tol × |baseline|; over repeats, on the interval of the mean loss."""
    gate = "loss_rel_baseline_tol"
    if not losses:
        return Check(gate, None, None, None, f"{gate}: no final loss")
    limit = tol * abs(base)
    mean, low, high = interval(losses)
    far = max(abs(low - base), abs(high - base))
    near = 0.0 if low <= base <= high else min(abs(low - base), abs(high - base))
    ok = True if far <= limit else False if near > limit else None
    if len(losses) == 1:
        shown, base_text = fmt_distinct(mean, base)
        verdict = "ok" if ok else f"exceeds {_fmt(limit)}"
        return Check(
            gate, mean, base, ok, f"{gate}: |{shown} − {base_text}| = {abs(mean - base):.2g} {verdict}"
        )
    m, lo, hi, base_text = fmt_distinct(mean, low, high, base)
    figure = f"mean {m} ({CONFIDENCE:.0%} CI {lo}–{hi}, {len(losses)} repeats) vs baseline {base_text}"
    verdict = {True: f"within ±{_fmt(limit)} ok", False: f"differs by more than {_fmt(limit)}",
               None: f"straddles ±{_fmt(limit)}: inconclusive, more repeats may decide"}[ok]  # fmt: skip
    return Check(gate, mean, base, ok, f"{gate}: {figure} {verdict}", low, high, len(losses))


def spike_check(limit: int, spikes: list[list[Spike] | None], several: bool = False) -> Check:
    """grad_norm_spikes_max: the worst repeat's spike count against the limit (a count, not noise); a curve
    that was not read leaves it undecided."""
    gate = "grad_norm_spikes_max"
    if any(s is None for s in spikes):
        return Check(gate, None, limit, None, f"{gate}: the grad-norm curve was not read")
    worst = max((s for s in spikes if s is not None), key=len, default=[])
    ok = len(worst) <= limit
    where = ", ".join(
        f"step {s.step} (z {s.score:.3g}"
        + (f", after {'; '.join(s.preceded_by)}" if s.preceded_by else "")
        + ")"
        for s in worst[:5]
    ) + (f", +{len(worst) - 5} more" if len(worst) > 5 else "")
    figure = (
        f"{len(worst)} spike(s)"
        + (" in the worst repeat" if several else "")
        + (f": {where}" if worst else "")
    )
    return Check(
        gate,
        float(len(worst)),
        float(limit),
        ok,
        f"{gate}: {figure} " + ("ok" if ok else f"is above the maximum {limit}"),
    )
