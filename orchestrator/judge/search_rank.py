"""Ranks a search's evidence by verdicts: candidates, evidence, exclusions, the best, the Pareto front."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.judge import best as best_rule
from orchestrator.judge.compare import METRICS, Metric, Point
from orchestrator.judge.run_floor import FloorBook
from orchestrator.spec.search import Search
from orchestrator.spec.sweep import canonical_json
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
    return best_rule.mean(point, key)


def memory_of(point: Point | None) -> float | None:
    """Peak memory of a point in GiB (orchestrator/judge/best.py's `memory`: peak allocated, else a CPU run's RSS)."""
    return best_rule.memory(point)[0]


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
    """Eligible points best first: the leader by mean, then the points tied with it (not DIFFERENT (worse):
    orchestrator/judge/best.py's one tie rule), by mean, then the ones that lost (by mean); each with its verdict
    against the leader (None for the leader)."""
    sign = 1 if metric.higher_is_worse else -1
    by_mean = sorted(evidences, key=lambda e: sign * (mean_of(e.point, metric.summary_key) or 0.0))
    if not by_mean:
        return []
    leader, decided = by_mean[0], []
    for other in by_mean[1:]:
        assert leader.point is not None and other.point is not None
        decision = best_rule.versus(leader.point, other.point, metric, min_effect)
        decided.append((other, decision))
    contenders = [(e, d) for e, d in decided if not best_rule.loses(d, metric)]
    worse = [(e, d) for e, d in decided if best_rule.loses(d, metric)]
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
    tie: bool = False  # a tie no figure separates: no best point
    # points that stopped at a shorter run length but are on the front for memory (`memory_front`)
    memory_front: list[Evidence] = field(default_factory=list)


def target_steps(search: Search, full_steps: int) -> int:
    """The run length the best is picked at: a halving's last rung, else the campaign's full length."""
    return search.halving.steps[-1] if search.method == "halving" else full_steps


def pick(evidences: list[Evidence], search: Search, base: dict[int, Evidence | None], steps: int,
         floors: FloorBook | None = None) -> Best:  # fmt: skip
    """The best eligible full-length (`steps`) point by orchestrator/judge/best.py's rule (`floors`: the workspace's
    run-to-run floors, as `mbx freeze` reads them, so both name one point), and the Pareto front."""
    eligible = [e for e in evidences if e.steps == steps and exclusion(e, search, base.get(e.steps)) is None]
    if not eligible:
        short = any(e.state == "completed" and e.steps != steps for e in evidences)
        why = f"no trial ran to the full length ({steps} steps)" if short else ""
        return Best(None, why or "no point completed and met the gates and constraints")
    by_id = {id(e.point): e for e in eligible}
    points = [e.point for e in eligible if e.point]
    choice = best_rule.choose(points, metric_of(search.metric), search.min_effect, floors=floors)
    front = [by_id[id(p)] for p in best_rule.pareto(points, metric_of(search.metric))]
    winner = by_id[id(choice.winner)] if choice.winner is not None else None
    return Best(winner, choice.how, front, tie=choice.undecided)


def memory_front(runs: list[Evidence], search: Search, base: dict[int, Evidence | None], steps: int) -> list[Evidence]:
    """Points that stopped before the full length (`steps`) yet are on the Pareto front for memory, which does
    not depend on run length: non-dominated among every eligible run of their own length (objective and peak
    memory compared like with like, at the same run length). Their objective is a shorter run's and is never
    compared with a full-length one: the front's objective values come from full-length trials only."""
    full = {e.candidate.key for e in runs if e.steps == steps}
    front: list[Evidence] = []
    for length in sorted({e.steps for e in runs if e.steps < steps}):
        eligible = [e for e in runs if e.steps == length and exclusion(e, search, base.get(length)) is None]
        by_id = {id(e.point): e for e in eligible}
        kept = best_rule.pareto([e.point for e in eligible if e.point], metric_of(search.metric))
        front += [by_id[id(p)] for p in kept if by_id[id(p)].candidate.key not in full]
    last = {e.candidate.key: e for e in front}  # a point's longest run on the front
    return list(last.values())
