"""`mbx freeze`: pick the winner of a campaign by its verdicts (not by a noisy mean), and say why every other
point lost, from stored evidence: slower by x% [CI], tied and lost the tie-break, a failed gate or parity check,
out of memory, unstable, failed. A point that failed a check never wins; `--point` freezes one anyway only with
`--allow-failed REASON`, and a chosen point that is not the best says where it stands and why the others were
not chosen (their verdicts against it)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import RunError, UsageError
from orchestrator.judge import verdict_kinds
from orchestrator.judge.best import Choice, choose, figure, fmt_decision, full_length, loses, metric, versus
from orchestrator.judge.compare import Metric, Point, floors_of, load_points
from orchestrator.judge.outcome import FAIL, INCONCLUSIVE, Outcome, Part, exit_code
from orchestrator.judge.run_floor import FloorBook
from orchestrator.rows import DEFAULT_KIND
from orchestrator.run.regate import gates_of, judge_campaign
from orchestrator.run.store import INGEST_LAUNCHER, Store
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.search import Search
from reports import compare as stats

OBJECTIVES = {"tflops": "tflops", "step_time": "step_time"}
SEARCH_OBJECTIVES = {"tflops_per_gpu": "tflops", "step_time_ms": "step_time"}  # sweep.search.objective → --by
TIE_BREAKS = {"memory": "peak_alloc", "step_time": "step_time", "tflops": "tflops"}
UNDECIDED_TRIALS = {  # a short run's trial state (orchestrator/judge/search_ledger.py) → why it is not decided
    "promoted": "kept for a longer run the search never made (it stopped first)",
    "completed": "its rung was never ranked (the search stopped first)",
}


@dataclass
class Rejected:
    """A point that is not the winner, and why (from stored evidence)."""

    point_id: str
    label: str
    why: str
    # slower | tie | not chosen | no figure | gate | parity | failed | oom | unstable | unfinished | infeasible |
    # short run | reference | constraint
    kind: str
    verdict: str = FAIL  # inconclusive: not decided yet (a gate or parity pair undecided, a repeat not finished)


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
    trainer_kind: str = DEFAULT_KIND
    frozen_at: str = field(default_factory=lambda: dt.date.today().isoformat())
    allowed_failed: str | None = None  # --allow-failed: the failed check and the reason given


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
                verdict = INCONCLUSIVE if kind == "unfinished" else FAIL
                out[point.point_id] = Rejected(point.point_id, point.label, why + reason, kind, verdict)
                break
        if point.point_id in out:
            continue
        unstable = _unstable(point)
        verdict = verdicts.get(point.point_id)
        if unstable:
            out[point.point_id] = Rejected(point.point_id, point.label, unstable, "unstable")
        elif verdict is not None and verdict.verdict in ("fail", "inconclusive"):
            out[point.point_id] = Rejected(point.point_id, point.label, f"gate {verdict.verdict}: {verdict.why()}",
                                           "gate", verdict.verdict)  # fmt: skip
    return {**verdict_rejected(store, name, record), **out}


def verdict_rejected(store: Store, name: str, record: dict[str, Any]) -> dict[str, Rejected]:
    """The points a verdict kind's record that did not pass rules out (each kind's `blame`: for parity, the side
    under test, never the reference), each with its record and reason, under the kind's name; the records judged
    in memory from their run dirs (orchestrator/judge/verdict_kinds.py)."""
    spec = record.get("spec") or {}
    if not verdict_kinds.asked_in_spec(spec):
        return {}
    campaign = Campaign.model_validate(spec)
    cells = {c.cell_id: c for c in store.cells(name)}
    out: dict[str, Rejected] = {}
    for kind in verdict_kinds.asked(campaign):
        for cell_id, (verdict, why) in kind.blame(kind.judge(store, name, campaign)).items():
            cell = cells.get(cell_id)
            if cell is not None and cell.point_id not in out:
                out[cell.point_id] = Rejected(cell.point_id, cell.label, why, kind.name, verdict)
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


class NoWinner(RunError):
    """No point can be frozen: undecided (a tie no figure separates, or points whose checks are not decided yet:
    exit 3) or failed (every point failed a check: exit 1); `outcome` is the closing line that says so."""

    def __init__(self, message: str, verdict: str, rejected: list[Rejected] | None = None,
                 nothing: str = "nothing frozen"):  # fmt: skip
        super().__init__(message)
        self.verdict, self.rejected, self.nothing = verdict, rejected or [], nothing

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return exit_code(self.verdict)

    def outcome(self) -> Outcome:
        """The one closing line (orchestrator/judge/outcome.py): its word, why nothing was frozen."""
        return Outcome("", (Part("freeze", self.verdict, f"{self}; {self.nothing}"),))


class Refused(NoWinner):
    """`--point` names a point ruled out by a check: FAIL (exit 1) when it failed the check, INCONCLUSIVE (exit 3)
    when the check is not decided yet (an inconclusive gate or parity pair, a repeat not finished)."""


class Tied(NoWinner):
    """The best is a tie that no figure separates: freeze one with --point (exit 3, as an undecided verdict)."""

    def __init__(self, message: str, rejected: list[Rejected] | None = None):
        super().__init__(message, INCONCLUSIVE, rejected)


def search_of(record: dict[str, Any]) -> Search | None:
    """The stored campaign's `sweep.search` (None: not a search)."""
    found = ((record.get("spec") or {}).get("sweep") or {}).get("search")
    return Search.model_validate(found) if found else None


def search_rejected(points: list[Point], search: Search, trials: list[dict[str, Any]]) -> dict[str, Rejected]:
    """A search's points that cannot win: shorter runs of its rungs, runs that are not candidates (the base
    recipe), and full-length trials the search excluded (a constraint), each with why. A short run the search
    kept (promoted) or never ranked before the search stopped (the budget ran out first) is undecided, not
    failed: more budget may make it the best (`short_run`)."""
    rows = {r["point_id"]: r for r in trials if r.get("point_id")}
    last_rung: dict[Any, int] = {}
    for r in trials:
        last_rung[r.get("trial")] = max(last_rung.get(r.get("trial"), 0), int(r.get("rung") or 0))
    out: dict[str, Rejected] = {}
    for p in points:
        row = rows.get(p.point_id)
        if not full_length(p.params, search):
            went_on = row is not None and last_rung.get(row.get("trial"), 0) > int(row.get("rung") or 0)
            out[p.point_id] = short_run(p, search, None if row is None else {**row, "went_on": went_on})
        elif row is None:
            out[p.point_id] = Rejected(p.point_id, p.label, "not a search candidate (the base recipe, run as the "
                                       "loss reference)", "reference")  # fmt: skip
        elif row["state"] in ("excluded", "failed", "infeasible") and not _gate_only(row):
            out[p.point_id] = Rejected(p.point_id, p.label, row.get("reason") or row["state"], "constraint")
    return out


def short_run(point: Point, search: Search, row: dict[str, Any] | None) -> Rejected:
    """A shorter run of a search's rung: never a winner; undecided (INCONCLUSIVE) when the search stopped before
    it was dropped or its trial ran a longer rung (UNDECIDED_TRIALS; `row["went_on"]`: it did), else lost in its
    rung or decided by its longer run (FAIL)."""
    steps = point.params.get(search.steps_key)
    head = f"a {steps}-step trial of the search's rung {row['rung'] if row else '?'}"
    if row is not None and row.get("state") in UNDECIDED_TRIALS and not row.get("went_on"):
        return Rejected(point.point_id, point.label, f"{head}: {UNDECIDED_TRIALS[row['state']]}: not decided; only "
                        "full-length trials can win", "short run", INCONCLUSIVE)  # fmt: skip
    return Rejected(point.point_id, point.label, f"{head}: only full-length trials can win", "short run")


def _gate_only(row: dict[str, Any]) -> bool:
    """A trial the search excluded for its gate verdict alone (orchestrator/judge/search_rank.py's `exclusion`):
    `_excluded` judges that gate again with the campaign's current gates, so a gate changed since decides."""
    return row["state"] == "excluded" and str(row.get("reason") or "").startswith("gate ")


def _lost(other: Point, choice: Choice, goal: Metric, breaker: Metric) -> Rejected:
    """Why `other` lost to the best by the rule: its verdict against the leader (the one the tie rule reads) and,
    when tied, the tie-break figures."""
    winner, leader = choice.winner, choice.leader
    assert winner is not None and leader is not None
    d = choice.decisions.get(other.point_id)
    if other is leader:  # the winner won the tie-break over the leader by mean
        return Rejected(other.point_id, other.label, f"the leader by mean {goal.label}, tied with the winner (the "
                        f"winner against it: {fmt_decision(choice.decisions[winner.point_id])}); lost the tie-break "
                        f"({_tie_break(winner, other, breaker)})", "tie")  # fmt: skip
    if d is None:
        return Rejected(other.point_id, other.label, f"no {goal.label} figure", "no figure")
    than = "the winner" if leader is winner else f"the leader {leader.point_id}"
    if loses(d, goal):
        return Rejected(other.point_id, other.label, f"slower than {than} in {goal.label}: {fmt_decision(d)}",
                        "slower")  # fmt: skip
    return Rejected(other.point_id, other.label, f"tied with {than} in {goal.label} (not DIFFERENT): "
                    f"{fmt_decision(d)}; lost the tie-break ({_tie_break(winner, other, breaker)})", "tie")  # fmt: skip


def tie_losers(choice: Choice, eligible: list[Point], goal: Metric) -> list[Rejected]:
    """The points that lost to the leader of a tie no figure separates (DIFFERENT, worse): rejected with their
    verdict against it, though the tied points are not decided yet."""
    leader = choice.leader
    if leader is None:
        return []
    return [Rejected(p.point_id, p.label, f"slower than the leader {leader.point_id} in {goal.label} (the points "
                     f"tied with it are not decided yet): {fmt_decision(choice.decisions[p.point_id])}", "slower")
            for p in eligible if p.point_id in choice.decisions and p not in choice.tied]  # fmt: skip


def _tie_break(winner: Point, other: Point, breaker: Metric) -> str:
    mine, theirs = figure(winner, breaker)[0], figure(other, breaker)[0]
    if not mine or not theirs:
        return f"no {breaker.label} figure"
    return f"{breaker.label} {theirs:.4g} vs the winner's {mine:.4g}"


def _not_chosen(chosen: Point, other: Point, goal: Metric, min_effect: float, floors: FloorBook) -> Rejected:
    """Why `other` is not frozen when `--point` chose `chosen`: its verdict against the chosen point."""
    d = versus(chosen, other, goal, min_effect, floors)
    if loses(d, goal):
        return Rejected(other.point_id, other.label, f"slower than the chosen point in {goal.label}: "
                        f"{fmt_decision(d)}", "slower")  # fmt: skip
    better = "faster than" if d.decision == stats.DIFFERENT else "not DIFFERENT from"
    return Rejected(other.point_id, other.label, f"{better} the chosen point in {goal.label}: {fmt_decision(d)}; "
                    f"not chosen (--point chose {chosen.point_id})", "not chosen")  # fmt: skip


def _standing(chosen: Point, choice: Choice, goal: Metric, min_effect: float, floors: FloorBook) -> str:
    """`--point`'s how: where the chosen point stands against the best by the verdicts."""
    if choice.winner is chosen:
        return f"chosen with --point; it is also the best by the verdicts: {choice.how}"
    if choice.winner is None:
        return f"chosen with --point; the verdicts pick no best: {choice.how}"
    d = versus(choice.winner, chosen, goal, min_effect, floors)
    return (f"chosen with --point; the best by the verdicts is {choice.winner.point_id} [{choice.winner.label}] "
            f"({choice.how}); the chosen point against it in {goal.label}: {fmt_decision(d)}")  # fmt: skip


def _allowed(
    chosen: Point, excluded: dict[str, Rejected], point: str, allow_failed: str | None, done: str = "frozen",
    campaign: str = "",
) -> str | None:  # fmt: skip
    """The check the chosen point failed (or has not passed yet) and the reason it is `done` anyway (None: it is
    ruled out by none); Refused naming the check unless `--allow-failed` gives a reason and the point has
    completed repeats: FAIL (exit 1) for a failed check, INCONCLUSIVE (exit 3) for one not decided yet."""
    failed = excluded.get(chosen.point_id)
    if failed is None:
        return None
    if allow_failed and chosen.repeats:
        return f"{failed.why}; {done} anyway with --allow-failed: {allow_failed}"
    hint = (f" (it has no completed repeat to be {done})" if not chosen.repeats else
            f'; --allow-failed "REASON" gets it {done} anyway, with that reason written beside the check')  # fmt: skip
    state = "it failed a check" if failed.verdict == FAIL else "its check is not decided yet"
    nothing = "nothing frozen" if done == "frozen" else f"nothing {done}"
    raise Refused(f"{campaign}: --point {point!r} cannot be {done}: {state} ({failed.kind}): {failed.why}{hint}",
                  FAIL if failed.verdict == FAIL else INCONCLUSIVE, [failed], nothing)  # fmt: skip


def refuse_ingested(record: dict[str, Any], campaign: str, what: str) -> None:
    """UsageError for a campaign `mbx ingest` made from logs: it has no recipe or command mbx could rerun."""
    if record.get("launcher") == INGEST_LAUNCHER:
        raise UsageError(f"{campaign}: ingested from logs (mbx ingest): {what} needs a point mbx can rerun; compare "
                         "it (mbx compare) or gate it (mbx card check) instead")  # fmt: skip


def freeze(
    workspace: Path, campaign: str, *, point: str | None = None, objective: str | None = None,
    tie_break: str = "memory", min_effect: float | None = None, allow_failed: str | None = None,
    done: str = "frozen",
) -> Frozen:  # fmt: skip
    """The winner (`point`, or the best by orchestrator/judge/best.py's rule) and every other point's reason. For a
    search the objective and threshold default to its own, and only its full-length trials can win. No winner
    raises NoWinner: Tied (exit 3) for a tie no figure separates unless `point` names one, else exit 3 while a
    point is undecided, 1 when every point failed a check. A `point` ruled out by a check raises Refused (a
    NoWinner saying it cannot be `done`: exit 1 for a failed check, 3 for one not decided yet) unless
    `allow_failed` gives the reason to take it anyway."""
    with Store(workspace, create=False) as store:
        points = load_points(store, campaign)
        record = store.campaign(campaign) or {}
        search = search_of(record)
        excluded = _excluded(store, campaign, points)
        if search is not None:
            excluded = {**search_rejected(points, search, store.trials(campaign)), **excluded}
        infeasible = [r for r in infeasible_rejected(store, campaign) if r.point_id not in excluded]
        cells = {c.point_id: c for c in store.cells(campaign)}
        floors = floors_of(store)
    refuse_ingested(record, campaign, "mbx freeze")
    objective = objective or (SEARCH_OBJECTIVES[search.objective] if search else "tflops")
    if objective not in OBJECTIVES or tie_break not in TIE_BREAKS:
        raise UsageError(f"--by {objective} / --tie-break {tie_break}: choose --by from {', '.join(OBJECTIVES)} and "
                         f"--tie-break from {', '.join(TIE_BREAKS)}")  # fmt: skip
    if min_effect is None:
        min_effect = search.min_effect if search else stats.MIN_EFFECT
    goal, breaker = metric(OBJECTIVES[objective]), metric(TIE_BREAKS[tie_break])
    eligible = [p for p in points if p.point_id not in excluded and p.repeats]
    choice = choose(eligible, goal, min_effect, breaker, floors)
    allowed = None
    if point is not None:
        winner = _named(points, point, campaign)
        allowed = _allowed(winner, excluded, point, allow_failed, done, campaign)
        how = _standing(winner, choice, goal, min_effect, floors)
        rejected = [_not_chosen(winner, p, goal, min_effect, floors) for p in eligible if p is not winner]
    elif choice.undecided:  # the tie's losers (DIFFERENT, worse, than the leader) are rejected all the same
        raise Tied(f"{campaign}: {choice.how}; freeze one of them with --point",
                   [*tie_losers(choice, eligible, goal), *excluded.values(), *infeasible])  # fmt: skip
    elif choice.winner is None:
        raise _nothing(campaign, [*excluded.values(), *infeasible], choice.how if eligible else None)
    else:
        winner, how = choice.winner, choice.how
        rejected = [_lost(p, choice, goal, breaker) for p in eligible if p is not winner]
    rejected += [r for r in [*excluded.values(), *infeasible] if r.point_id != winner.point_id]
    cell = cells[winner.point_id]
    return Frozen(campaign, record.get("spec") or {}, record.get("source_file"), winner, how, goal, rejected,
                  recipe=cell.recipe, resources=cell.resources, trainer_kind=cell.trainer_kind,
                  allowed_failed=allowed)  # fmt: skip


def _nothing(campaign: str, rejected: list[Rejected], eligible_how: str | None) -> NoWinner:
    """No point can be frozen, with every point's reason (`eligible_how`: why the eligible points gave no best):
    undecided (exit 3) while one of them is not decided yet (an inconclusive gate or parity pair, a repeat not
    finished: more repeats or time may give a winner) or nothing is there to judge; a failure (exit 1) when each
    failed a check, is infeasible or has no figure."""
    reasons = [f"{r.point_id} [{r.label}]: {r.why}" for r in rejected] + [eligible_how] * bool(eligible_how)
    undecided = any(r.verdict == INCONCLUSIVE for r in rejected) or not reasons
    message = f"{campaign}: no point can be frozen: {'; '.join(reasons) or 'no completed point'}"
    return NoWinner(message, INCONCLUSIVE if undecided else FAIL, rejected)


def _named(points: list[Point], ref: str, campaign: str) -> Point:
    """The point `--point` names (its id, label or a cell id); UsageError listing the points otherwise."""
    chosen = next((p for p in points if ref in (p.point_id, p.label, *p.cell_ids)), None)
    if chosen is None:
        raise UsageError(f"--point {ref!r}: campaign {campaign!r} has no such point "
                         f"(points: {', '.join(p.point_id for p in points)})")  # fmt: skip
    return chosen
