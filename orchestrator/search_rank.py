"""Ranks a search's evidence by verdicts: candidates, evidence, exclusions, the best, the Pareto front."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.compare import METRICS, Metric, Point, compare_pair
from orchestrator.freeze import pick_best
from orchestrator.search import Search
from orchestrator.sweep import canonical_json
from reports import compare as stats

BASE_KEY = "base"  # the candidate key of the base recipe (the campaign without its sweep)


@dataclass(frozen=True)
class Candidate:
    """One point of the search space: its swept values (without the run length) and its label."""

    key: str
    label: str
    params: dict[str, Any]


def candidate_key(params: dict[str, Any], steps_key: str) -> str:
    return canonical_json({k: v for k, v in params.items() if k != steps_key})


@dataclass
class Evidence:
    """What running one candidate at one run length gave: completed repeats, or why there are none."""

    candidate: Candidate
    steps: int
    state: str  # completed | infeasible | failed
    point: Point | None = None
    reason: str | None = None
    verdict: str = "none"  # the point's gate verdict: pass | fail | inconclusive | none
    cost_steps: int = 0
    gpu_hours: float = 0.0


def metric_of(name: str) -> Metric:
    return next(m for m in METRICS if m.name == name)


def mean_of(point: Point | None, key: str) -> float | None:
    values = [r.summary.get(key) for r in (point.repeats if point else [])]
    found = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(found) / len(found) if found else None


def memory_of(point: Point | None) -> float | None:
    """Peak memory of a point in GiB: its mean peak allocated GPU memory, else (a CPU run, where that is 0) the
    largest resident set size its rows recorded (`rss_gib`)."""
    peak = mean_of(point, "peak_alloc_gib")
    if peak:
        return peak
    rss = [float(r["rss_gib"]) for rep in (point.repeats if point else []) for r in rep.rows
           if isinstance(r.get("rss_gib"), (int, float))]  # fmt: skip
    return max(rss) if rss else peak


# ---- verdicts between points ------------------------------------------------------------------------------
def exclusion(evidence: Evidence, search: Search, base: Evidence | None) -> str | None:
    """Why a completed point cannot be the best (None: it can): unstable, a gate not passed, a constraint."""
    if evidence.state != "completed" or evidence.point is None:
        return evidence.reason or evidence.state
    for r in evidence.point.repeats:
        s = r.summary
        if not s.get("loss_finite", True) or s.get("nan_iterations") or s.get("skipped_iterations"):
            return f"unstable: {r.cell_id} (loss finite={s.get('loss_finite')}, NaN={s.get('nan_iterations') or 0})"
    if evidence.verdict in ("fail", "inconclusive"):
        return f"gate {evidence.verdict}"
    limits = search.constraints
    peak = mean_of(evidence.point, "peak_alloc_gib")
    if limits.peak_memory_gib_max is not None and peak is not None and peak > limits.peak_memory_gib_max:
        return f"peak memory {peak:.3g} GiB > {limits.peak_memory_gib_max:g} GiB"
    if limits.loss_tolerance is not None:
        return loss_problem(evidence, base, limits.loss_tolerance)
    return None


def loss_problem(evidence: Evidence, base: Evidence | None, tolerance: float) -> str | None:
    """The point's final loss against the base recipe's at the same run length (None: within tolerance)."""
    ref = mean_of(base.point if base else None, "last_loss")
    loss = mean_of(evidence.point, "last_loss")
    if ref is None or loss is None:
        return "loss parity not decidable: the base recipe has no completed run at this length"
    if loss > ref * (1 + tolerance):
        return f"final loss {loss:.4g} > base {ref:.4g} × (1 + {tolerance:g})"
    return None


def rank(
    evidences: list[Evidence], metric: Metric, min_effect: float
) -> list[tuple[Evidence, stats.Decision | None]]:
    """Eligible points best first: the leader by mean, then the points not DIFFERENT (worse) than it (by mean),
    then the ones that are (by mean); each with its verdict against the leader (None for the leader)."""
    sign = 1 if metric.higher_is_worse else -1
    by_mean = sorted(evidences, key=lambda e: sign * (mean_of(e.point, metric.summary_key) or 0.0))
    if not by_mean:
        return []
    leader, decided = by_mean[0], []
    for other in by_mean[1:]:
        assert leader.point is not None and other.point is not None
        decision = compare_pair(leader.point, other.point, (metric,), min_effect).decisions[metric.name]
        decided.append((other, decision))
    contenders = [(e, d) for e, d in decided if not stats.is_bad(d, metric.higher_is_worse)]
    worse = [(e, d) for e, d in decided if stats.is_bad(d, metric.higher_is_worse)]
    return [(leader, None), *contenders, *worse]


def verdict_text(decision: stats.Decision | None) -> str:
    if decision is None:
        return "the leader"
    change = "" if decision.change is None else f" {decision.change:+.1%}"
    return f"{decision.decision.upper()}{change} vs the leader"


@dataclass
class Best:
    """The search's answer: the best point with how it was chosen, and the Pareto front."""

    evidence: Evidence | None
    how: str
    pareto: list[Evidence] = field(default_factory=list)


def pick(evidences: list[Evidence], search: Search, base: dict[int, Evidence | None]) -> Best:
    """The best eligible point by the verdicts (freeze's pick, tie broken by lower peak memory)."""
    eligible = [e for e in evidences if exclusion(e, search, base.get(e.steps)) is None]
    if not eligible:
        return Best(None, "no point completed and met the gates and constraints")
    by_id = {id(e.point): e for e in eligible}
    winner, how, _tied = pick_best([e.point for e in eligible if e.point], metric_of(search.metric),
                                    metric_of("peak_alloc"), search.min_effect)  # fmt: skip
    return Best(by_id[id(winner)], how, pareto_front(eligible, search))


def pareto_front(evidences: list[Evidence], search: Search) -> list[Evidence]:
    """Points no other point beats on both the objective and peak memory (by their means)."""
    metric = metric_of(search.metric)
    sign = 1 if metric.higher_is_worse else -1

    def cost(e: Evidence) -> tuple[float, float]:
        return sign * (mean_of(e.point, metric.summary_key) or 0.0), memory_of(e.point) or 0.0

    front = []
    for e in evidences:
        mine = cost(e)
        if not any(cost(o) <= mine and cost(o) != mine for o in evidences):
            front.append(e)
    return sorted(front, key=cost)
