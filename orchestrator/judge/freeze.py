"""`mbx freeze`: pick the winner of a campaign by its verdicts (not by a noisy mean), and say why every other
point lost, from stored evidence: slower by x% [CI], a failed gate, out of memory, unstable, failed."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import EXIT_INCONCLUSIVE, RunError, UsageError
from orchestrator.judge.best import (
    Choice,
    choose,
    clearly_worse,
    figure,
    fmt_decision,
    full_length,
    metric,
    versus,
)
from orchestrator.judge.compare import Metric, Point, load_points
from orchestrator.run.regate import gates_of, judge_campaign
from orchestrator.run.store import INGEST_LAUNCHER, Store
from orchestrator.spec.search import Search
from reports import compare as stats

OBJECTIVES = {"tflops": "tflops", "step_time": "step_time"}
SEARCH_OBJECTIVES = {"tflops_per_gpu": "tflops", "step_time_ms": "step_time"}  # sweep.search.objective → --by
TIE_BREAKS = {"memory": "peak_alloc", "step_time": "step_time", "tflops": "tflops"}


@dataclass
class Rejected:
    """A point that is not the winner, and why (from stored evidence)."""

    point_id: str
    label: str
    why: str
    kind: str  # slower | tie | gate | failed | oom | unstable | unfinished | infeasible | short run | reference | constraint


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
    """Points skipped before submission (the store's `estimates` table, orchestrator/run/feasibility.py): a layout
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


class Tied(RunError):
    """The best is a tie that no figure separates: freeze one with --point (exit 3, as an undecided verdict)."""

    exit_code = EXIT_INCONCLUSIVE


def search_of(record: dict[str, Any]) -> Search | None:
    """The stored campaign's `sweep.search` (None: not a search)."""
    found = ((record.get("spec") or {}).get("sweep") or {}).get("search")
    return Search.model_validate(found) if found else None


def search_rejected(points: list[Point], search: Search, trials: list[dict[str, Any]]) -> dict[str, Rejected]:
    """A search's points that cannot win: shorter runs of its rungs, runs that are not candidates (the base
    recipe), and full-length trials the search excluded (a constraint), each with why."""
    rows = {r["point_id"]: r for r in trials if r.get("point_id")}
    out: dict[str, Rejected] = {}
    for p in points:
        row = rows.get(p.point_id)
        if not full_length(p.params, search):
            steps = p.params.get(search.steps_key)
            out[p.point_id] = Rejected(p.point_id, p.label, f"a {steps}-step trial of the search's rung "
                                       f"{row['rung'] if row else '?'}: only full-length trials can win", "short run")  # fmt: skip
        elif row is None:
            out[p.point_id] = Rejected(p.point_id, p.label, "not a search candidate (the base recipe, run as the "
                                       "loss reference)", "reference")  # fmt: skip
        elif row["state"] in ("excluded", "failed", "infeasible"):
            out[p.point_id] = Rejected(p.point_id, p.label, row.get("reason") or row["state"], "constraint")
    return out


def _reason(winner: Point, other: Point, choice: Choice, goal: Metric, breaker: Metric, min_effect: float) -> Rejected:
    d = versus(winner, other, goal, min_effect)
    worse = "slower" if (d.change or 0) * (1 if goal.higher_is_worse else -1) > 0 else "faster"
    if any(p is other for p in choice.tied) or not clearly_worse(d, goal, min_effect):
        mine, theirs = figure(winner, breaker)[0], figure(other, breaker)[0]
        detail = f"{breaker.label} {theirs:.4g} vs {mine:.4g}" if mine and theirs else f"no {breaker.label} figure"
        return Rejected(other.point_id, other.label, f"tied with the winner in {goal.label}: "
                        f"{fmt_decision(d)}; lost the tie-break ({detail})", "tie")  # fmt: skip
    return Rejected(other.point_id, other.label, f"{worse} than the winner in {goal.label} by "
                    f"{fmt_decision(d)}", "slower")  # fmt: skip


def refuse_ingested(record: dict[str, Any], campaign: str, what: str) -> None:
    """UsageError for a campaign `mbx ingest` made from logs: it has no recipe or command mbx could rerun."""
    if record.get("launcher") == INGEST_LAUNCHER:
        raise UsageError(f"{campaign}: ingested from logs (mbx ingest): {what} needs a point mbx can rerun; compare "
                         "it (mbx compare) or gate it (mbx card check) instead")  # fmt: skip


def freeze(
    workspace: Path, campaign: str, *, point: str | None = None, objective: str | None = None,
    tie_break: str = "memory", min_effect: float | None = None,
) -> Frozen:  # fmt: skip
    """The winner (`point`, or the best by orchestrator/judge/best.py's rule) and every other point's reason. For a
    search the objective and threshold default to its own, and only its full-length trials can win. A tie no
    figure separates raises Tied (exit 3) unless `point` names one."""
    with Store(workspace, create=False) as store:
        points = load_points(store, campaign)
        record = store.campaign(campaign) or {}
        search = search_of(record)
        excluded = _excluded(store, campaign, points)
        if search is not None:
            excluded = {**search_rejected(points, search, store.trials(campaign)), **excluded}
        infeasible = [r for r in infeasible_rejected(store, campaign) if r.point_id not in excluded]
        cells = {c.point_id: c for c in store.cells(campaign)}
    refuse_ingested(record, campaign, "mbx freeze")
    objective = objective or (SEARCH_OBJECTIVES[search.objective] if search else "tflops")
    if objective not in OBJECTIVES or tie_break not in TIE_BREAKS:
        raise UsageError(f"--by {objective} / --tie-break {tie_break}: choose --by from {', '.join(OBJECTIVES)} and "
                         f"--tie-break from {', '.join(TIE_BREAKS)}")  # fmt: skip
    if min_effect is None:
        min_effect = search.min_effect if search else stats.MIN_EFFECT
    goal, breaker = metric(OBJECTIVES[objective]), metric(TIE_BREAKS[tie_break])
    eligible = [p for p in points if p.point_id not in excluded and p.repeats]
    choice = choose(eligible, goal, min_effect, breaker)
    if point is not None:
        chosen = next((p for p in points if point in (p.point_id, p.label, *p.cell_ids)), None)
        if chosen is None:
            raise UsageError(f"--point {point!r}: campaign {campaign!r} has no such point "
                             f"(points: {', '.join(p.point_id for p in points)})")  # fmt: skip
        if chosen.point_id in excluded:
            raise UsageError(f"--point {point!r} cannot be frozen: {excluded[chosen.point_id].why}")
        winner, how = chosen, "chosen with --point"
    elif choice.undecided:
        raise Tied(f"{campaign}: {choice.how}; freeze one of them with --point")
    elif choice.winner is None:
        lines = "; ".join(f"{r.point_id} [{r.label}]: {r.why}" for r in [*excluded.values(), *infeasible])
        raise RunError(f"{campaign}: no point can be frozen: {lines or 'no completed point'}")
    else:
        winner, how = choice.winner, choice.how
    rejected = [_reason(winner, p, choice, goal, breaker, min_effect) for p in eligible if p is not winner]
    rejected += [*excluded.values(), *infeasible]
    cell = cells[winner.point_id]
    return Frozen(campaign, record.get("spec") or {}, record.get("source_file"), winner, how, goal, rejected,
                  recipe=cell.recipe, resources=cell.resources, trainer_kind=cell.trainer_kind)  # fmt: skip
