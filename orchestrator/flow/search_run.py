"""Runs a budgeted search (`sweep.search`, orchestrator/spec/search.py): grid, random, successive halving, Optuna TPE.

A search sees the sweep's points as candidates (their swept values, without the run length) and an `Evaluator`
that runs a set of them at a run length and returns each one's `Evidence`: the completed repeats as an
orchestrator.judge.compare `Point`, or why it is infeasible or failed. `CampaignEvaluator` drives the real engine
through the lifecycle (orchestrator/flow/lifecycle.py: prepare, execute) with the rung's points (the run length set through
`search.steps_key`); benchmarks/search_budget.py replays a recorded table through the same strategies.

Decisions between points are orchestrator/judge/compare.py's verdicts, not raw means: a rung keeps its points that
are not DIFFERENT (worse) than the leader first, a pruned Optuna trial must be DIFFERENT (worse) than the best
short run, and the best point is orchestrator/judge/freeze.py's pick (a tie is said and broken by memory). Every
trial (one row per point and run length) goes to the store's `trials` table as the search goes, with the
best point and the Pareto front (objective vs peak memory) flagged at the end. The search is deterministic
for its seed and its evidence, and the engine skips completed cells, so a killed search run again replays
its finished trials without running them; infeasible and failed trials are read back, never retried.

This module is the command (run, resume, the outcome); search_rank.py ranks evidence, search_ledger.py keeps
the budget and trial rows, search_strategies.py holds the methods and search_evaluators.py the evaluators.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text

from orchestrator.errors import EXIT_PASS, MbxError
from orchestrator.flow.lifecycle import log_outcome
from orchestrator.flow.runner import write_report
from orchestrator.flow.search_evaluators import CampaignEvaluator, DryRunEvaluator, FirstBatchShown, console
from orchestrator.flow.search_strategies import product_space, run_strategy
from orchestrator.judge.closing import closing_text
from orchestrator.judge.outcome import SEARCH_OUTCOME, Outcome, search_part
from orchestrator.judge.search_ledger import Ledger
from orchestrator.judge.search_rank import Best, Candidate, Evidence, mean_of, memory_of
from orchestrator.judge.views import campaign_view
from orchestrator.run.feasibility import check_points, limits_of, with_gpu_memory
from orchestrator.run.lock import CampaignLock
from orchestrator.run.store import Store, cell_rows, check_workspace, read_only
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.search import Search
from orchestrator.spec.sweep import Point as SweepPoint
from orchestrator.trainers import expand


# ---- the command ------------------------------------------------------------------------------------------
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


def candidates_of(evaluator: CampaignEvaluator, points: list[SweepPoint], ledger: Ledger) -> list[Candidate]:
    """The search's candidates in sweep order. Points infeasible by orchestrator/run/feasibility.py (a layout rule,
    the estimate over the GPU's memory, under the headroom gate or over `constraints.peak_memory_gib_max`: the
    set `mbx campaign plan` marks; `strict` refuses the campaign instead) are recorded (trial rows, state
    infeasible) and left out."""
    options = evaluator.options
    file = str(evaluator.file) if evaluator.file else None
    limits = limits_of(evaluator.campaign)
    rows = check_points(points, options.get("gpu"), bool(options.get("strict")), file, limits).by_point()
    out = []
    for key, cells in evaluator.expanded[evaluator.full_steps].items():
        cand = Candidate(key, cells[0].label, dict(cells[0].params))
        row = rows.get(cells[0].point_id)
        if row is not None and not row.feasible:
            ledger.record(Evidence(cand, evaluator.full_steps, "infeasible", reason=row.reason), 0)
        else:
            out.append(cand)
    return out


def run_search(workspace: Path, campaign: Campaign, points: list[SweepPoint], file: Path | None, *,
               make_report: bool = True, **options: Any) -> SearchFinished:  # fmt: skip
    """Run `campaign.sweep.search` over `points` (options: the lifecycle's launcher, parallel, log_wandb, gpu,
    strict); trials go to the store as they are decided; the report covers every cell the search ran. The
    campaign's lock is held from the first trial to the report, so no other orchestrator runs between rungs."""
    dry_run = bool(options.pop("dry_run", False))
    if dry_run:  # nothing is written: no workspace made, the store only read when it is there
        workspace = Path(workspace).expanduser().resolve()
        dry = DryRunEvaluator(workspace, campaign, points, file, options)
        return _search(workspace, dry, points, make_report)
    workspace = check_workspace(workspace)
    evaluator = CampaignEvaluator(workspace, campaign, points, file, options)  # reads only: errors before the lock
    with CampaignLock(workspace / campaign.name):
        return _search(workspace, evaluator, points, make_report)


def _search(workspace: Path, evaluator: CampaignEvaluator, points: list[SweepPoint],
            make_report: bool) -> SearchFinished:  # fmt: skip
    """run_search's body, with the lock held unless it is a dry run."""
    campaign, file = evaluator.campaign, evaluator.file
    dry_run = isinstance(evaluator, DryRunEvaluator)
    search = campaign.sweep.search or Search()
    stored: list[dict[str, Any]] = []
    with read_only(workspace) as store:  # a dry run writes nothing; a real one made the workspace already
        stored = store.trials(campaign.name) if store is not None else []
    for row in stored:  # infeasible and failed trials of an earlier run: never run again
        if row["state"] in ("infeasible", "failed"):
            cand = Candidate(row["key"], row["label"], row["params"])
            evaluator.known[(row["key"], row["steps"])] = Evidence(
                cand, row["steps"], row["state"], reason=row["reason"]
            )

    def save(rows: list[dict[str, Any]]) -> None:
        if dry_run:
            return
        with Store(workspace) as store:
            store.record_trials(campaign.name, rows, replace=True)

    ledger = Ledger(search, save)
    cands = candidates_of(evaluator, points, ledger)
    console.print(Text(f"{campaign.name}: search {search.method} over {len(cands)} feasible point(s) "
                       f"({len(points) // max(1, evaluator.repeats) - len(cands)} infeasible), "
                       f"{evaluator.full_steps} steps each at full length"))  # fmt: skip
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
        return SearchFinished(Best(None, "dry run"), ledger, grid_steps, len(cands), dry_run=True)
    finished = SearchFinished(best, ledger, grid_steps, len(cands))
    finish(workspace, campaign, evaluator, finished, file, make_report)
    return finished


def finish(workspace: Path, campaign: Campaign, evaluator: CampaignEvaluator, finished: SearchFinished,
           file: Path | None, make_report: bool) -> None:  # fmt: skip
    """Every cell the search ran becomes the campaign's active cells (for status, report, freeze); the outcome
    goes on every trial row (what status and the report say afterwards); the report, then the lines that say
    what the search found and its closing line."""
    ran = list(evaluator.ran.values())
    campaign = with_gpu_memory(campaign, evaluator.options.get("gpu"))  # as the lifecycle stored it for the rungs
    if ran:
        with CampaignLock(workspace / campaign.name), Store(workspace) as store:
            record = store.campaign(campaign.name) or {}
            store.register_campaign(campaign.name, str(file) if file else None, campaign.model_dump(mode="json"),
                                    record.get("launcher") or campaign.launcher, cell_rows(campaign, ran))  # fmt: skip
    judged = finished.outcome()
    for row in finished.ledger.rows.values():
        row[SEARCH_OUTCOME] = {"verdict": judged.verdict, "head": judged.head, "text": judged.parts[0].text}
    finished.ledger.flush()
    if make_report and ran:
        try:
            with Store(workspace, create=False, read_only=True) as store:
                view = campaign_view(store, campaign.name)
            console.print(Text(f"report: {write_report(workspace, view, None, judged)}"))
        except MbxError as err:
            console.print(Text(f"warning: {err}"), soft_wrap=True)
    if evaluator.options.get("log_wandb", True) and campaign.wandb.mode != "disabled":
        log_outcome(workspace, campaign, judged)
    for line in outcome_lines(finished):
        console.print(Text(line), soft_wrap=True)
    console.print(closing_text(judged), soft_wrap=True)


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


def resume_search(workspace: Path, name: str, **options: Any) -> SearchFinished | None:
    """`mbx campaign resume NAME` of a campaign with `sweep.search`: the search run again from its stored spec
    (finished trials are read back, not rerun); None for a campaign without a search (or not in the store)."""
    workspace = check_workspace(workspace, create=False)
    with Store(workspace, create=False) as store:
        record = store.campaign(name)
    spec = (record or {}).get("spec") or {}
    if not isinstance(spec.get("sweep"), dict) or not spec["sweep"].get("search"):
        return None
    campaign = Campaign.model_validate(spec)
    source = Path(record["source_file"]) if record and record.get("source_file") else None
    file = source if source is not None and source.exists() else None  # a recipe_file is relative to it
    make_report = bool(options.pop("make_report", True))
    return run_search(workspace, campaign, expand(campaign, file, None, strict=False), file, make_report=make_report,
                      launcher=record["launcher"] if record else None, **options)  # fmt: skip
