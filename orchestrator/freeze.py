"""`mbx freeze`: pick the winner of a campaign by its verdicts (not by a noisy mean), and say why every other
point lost, from stored evidence: slower by x% [CI], a failed gate, out of memory, unstable, failed."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.compare import METRICS, Metric, Point, compare_pair, load_points
from orchestrator.errors import RunError, UsageError
from orchestrator.regate import gates_of, judge_campaign
from orchestrator.store import Store
from reports import compare as stats

OBJECTIVES = {"tflops": "tflops", "step_time": "step_time"}
TIE_BREAKS = {"memory": "peak_alloc", "step_time": "step_time", "tflops": "tflops"}


@dataclass
class Rejected:
    """A point that is not the winner, and why (from stored evidence)."""

    point_id: str
    label: str
    why: str
    kind: str  # slower | tie | gate | failed | oom | unstable | unfinished | infeasible


@dataclass
class Frozen:
    """The winner of a campaign, how it was chosen, and every other point with why it lost."""

    campaign: str
    spec: dict[str, Any]
    source_file: str | None
    winner: Point
    how: str  # one line: best by what, with what confidence (or the tie and its break)
    objective: Metric
    rejected: list[Rejected] = field(default_factory=list)
    gate_lines: list[str] = field(default_factory=list)
    recipe: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    trainer_kind: str = "bundled"
    frozen_at: str = field(default_factory=lambda: dt.date.today().isoformat())


def _metric(name: str) -> Metric:
    return next(m for m in METRICS if m.name == name)


def _mean(point: Point, metric: Metric) -> float | None:
    values = [r.summary.get(metric.summary_key) for r in point.repeats]
    found = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(found) / len(found) if found else None


def _unstable(point: Point) -> str | None:
    for r in point.repeats:
        s = r.summary
        if not s.get("loss_finite", True) or s.get("nan_iterations") or s.get("skipped_iterations"):
            return (f"unstable: {r.cell_id} had loss finite={s.get('loss_finite')}, NaN iterations="
                    f"{s.get('nan_iterations') or 0}, skipped={s.get('skipped_iterations') or 0}")  # fmt: skip
    return None


def _excluded(store: Store, name: str, points: list[Point]) -> dict[str, Rejected]:
    """Points that cannot win whatever their speed: an unfinished or failed repeat, instability, a gate."""
    latest = store.latest_attempts(name)
    record = store.campaign(name) or {}
    verdicts = {
        p.point_id: p
        for p in judge_campaign(store, name, gates_of(record), record["spec"].get("baseline")).points
    }
    out: dict[str, Rejected] = {}
    for point in points:
        for cell_id in point.cell_ids:
            attempt = latest.get(cell_id)
            if attempt is None or attempt.state != "completed":
                state = attempt.state if attempt else "never run"
                oom = attempt is not None and attempt.failure_class == "oom"
                why = "out of memory" if oom else f"{cell_id} {state}"
                reason = f": {attempt.reason}" if attempt is not None and attempt.reason else ""
                kind = (
                    "oom" if oom else "failed" if attempt and state in ("failed", "timeout") else "unfinished"
                )
                out[point.point_id] = Rejected(point.point_id, point.label, why + reason, kind)
                break
        if point.point_id in out:
            continue
        unstable = _unstable(point)
        verdict = verdicts.get(point.point_id)
        if unstable:
            out[point.point_id] = Rejected(point.point_id, point.label, unstable, "unstable")
        elif verdict is not None and verdict.verdict in ("fail", "inconclusive"):
            out[point.point_id] = Rejected(point.point_id, point.label, f"gate {verdict.verdict}: {verdict.why()}",
                                           "gate")  # fmt: skip
    return out


def infeasible_rejected(store: Store, name: str) -> list[Rejected]:
    """Points skipped before submission (the store's `estimates` table, orchestrator/feasibility.py): a layout
    rule broken or a memory estimate over the GPU's memory, with that reason."""
    return [
        Rejected(
            row["point_id"],
            row.get("label") or "",
            f"infeasible: {row.get('reason') or 'not run'}",
            "infeasible",
        )
        for row in store.estimates(name)
        if not row["feasible"]
    ]


def _versus(winner: Point, other: Point, metric: Metric, min_effect: float) -> stats.Decision:
    return compare_pair(winner, other, (metric,), min_effect).decisions[metric.name]


def _fmt_decision(d: stats.Decision) -> str:
    change = "" if d.change is None else f"{d.change:+.2%}"
    ci = "" if d.ci_low is None or d.ci_high is None else f" [{d.ci_low:+.2%}, {d.ci_high:+.2%}]"
    p = "" if d.p_value is None else f", p={d.p_value:.2g}"
    return f"{change}{ci} ({d.decision.upper()}{p}, {d.n_a} vs {d.n_b} repeats)"


def pick_best(
    eligible: list[Point], objective: Metric, tie_break: Metric, min_effect: float
) -> tuple[Point, str, set[str]]:
    """(winner, how, ids of the points tied with the leader): the leader by mean, then every point not
    DIFFERENT from it is a tie, settled by the tie-break metric (lower is better for time and memory)."""
    sign = 1 if objective.higher_is_worse else -1
    ranked = sorted(eligible, key=lambda p: sign * (_mean(p, objective) or math.inf) if _mean(p, objective)
                    is not None else math.inf)  # fmt: skip
    leader = ranked[0]
    tied = [p for p in ranked[1:] if _versus(leader, p, objective, min_effect).decision != stats.DIFFERENT]
    if not tied:
        if len(ranked) == 1:
            return (
                leader,
                f"the only eligible point ({objective.label} {_mean(leader, objective):.4g})",
                set(),
            )
        runner = _versus(leader, ranked[1], objective, min_effect)
        return leader, (f"best {objective.label}: the runner-up {ranked[1].point_id} differs by "
                        f"{_fmt_decision(runner)}"), set()  # fmt: skip
    group = [leader, *tied]
    key = 1 if tie_break.higher_is_worse else -1
    winner = min(group, key=lambda p: key * (_mean(p, tie_break) or (math.inf if key > 0 else -math.inf)))
    names = ", ".join(p.point_id for p in group)
    unknown = any(_versus(leader, p, objective, min_effect).decision == stats.UNKNOWN for p in tied)
    names += " (some UNKNOWN: more repeats may separate them)" if unknown else ""
    how = (f"{len(group)} points are not DIFFERENT in {objective.label} (min effect {min_effect:.0%}): {names}; "
           f"picked by the tie-break, {'lower' if tie_break.higher_is_worse else 'higher'} {tie_break.label}")  # fmt: skip
    return winner, how, {p.point_id for p in group}


def _reason(winner: Point, other: Point, objective: Metric, tie_break: Metric, tied: set[str],
            min_effect: float) -> Rejected:  # fmt: skip
    d = _versus(winner, other, objective, min_effect)
    worse = "slower" if (d.change or 0) * (1 if objective.higher_is_worse else -1) > 0 else "faster"
    if other.point_id in tied or d.decision != stats.DIFFERENT:
        mine, theirs = _mean(winner, tie_break), _mean(other, tie_break)
        detail = (
            f"{tie_break.label} {theirs:.4g} vs {mine:.4g}" if mine is not None and theirs is not None else ""
        )
        return Rejected(other.point_id, other.label, f"not DIFFERENT from the winner in {objective.label}: "
                        f"{_fmt_decision(d)}; lost the tie-break ({detail})", "tie")  # fmt: skip
    return Rejected(other.point_id, other.label, f"{worse} than the winner in {objective.label} by "
                    f"{_fmt_decision(d)}", "slower")  # fmt: skip


def freeze(
    workspace: Path, campaign: str, *, point: str | None = None, objective: str = "tflops",
    tie_break: str = "memory", min_effect: float = stats.MIN_EFFECT,
) -> Frozen:  # fmt: skip
    """The winner (`point`, or the best by the verdicts) and every other point's reason."""
    if objective not in OBJECTIVES or tie_break not in TIE_BREAKS:
        raise UsageError(f"--by {objective} / --tie-break {tie_break}: choose --by from {', '.join(OBJECTIVES)} and "
                         f"--tie-break from {', '.join(TIE_BREAKS)}")  # fmt: skip
    goal, breaker = _metric(OBJECTIVES[objective]), _metric(TIE_BREAKS[tie_break])
    with Store(workspace, create=False) as store:
        points = load_points(store, campaign)
        excluded = _excluded(store, campaign, points)
        infeasible = [r for r in infeasible_rejected(store, campaign) if r.point_id not in excluded]
        record = store.campaign(campaign) or {}
        cells = {c.point_id: c for c in store.cells(campaign)}
    eligible = [p for p in points if p.point_id not in excluded and p.repeats]
    if point is not None:
        chosen = next((p for p in points if point in (p.point_id, p.label, *p.cell_ids)), None)
        if chosen is None:
            raise UsageError(f"--point {point!r}: campaign {campaign!r} has no such point "
                             f"(points: {', '.join(p.point_id for p in points)})")  # fmt: skip
        if chosen.point_id in excluded:
            raise UsageError(f"--point {point!r} cannot be frozen: {excluded[chosen.point_id].why}")
        winner, how, tied = chosen, "chosen with --point", set()
    elif not eligible:
        lines = "; ".join(f"{r.point_id} [{r.label}]: {r.why}" for r in [*excluded.values(), *infeasible])
        raise RunError(f"{campaign}: no point can be frozen: {lines or 'no completed point'}")
    else:
        winner, how, tied = pick_best(eligible, goal, breaker, min_effect)
    rejected = [_reason(winner, p, goal, breaker, tied, min_effect) for p in eligible if p is not winner]
    rejected += [*excluded.values(), *infeasible]
    cell = cells[winner.point_id]
    return Frozen(campaign, record.get("spec") or {}, record.get("source_file"), winner, how, goal, rejected,
                  recipe=cell.recipe, resources=cell.resources, trainer_kind=cell.trainer_kind)  # fmt: skip
