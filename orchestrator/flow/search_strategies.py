"""The search strategies: grid, random, successive halving over run length, Optuna TPE with pruning."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.judge.run_floor import FloorBook
from orchestrator.judge.search_ledger import Ledger
from orchestrator.judge.search_rank import (
    Best,
    Candidate,
    Evidence,
    candidate_key,
    exclusion,
    mean_of,
    memory_front,
    metric_of,
    pick,
    rank,
    target_steps,
    verdict_text,
)
from orchestrator.spec.search import Search, halving_start, survivors
from reports import compare as stats


class Evaluator(Protocol):
    """Runs candidates at a run length (the real engine, or a recorded table)."""

    repeats: int
    full_steps: int

    def evaluate(
        self, candidates: list[Candidate], steps: int, base: bool
    ) -> tuple[dict[str, Evidence], Evidence | None]:
        """Each candidate's evidence at `steps` (and the base recipe's, when `base`)."""
        ...

    def floors(self) -> FloorBook | None:
        """The run-to-run floors of one-run verdicts (orchestrator/judge/run_floor.py; None: the default)."""
        ...


# ---- strategies -------------------------------------------------------------------------------------------
@dataclass
class Found:
    """What a strategy ran: the evidence the best is picked from, and the base recipe's per run length."""

    final: list[Evidence] = field(default_factory=list)
    bases: dict[int, Evidence | None] = field(default_factory=dict)
    runs: list[Evidence] = field(default_factory=list)  # every candidate run, at every run length


def wants_base(search: Search) -> bool:
    return search.constraints.loss_tolerance is not None


def run_batch(evaluator: Evaluator, batch: list[Candidate], steps: int, rung: int, search: Search, ledger: Ledger,
              found: Found) -> list[Evidence]:  # fmt: skip
    """Run `batch` at `steps` (with the base recipe once per run length when loss parity is asked)."""
    base = wants_base(search) and steps not in found.bases
    evidences, base_evidence = evaluator.evaluate(batch, steps, base)
    if base:
        found.bases[steps] = base_evidence
    ran = [evidences[c.key] for c in batch]
    ledger.spend([*ran, *([base_evidence] if base_evidence else [])], rung)
    found.runs += ran
    return ran


def run_sequence(evaluator: Evaluator, candidates: list[Candidate], search: Search, ledger: Ledger) -> Found:
    """grid (sweep order) or random (seeded order): full-length runs while the budget lasts."""
    order = list(candidates)
    if search.method == "random":
        random.Random(search.seed).shuffle(order)
    steps, found = evaluator.full_steps, Found()
    chunk = 1 if search.budget.gpu_hours is not None else max(1, len(order))  # GPU-hours: checked before each
    while order:
        base_cost = steps * evaluator.repeats if wants_base(search) and steps not in found.bases else 0
        batch: list[Candidate] = []
        for c in order[:chunk]:
            cost = (len(batch) + 1) * steps * evaluator.repeats + base_cost
            if not ledger.affordable([x.key for x in [*batch, c]], cost):
                break
            batch.append(c)
        if not batch:
            break
        order = order[len(batch) :]
        found.final += run_batch(evaluator, batch, steps, 0, search, ledger, found)
    return found


def promote(
    evidences: list[Evidence], search: Search, base: Evidence | None, rung: int, ledger: Ledger
) -> list[Candidate]:
    """The candidates going on from a rung: survivors(rung size) of the eligible points, ranked by `rank`;
    every other point's row says why it stopped (its verdict against the leader, or what excluded it)."""
    eligible = []
    for e in evidences:
        why = exclusion(e, search, base)
        if why is None:
            eligible.append(e)
        elif e.state == "completed":
            ledger.record(e, rung, "excluded", why)
    ranked = rank(eligible, metric_of(search.metric), search.min_effect)
    keep = survivors(len(evidences), search.halving.keep)
    for i, (e, d) in enumerate(ranked):
        place = f"rank {i + 1} of {len(ranked)}: {verdict_text(d)}"
        if i < keep:
            ledger.record(e, rung, "promoted", place, d)
        else:
            ledger.record(e, rung, "dropped", f"{place}; only the top {keep} go on", d)
    ledger.flush()
    return [e.candidate for e, _ in ranked[:keep]]


def run_halving(evaluator: Evaluator, candidates: list[Candidate], search: Search, ledger: Ledger) -> Found:
    """Successive halving over run length; a steps budget sizes the first rung (a seeded sample). With a
    GPU-hours budget a rung's trials are launched one at a time, the budget checked before each, so the search
    ends at most one trial over it."""
    rungs, keep, reps = search.halving.steps, search.halving.keep, evaluator.repeats
    budget = search.budget.steps
    if budget is not None and wants_base(search):
        budget -= sum(rungs) * reps
    first = halving_start(len(candidates), rungs, keep, reps, budget, search.budget.points) if budget is None or \
        budget >= rungs[0] * reps else 0  # fmt: skip
    picked = sorted(random.Random(search.seed).sample(range(len(candidates)), first))
    pool, found = [candidates[i] for i in picked], Found()
    if not pool and candidates and budget is not None:  # the steps budget cannot pay for one first-rung run
        ledger.affordable([candidates[0].key], rungs[0] * reps)
    for rung, steps in enumerate(rungs):
        cost = (len(pool) + (1 if wants_base(search) else 0)) * steps * reps
        if not pool or not ledger.affordable([c.key for c in pool], cost, one_trial=steps * reps):
            break
        ran = run_rung(evaluator, pool, steps, rung, search, ledger, found)
        found.final = ran
        if len(ran) < len(pool):  # the GPU-hours ran out within the rung
            break
        if rung < len(rungs) - 1:
            pool = promote(ran, search, found.bases.get(steps), rung, ledger)
    return found


def run_rung(evaluator: Evaluator, pool: list[Candidate], steps: int, rung: int, search: Search, ledger: Ledger,
             found: Found) -> list[Evidence]:  # fmt: skip
    """A rung in one launch, or (a GPU-hours budget) one trial at a time while the budget lasts."""
    if search.budget.gpu_hours is None:
        return run_batch(evaluator, pool, steps, rung, search, ledger, found)
    ran: list[Evidence] = []
    for cand in pool:  # each trial's predicted GPU-hours checked before it starts (the base recipe's run too)
        if not ledger.affordable([cand.key], 0, one_trial=steps * evaluator.repeats + base_cost(search, found, steps,
                                                                                              evaluator.repeats)):
            break
        ran += run_batch(evaluator, [cand], steps, rung, search, ledger, found)
    return ran


def run_strategy(evaluator: Evaluator, candidates: list[Candidate], search: Search, ledger: Ledger,
                 space: list[tuple[str, list[dict[str, Any]]]] | None = None, steps_key: str = "training.steps") -> Best:  # fmt: skip
    """Run the search's method and pick the best; the best's row and the Pareto front are flagged."""
    if search.method == "halving":
        found = run_halving(evaluator, candidates, search, ledger)
    elif search.method == "optuna":
        found = run_optuna(evaluator, candidates, search, ledger, space or point_space(candidates), steps_key)
    else:
        found = run_sequence(evaluator, candidates, search, ledger)
    target = target_steps(search, evaluator.full_steps)
    best = pick(found.final, search, found.bases, target, evaluator.floors())
    best.memory_front = memory_front(found.runs, search, found.bases, target)
    for e in best.memory_front:
        row = ledger.rows.get((ledger.number(e.candidate.key), rung_of(ledger, e)))
        if row is not None:
            row["pareto"] = True
            row["pareto_by"] = "memory"
            row["reason"] = (f"{row['reason']}; on the Pareto front for memory (measured at {e.steps} steps; its "
                             f"{search.objective} is that shorter run's, not compared with full-length ones)")  # fmt: skip
    for e in found.final:
        row = ledger.rows.get((ledger.number(e.candidate.key), rung_of(ledger, e)))
        if row is None:
            continue
        why = exclusion(e, search, found.bases.get(e.steps))
        if why and row["state"] == "completed":
            row.update(state="excluded", reason=why)
        row["best"] = e is best.evidence
        row["pareto"] = any(e is p for p in best.pareto)
        if row["best"]:
            row["reason"] = best.how
    ledger.flush()
    return best


def rung_of(ledger: Ledger, evidence: Evidence) -> int:
    """The rung of the row that recorded `evidence` (its highest for the candidate at that run length)."""
    number = ledger.number(evidence.candidate.key)
    rungs = [r for (t, r), row in ledger.rows.items() if t == number and row["steps"] == evidence.steps]
    return max(rungs) if rungs else 0


def point_space(candidates: list[Candidate]) -> list[tuple[str, list[dict[str, Any]]]]:
    """One categorical dimension over the candidates (for sweeps that are not a plain product of axes)."""
    return [("point", [dict(c.params) for c in candidates])]


# ---- Optuna TPE with pruning ------------------------------------------------------------------------------
def base_cost(search: Search, found: Found, steps: int, repeats: int) -> int:
    return steps * repeats if wants_base(search) and steps not in found.bases else 0


def prune_rank(
    evidence: Evidence, shorts: list[Evidence], search: Search
) -> tuple[str, stats.Decision] | None:
    """Why a short run is pruned, by the rule of a halving rung: ranked with the earlier short runs by `rank`
    (the verdicts first: a point DIFFERENT (worse) than the leader comes after every point they cannot
    separate from it), it is outside the top `optuna.keep`; None when it stays in."""
    ranked = rank([*shorts, evidence], metric_of(search.metric), search.min_effect)
    place = next(i for i, (e, _) in enumerate(ranked) if e is evidence)
    keep = survivors(len(ranked), search.optuna.keep)
    decision = ranked[place][1]
    if place < keep or decision is None:
        return None
    return (
        f"rank {place + 1} of {len(ranked)} short runs: {verdict_text(decision)}; only the top {keep} go on",
        decision,
    )


@dataclass
class TrialRun:
    """One Optuna trial's outcome: complete | pruned | fail, its short-run value and its full-run value."""

    state: str
    short: float | None = None
    value: float | None = None


def short_run(evaluator: Evaluator, cand: Candidate, search: Search, ledger: Ledger, found: Found,
              shorts: list[Evidence], trial: Any, short: int) -> TrialRun | None:  # fmt: skip
    """The short run of a trial, reported to Optuna; pruned when Optuna's percentile pruner says so (after the
    warm-up) and `prune_rank` agrees. None: the budget is spent; a TrialRun with state "go" goes on."""
    reps = evaluator.repeats
    cost = (short + evaluator.full_steps) * reps + base_cost(search, found, short, reps)
    if not ledger.affordable([cand.key], cost):
        return None
    (ev,) = run_batch(evaluator, [cand], short, 0, search, ledger, found)
    why = exclusion(ev, search, found.bases.get(short))
    if why is not None:
        ledger.record(ev, 0, "excluded" if ev.state == "completed" else ev.state, why)
        return TrialRun("fail")
    value = mean_of(ev.point, metric_of(search.metric).summary_key)
    trial.report(value, short)
    pruned = prune_rank(ev, shorts, search) if trial.should_prune() else None
    shorts.append(ev)
    if pruned is not None:
        ledger.record(ev, 0, "pruned", f"pruned after {short} steps, {pruned[0]}", pruned[1])
        return TrialRun("pruned", value)
    ledger.record(ev, 0, "promoted", f"short run of {short} steps kept")
    return TrialRun("go", value)


def optuna_trial(evaluator: Evaluator, cand: Candidate, search: Search, ledger: Ledger, found: Found,
                 shorts: list[Evidence], trial: Any) -> TrialRun | None:  # fmt: skip
    """A new candidate's trial: the short run (when pruning), then the full run. None: the budget is spent."""
    full, reps = evaluator.full_steps, evaluator.repeats
    short = search.optuna.prune_at or max(5, full // 10)
    first = TrialRun("go")
    if search.optuna.prune and short < full:
        first = short_run(evaluator, cand, search, ledger, found, shorts, trial, short)
        if first is None or first.state != "go":
            return first
    if not ledger.affordable([cand.key], full * reps + base_cost(search, found, full, reps)):
        return None
    rung = 1 if first.short is not None else 0
    (ev,) = run_batch(evaluator, [cand], full, rung, search, ledger, found)
    found.final.append(ev)
    if exclusion(ev, search, found.bases.get(full)) is not None:
        return TrialRun("fail", first.short)
    return TrialRun("complete", first.short, mean_of(ev.point, metric_of(search.metric).summary_key))


def run_optuna(evaluator: Evaluator, candidates: list[Candidate], search: Search, ledger: Ledger,
               space: list[tuple[str, list[dict[str, Any]]]], steps_key: str) -> Found:  # fmt: skip
    """Optuna TPE (seeded) over `space` (dimension → choices, each a partial assignment), ask and tell: a
    suggestion already run is told its known outcome again (no cost); one outside the sweep fails."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    settings, metric = search.optuna, metric_of(search.metric)
    study = optuna.create_study(
        direction="minimize" if metric.higher_is_worse else "maximize",
        sampler=optuna.samplers.TPESampler(seed=search.seed, n_startup_trials=settings.warmup_trials),
        pruner=optuna.pruners.PercentilePruner(settings.keep * 100, n_startup_trials=settings.warmup_trials),
    )
    lookup = {c.key: c for c in candidates}
    done: dict[str, TrialRun] = {}
    found, shorts = Found(), []
    for _ in range(settings.max_trials or 10 * len(candidates)):
        if len(done) >= len(candidates):
            break
        trial = study.ask()
        assignment: dict[str, Any] = {}
        for name, choices in space:
            assignment.update(choices[trial.suggest_categorical(name, list(range(len(choices))))])
        cand = lookup.get(candidate_key(assignment, steps_key))
        if cand is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        fresh = cand.key not in done
        if fresh:
            outcome = optuna_trial(evaluator, cand, search, ledger, found, shorts, trial)
            if outcome is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                break
            done[cand.key] = outcome
        tell(
            study,
            trial,
            done[cand.key],
            None if fresh else (search.optuna.prune_at or max(5, evaluator.full_steps // 10)),
        )
    return found


def tell(study: Any, trial: Any, outcome: TrialRun, report_at: int | None) -> None:
    """Tell Optuna a trial's outcome (a repeated suggestion is first given the short run's value again)."""
    import optuna

    if report_at is not None and outcome.short is not None:
        trial.report(outcome.short, report_at)
    if outcome.state == "complete":
        study.tell(trial, outcome.value)
    else:
        state = optuna.trial.TrialState.PRUNED if outcome.state == "pruned" else optuna.trial.TrialState.FAIL
        study.tell(trial, state=state)


def product_space(
    axes: dict[str, list[Any]], zips: list[dict[str, list[Any]]]
) -> list[tuple[str, list[dict[str, Any]]]]:
    """Optuna's dimensions for a product sweep: one per axis, one per zip group (its i-th values together)."""
    space = [(key, [{key: v} for v in values]) for key, values in axes.items()]
    for i, group in enumerate(zips):
        length = len(next(iter(group.values())))
        space.append((f"zip{i}", [{k: group[k][j] for k in group} for j in range(length)]))
    return space
