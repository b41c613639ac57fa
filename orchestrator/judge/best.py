"""The one notion of "best": which completed point wins by the verdicts, how (with its confidence, or the tie and
the figure that broke it), and the Pareto front; shared by the search, `mbx freeze`, the report, summary.md and
`mbx campaign status`.

The rule (`choose`), the one `mbx freeze --help` states: the leader by mean of the objective; every other point is
compared with it (orchestrator/judge/compare.py's verdicts). The one tie rule (`loses`): a point DIFFERENT (worse)
than the leader lost; every other point (SAME, SAME in practice, UNKNOWN) is tied with the leader and says so. A
tie is broken only by a figure every tied point has and that actually separates them (the best differs from the
next by more than the threshold); otherwise there is no winner: "tie — no figure separates them". Which points
may enter is the caller's: completed, passed every gate and parity check, stable, and in a search only
full-length trials (`full_length`). A side of one run is compared with its within-run CI widened by the
run-to-run floor (`floors`, orchestrator/judge/run_floor.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.judge.compare import METRICS, Metric, Point, compare_pair
from orchestrator.judge.run_floor import FloorBook
from reports import compare as stats
from reports.pvalue import p_claim

TIE = "tie — no figure separates them"


def metric(name: str) -> Metric:
    """The orchestrator.judge.compare metric of that name (tflops, step_time, peak_alloc, ...)."""
    return next(m for m in METRICS if m.name == name)


def mean(point: Point | None, key: str) -> float | None:
    """Mean of a summary figure over the point's completed repeats (None: no repeat has it)."""
    values = [r.summary.get(key) for r in (point.repeats if point else [])]
    found = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(found) / len(found) if found else None


def memory(point: Point | None) -> tuple[float | None, str]:
    """(GiB, label) of a point's peak memory: its mean peak allocated GPU memory, else (a CPU run, where that is
    0) the largest resident set size its rows recorded; (None, ...) when neither is there."""
    peak = mean(point, "peak_alloc_gib")
    if peak:
        return peak, "peak allocated"
    rss = [float(r["rss_gib"]) for rep in (point.repeats if point else []) for r in rep.rows
           if isinstance(r.get("rss_gib"), (int, float)) and r["rss_gib"] > 0]  # fmt: skip
    return (max(rss), "peak RSS") if rss else (None, "peak allocated")


def figure(point: Point, by: Metric) -> tuple[float | None, str]:
    """A tie-break figure of a point and its label (memory: measured peak, 0 on a CPU counts as absent)."""
    if by.name == "peak_alloc":
        return memory(point)
    value = mean(point, by.summary_key)
    return value, by.label


def versus(leader: Point, other: Point, objective: Metric, min_effect: float,
           floors: FloorBook | None = None) -> stats.Decision:  # fmt: skip
    """The verdict on `other` relative to `leader` for the objective."""
    return compare_pair(leader, other, (objective,), min_effect, floors=floors).decisions[objective.name]


def loses(decision: stats.Decision, objective: Metric) -> bool:
    """The one tie rule: a point loses to the leader only when DIFFERENT (worse) in the objective; any other verdict
    (SAME, SAME in practice, UNKNOWN) ties it with the leader."""
    return stats.is_bad(decision, objective.higher_is_worse)


def fmt_decision(d: stats.Decision) -> str:
    """`+2.10% [+1.20%, +3.00%] (DIFFERENT, p=0.0012, 3 vs 3 repeats)`, with the run-to-run floor of a side of
    one run."""
    change = "" if d.change is None else f"{d.change:+.2%}"
    ci = "" if d.ci_low is None or d.ci_high is None else f" [{d.ci_low:+.2%}, {d.ci_high:+.2%}]"
    p = "" if d.p_value is None else f", {p_claim(d.p_value)}"
    floor = "" if d.run_floor is None else f"; {stats.single_run_note(d.n_a, d.n_b, d.run_floor)}"
    return f"{change}{ci} ({d.decision.upper()}{p}, {d.n_a} vs {d.n_b} repeats{floor})"


@dataclass
class Choice:
    """The outcome of `choose`: the winner (None: nothing eligible, or a tie no figure separates), how it was
    chosen, the points tied with the leader (leader first; empty without a tie) and each point's verdict
    against the leader."""

    winner: Point | None
    how: str
    tied: list[Point] = field(default_factory=list)
    decisions: dict[str, stats.Decision] = field(default_factory=dict)
    leader: Point | None = None

    @property
    def is_tie(self) -> bool:
        return len(self.tied) > 1

    @property
    def undecided(self) -> bool:
        """A tie that no figure separates: there is no winner."""
        return self.winner is None and self.is_tie


def choose(eligible: list[Point], objective: Metric, min_effect: float = stats.MIN_EFFECT,
           tie_break: Metric | None = None, floors: FloorBook | None = None) -> Choice:  # fmt: skip
    """The best of `eligible` by the verdicts (see the module docstring for the rule); `tie_break` defaults to
    memory; `floors`: the workspace's run-to-run floors for points of one run (else the stated default)."""
    tie_break = tie_break or metric("peak_alloc")
    sign = 1 if objective.higher_is_worse else -1
    scored = [p for p in eligible if mean(p, objective.summary_key) is not None]
    if not scored:
        return Choice(None, f"no eligible point has a {objective.label} figure")
    ranked = sorted(scored, key=lambda p: sign * (mean(p, objective.summary_key) or 0.0))
    leader = ranked[0]
    if len(ranked) == 1:
        value = mean(leader, objective.summary_key) or 0.0
        return Choice(leader, f"the only eligible point ({objective.label} {value:.4g})", leader=leader)
    decisions = {p.point_id: versus(leader, p, objective, min_effect, floors) for p in ranked[1:]}
    tied = [leader, *(p for p in ranked[1:] if not loses(decisions[p.point_id], objective))]
    if len(tied) == 1:
        runner = ranked[1]
        how = (f"best {objective.label}: the runner-up {runner.point_id} differs by "
               f"{fmt_decision(decisions[runner.point_id])}")  # fmt: skip
        return Choice(leader, how, [], decisions, leader)
    return _break_tie(tied, objective, tie_break, min_effect, decisions, leader)


def _break_tie(tied: list[Point], objective: Metric, tie_break: Metric, min_effect: float,
               decisions: dict[str, stats.Decision], leader: Point) -> Choice:  # fmt: skip
    """A tie settled by `tie_break` only when every tied point has the figure and the best one is ahead of the
    next by more than `min_effect` (relative); else no winner."""
    names = ", ".join(p.point_id for p in tied)
    unknown = any(decisions[p.point_id].decision == stats.UNKNOWN for p in tied[1:])
    head = (f"TIE: {len(tied)} points are not DIFFERENT in {objective.label} (min effect {min_effect:.0%}): "
            f"{names}" + (" (some UNKNOWN: more repeats may separate them)" if unknown else ""))  # fmt: skip
    values = {p.point_id: figure(p, tie_break) for p in tied}
    label = next(iter(values.values()))[1]
    missing = [p.point_id for p in tied if not values[p.point_id][0]]
    lower = tie_break.higher_is_worse
    shown = " vs ".join(f"{values[p.point_id][0]:.4g}" if values[p.point_id][0] else "none" for p in tied)
    if missing:
        return Choice(None, f"{head}; {TIE}: {label} is not known for {', '.join(missing)} ({shown})", tied,
                      decisions, leader)  # fmt: skip
    order = sorted(tied, key=lambda p: (1 if lower else -1) * (values[p.point_id][0] or 0.0))
    best, second = (values[p.point_id][0] or 0.0 for p in order[:2])
    gap = abs(best - second) / max(abs(best), abs(second))
    if gap <= min_effect:
        return Choice(None, f"{head}; {TIE}: {label} {shown} (within {min_effect:.0%})", tied, decisions, leader)
    how = (f"{head}; broken by {'lower' if lower else 'higher'} {label}: {shown} "
           f"({order[0].point_id} ahead of the next by {gap:.1%}, more than {min_effect:.0%})")  # fmt: skip
    return Choice(order[0], how, tied, decisions, leader)


def pareto(points: list[Point], objective: Metric) -> list[Point]:
    """Every point no other point beats on both the objective and peak memory (means; both figures needed),
    best objective first."""
    sign = 1 if objective.higher_is_worse else -1
    costs = {}
    for p in points:
        value, (mem, _label) = mean(p, objective.summary_key), memory(p)
        if value is not None and mem is not None:
            costs[id(p)] = (sign * value, mem)

    def dominated(mine: tuple[float, float]) -> bool:
        return any(o[0] <= mine[0] and o[1] <= mine[1] and o != mine for o in costs.values())

    front = [p for p in points if id(p) in costs and not dominated(costs[id(p)])]
    return sorted(front, key=lambda p: costs[id(p)])


def full_length(params: dict[str, Any], search: Any) -> bool:
    """Whether a search's point ran at the length its best is picked at: the campaign's own length (the steps
    key is not swept), or a halving's last rung."""
    key = search.steps_key
    if key not in params:
        return True
    return search.method == "halving" and params[key] == search.halving.steps[-1]
