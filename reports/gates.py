"""Structured pass/fail gates over a Summary, with a verdict per attempt and per repeated point."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

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


@dataclass
class Check:
    """One gate applied to one figure."""

    gate: str
    value: float | None
    limit: float | None
    ok: bool | None  # None: could not be checked (figure missing)
    message: str


@dataclass
class GateResult:
    """The verdict for one attempt (or a repeated point) and the checks behind it."""

    verdict: Verdict
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "checks": [asdict(c) for c in self.checks]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GateResult:
        return cls(verdict=data["verdict"], checks=[Check(**c) for c in data.get("checks", [])])


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def _bound(gate: str, value: float | None, limit: float, upper: bool, unit: str = "") -> Check:
    if value is None:
        return Check(
            gate, None, limit, None, f"{gate}: no measured value to compare with {_fmt(limit)}{unit}"
        )
    ok = value <= limit if upper else value >= limit
    word = "above the maximum" if upper else "below the minimum"
    message = f"{gate}: {_fmt(value)}{unit} " + ("ok" if ok else f"is {word} {_fmt(limit)}{unit}")
    return Check(gate, value, limit, ok, message)


def evaluate(
    spec: GateSpec,
    summary: Summary | None,
    state: str = "completed",
    reason: str | None = None,
    baseline: Summary | None = None,
) -> GateResult:
    """Apply every configured gate. A run that did not complete fails; a missing figure is inconclusive."""
    checks: list[Check] = []
    if state != "completed":
        checks.append(
            Check("completed", None, None, False, f"run {state}" + (f": {reason}" if reason else ""))
        )
        return GateResult("fail", checks)
    if summary is None:
        return GateResult("inconclusive", [Check("metrics", None, None, None, "no metrics were collected")])

    cv = summary.step_time_cv
    bounds: list[tuple[str, float | None, float | None, bool, str]] = [
        ("tflops_per_gpu_min", summary.tflops_per_gpu, spec.tflops_per_gpu_min, False, " TFLOP/s"),
        ("step_time_ms_max", summary.step_time_ms, spec.step_time_ms_max, True, " ms"),
        (
            "tokens_per_s_per_gpu_min",
            summary.tokens_per_s_per_gpu,
            spec.tokens_per_s_per_gpu_min,
            False,
            " tok/s",
        ),
        ("peak_alloc_gib_max", summary.peak_alloc_gib, spec.peak_alloc_gib_max, True, " GiB"),
        ("peak_reserved_gib_max", summary.peak_reserved_gib, spec.peak_reserved_gib_max, True, " GiB"),
        ("nan_iterations_max", summary.nan_iterations, spec.nan_iterations_max, True, ""),
        ("skipped_iterations_max", summary.skipped_iterations, spec.skipped_iterations_max, True, ""),
        ("last_loss_max", summary.last_loss, spec.last_loss_max, True, ""),
        ("step_time_cv_max", cv, spec.step_time_cv_max, True, ""),
    ]
    for gate, value, limit, upper, unit in bounds:
        if limit is not None:
            checks.append(_bound(gate, value, limit, upper, unit))
    if spec.loss_finite:
        ok = summary.loss_finite
        checks.append(
            Check(
                "loss_finite",
                None,
                None,
                ok,
                "loss_finite: " + ("every loss finite" if ok else "a non-finite loss was logged"),
            )
        )
    checks.extend(_baseline_checks(spec, summary, baseline))

    if any(c.ok is False for c in checks):
        return GateResult("fail", checks)
    if any(c.ok is None for c in checks):
        return GateResult("inconclusive", checks)
    return GateResult("pass", checks)


def _baseline_checks(spec: GateSpec, summary: Summary, baseline: Summary | None) -> list[Check]:
    wanted = [spec.tflops_rel_baseline_min, spec.step_time_rel_baseline_max, spec.loss_rel_baseline_tol]
    if all(w is None for w in wanted):
        return []
    if baseline is None:
        return [Check("baseline", None, None, None, "baseline: no baseline figures for this cell")]
    checks: list[Check] = []
    if spec.tflops_rel_baseline_min is not None and baseline.tflops_per_gpu is not None:
        limit = baseline.tflops_per_gpu * (1 + spec.tflops_rel_baseline_min)
        checks.append(_bound("tflops_rel_baseline_min", summary.tflops_per_gpu, limit, False, " TFLOP/s"))
    if spec.step_time_rel_baseline_max is not None and baseline.step_time_ms is not None:
        limit = baseline.step_time_ms * (1 + spec.step_time_rel_baseline_max)
        checks.append(_bound("step_time_rel_baseline_max", summary.step_time_ms, limit, True, " ms"))
    if spec.loss_rel_baseline_tol is not None and baseline.last_loss is not None:
        if summary.last_loss is None:
            checks.append(
                Check("loss_rel_baseline_tol", None, None, None, "loss_rel_baseline_tol: no final loss")
            )
        else:
            diff = abs(summary.last_loss - baseline.last_loss)
            limit = spec.loss_rel_baseline_tol * abs(baseline.last_loss)
            ok = diff <= limit
            checks.append(
                Check(
                    "loss_rel_baseline_tol",
                    summary.last_loss,
                    baseline.last_loss,
                    ok,
                    f"loss_rel_baseline_tol: |{_fmt(summary.last_loss)} − {_fmt(baseline.last_loss)}| = {_fmt(diff)} "
                    + ("ok" if ok else f"exceeds {_fmt(limit)}"),
                )
            )
    return checks


def combine_repeats(results: list[GateResult]) -> Verdict:
    """Verdict of a point measured several times: unanimous pass/fail, else inconclusive (noise)."""
    verdicts = {r.verdict for r in results}
    if not verdicts:
        return "inconclusive"
    if verdicts == {"pass"}:
        return "pass"
    if verdicts == {"fail"}:
        return "fail"
    return "inconclusive"
