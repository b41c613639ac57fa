"""Runs a budgeted search (`sweep.search`, orchestrator/spec/search.py): grid, random, successive halving, Optuna TPE.

A search sees the sweep's points as candidates (their swept values, without the run length) and an `Evaluator`
that runs a set of them at a run length and returns each one's `Evidence`: the completed repeats as an
orchestrator.judge.compare `Point`, or why it is infeasible or failed. A search is a campaign like any other:
`lifecycle.prepare` makes its Plan with a `Searching` (this module's `prepare_search`: the candidates, the ones
infeasible by their estimate recorded, the trials an earlier run found infeasible or failed read back), and
`lifecycle.execute` runs it (`run_search`) under the campaign lock, each rung's points a plan the lifecycle
prepares and executes in turn (`CampaignEvaluator.runner`, with the run length set through `search.steps_key`),
then registers every cell that ran and writes the report and the W&B outcome once; a dry run renders the
first rung. benchmarks/search_budget.py replays a recorded table through the same strategies.

Decisions between points are orchestrator/judge/compare.py's verdicts, not raw means: a rung keeps its points that
are not DIFFERENT (worse) than the leader first, a pruned Optuna trial must be DIFFERENT (worse) than the best
short run, and the best point is orchestrator/judge/freeze.py's pick (a tie is said and broken by memory). Every
trial (one row per point and run length) goes to the store's `trials` table as the search goes, with the
best point and the Pareto front (objective vs peak memory) flagged at the end. The search is deterministic
for its seed and its evidence, and the engine skips completed cells, so a killed search run again replays
its finished trials without running them; infeasible and failed trials are read back, never retried.

This module is the search's part of a plan and its outcome; search_rank.py ranks evidence, search_ledger.py keeps
the budget and trial rows, search_strategies.py holds the methods and search_evaluators.py the evaluators.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text

from orchestrator.errors import EXIT_PASS
from orchestrator.flow.options import Options
from orchestrator.flow.search_evaluators import CampaignEvaluator, FirstBatchShown, RungRunner, console
from orchestrator.flow.search_strategies import product_space, run_strategy
from orchestrator.judge.outcome import SEARCH_OUTCOME, Outcome, search_part
from orchestrator.judge.search_ledger import Ledger
from orchestrator.judge.search_rank import Best, Candidate, Evidence, mean_of, memory_of
from orchestrator.run.feasibility import Assessment
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.search import Search
from orchestrator.spec.sweep import Point as SweepPoint


# ---- the search's part of a plan ----------------------------------------------------------------------------
@dataclass
class SearchFinished:
    """How a search ended: the best point (None: none qualified), what it spent, and why it stopped."""

    best: Best
    ledger: Ledger
    grid_steps: int
    candidates: int
    dry_run: bool = False

    def outcome(self) -> Outcome:
        """The search's outcome (orchestrator/judge/outcome.py): a best point passes; a tie, or a budget spent
        before a best with no trial failed, is inconclusive; no best point otherwise fails."""
        return search_outcome(self.ledger, self.best)

    def exit_code(self, inconclusive_ok: bool = False) -> int:
        """The outcome's exit code: 0 a best point, 1 none qualified, 3 undecided (0 with `inconclusive_ok`);
        a dry run judges nothing: 0."""
        return EXIT_PASS if self.dry_run else self.outcome().exit_code(inconclusive_ok)


@dataclass
class Searching:
    """A search campaign's part of its Plan (made by `prepare_search`, nothing written): the evaluator that runs
    its rungs, the ledger (the candidates infeasible by their estimate already recorded in it) and the
    feasible candidates in sweep order; `found` once it has run."""

    evaluator: CampaignEvaluator
    ledger: Ledger
    candidates: list[Candidate]
    infeasible: int  # points ruled out by their estimate (recorded as trials, never run)
    found: SearchFinished | None = None

    @property
    def ran(self) -> list[SweepPoint]:
        """Every cell the search ran (not those of a point its node refused), in the order they ran."""
        return list(self.evaluator.ran.values())


def search_outcome(ledger: Ledger, best: Best) -> Outcome:
    """The outcome of a search from its ledger (budget, trial rows) and its answer."""
    rows = list(ledger.rows.values())
    failed = len({r["trial"] for r in rows if r["state"] == "failed" or r.get("verdict") == "fail"})
    part = search_part(best.evidence is not None, best.tie, best.how, ledger.stop_reason, failed)
    return Outcome(f"search {ledger.search.method}: {len(ledger.numbers)} trial(s)", (part,))


def budget_text(search: Search) -> str:
    """The search's budget as set (points, steps, GPU-hours), or "none"."""
    budget = search.budget.model_dump(exclude_none=True) if search.budget is not None else {}
    return ", ".join(f"{k} {v}" for k, v in budget.items()) or "none"


def prepare_search(campaign: Campaign, points: list[SweepPoint], file: Path | None, options: Options,
                   assessment: Assessment, stored: list[dict[str, Any]]) -> Searching:  # fmt: skip
    """The search's part of the Plan of `campaign` (as loaded: the evaluator expands its rungs from it):
    the candidates in sweep order; the points `assessment` (the plan's own, what `mbx campaign plan` shows)
    marks infeasible recorded in the ledger and left out; the `stored` trials an earlier run found infeasible
    or failed read back, never run again. Writes nothing."""
    evaluator = CampaignEvaluator(campaign, points, file, options)
    for row in stored:
        if row["state"] in ("infeasible", "failed"):
            cand = Candidate(row["key"], row["label"], row["params"])
            evaluator.known[(row["key"], row["steps"])] = Evidence(
                cand, row["steps"], row["state"], reason=row["reason"]
            )
    ledger = Ledger(campaign.sweep.search or Search())
    rows = assessment.by_point()
    candidates = []
    for key, cells in evaluator.expanded[evaluator.full_steps].items():
        cand = Candidate(key, cells[0].label, dict(cells[0].params))
        row = rows.get(cells[0].point_id)
        if row is not None and not row.feasible:
            ledger.record(Evidence(cand, evaluator.full_steps, "infeasible", reason=row.reason), 0)
        else:
            candidates.append(cand)
    infeasible = len(points) // max(1, evaluator.repeats) - len(candidates)
    return Searching(evaluator, ledger, candidates, infeasible)


def run_search(searching: Searching, runner: RungRunner, save: Callable[[list[dict[str, Any]]], None],
               dry_run: bool = False) -> SearchFinished:  # fmt: skip
    """Run the search's strategy, each rung through `runner` (the lifecycle: prepare and execute the rung's
    points; a dry run: render the first rung, then stop); trial rows go to `save` as they are decided, with
    the search's outcome on each at the end (what status and the report say afterwards)."""
    evaluator, ledger, cands = searching.evaluator, searching.ledger, searching.candidates
    evaluator.runner = evaluator.runner or runner  # a test's replay of recorded runs stays
    evaluator.dry_run = dry_run
    ledger.on_rows = save
    campaign = evaluator.campaign
    search = campaign.sweep.search or Search()
    console.print(Text(f"{campaign.name}: search {search.method} over {len(cands)} feasible point(s) "
                       f"({searching.infeasible} infeasible), {evaluator.full_steps} steps each at full length"))  # fmt: skip
    space = (
        None
        if campaign.sweep.cells or search.method != "optuna"
        else product_space(campaign.sweep.axes, campaign.sweep.zip)
    )
    grid_steps = len(cands) * evaluator.full_steps * evaluator.repeats
    try:
        best = run_strategy(evaluator, cands, search, ledger, space, search.steps_key)
    except FirstBatchShown:
        console.print(Text(f"dry run of a search: what runs after this batch depends on its results; budget "
                           f"{budget_text(search)}, the full grid is {grid_steps} steps"))  # fmt: skip
        searching.found = SearchFinished(Best(None, "dry run"), ledger, grid_steps, len(cands), dry_run=True)
        return searching.found
    searching.found = SearchFinished(best, ledger, grid_steps, len(cands))
    judged = searching.found.outcome()
    for row in ledger.rows.values():
        row[SEARCH_OUTCOME] = {"verdict": judged.verdict, "head": judged.head, "text": judged.parts[0].text,
                               "stop_reason": ledger.stop_reason}  # fmt: skip
    ledger.flush()
    return searching.found


def outcome_lines(finished: SearchFinished) -> list[str]:
    """What the search found, in lines that paste into a PR (the closing line follows them)."""
    ledger, best = finished.ledger, finished.best
    share = ledger.steps / finished.grid_steps if finished.grid_steps else 0.0
    rows = list(ledger.rows.values())
    states = ", ".join(
        f"{sum(r['state'] == s for r in rows)} {s}" for s in dict.fromkeys(r["state"] for r in rows)
    )
    lines = [f"search {ledger.search.method}: {len(ledger.numbers)} trial(s) ({states}); {ledger.steps} steps spent "
             f"= {share:.1%} of the grid's {finished.grid_steps}, {ledger.gpu_hours:.3g} GPU-hours"
             + (f"; stopped: {ledger.stop_reason}" if ledger.stop_reason else "")]  # fmt: skip
    if best.evidence is not None:
        e = best.evidence
        value = mean_of(e.point, ledger.search.objective)
        lines.append(
            f"BEST [{e.candidate.label}] {ledger.search.objective} {value:.4g} at {e.steps} steps: {best.how}"
        )
    if not best.pareto and not best.memory_front:
        return lines
    front = "; ".join(f"[{p.candidate.label}] {mean_of(p.point, ledger.search.objective) or 0:.4g} / "
                      f"{memory_of(p.point) or 0:.3g} GiB" for p in best.pareto)  # fmt: skip
    low = "; ".join(f"[{p.candidate.label}] {memory_of(p.point) or 0:.3g} GiB (stopped at {p.steps} steps)"
                    for p in best.memory_front)  # fmt: skip
    lines.append(f"Pareto front ({ledger.search.objective} vs peak memory): {front or 'no full-length point'}"
                 + (f"; for memory, from shorter runs: {low}" if low else ""))  # fmt: skip
    return lines
