"""Interleaved A/B runs for `mbx compare --run A.yaml B.yaml`, and the extra repeats of `--until-conclusive`.

The cells of two campaigns run one at a time, alternately (A B A B …: repeat r of every matched point of A,
then of B, then repeat r + 1), each side prepared as `mbx campaign run` prepares it and each cell executed
through the lifecycle (orchestrator/flow/lifecycle.py) with both campaigns registered in the store and both
campaign locks held, so that drift of the machine (clocks,
thermals, neighbours) falls on both sides alike. A rerun reuses every completed cell (the engine skips it)
and adopts attempts still running. `--until-conclusive` adds repeat cells `<point>-r<n>` (the sweep's cell-id
scheme) to the points of the pairs with an UNKNOWN verdict, registers them with the campaign's other active
cells and runs them the same way, A then B, until every verdict is decided or the budget of extra cells is
spent. Comparing after every round is optional stopping: it would raise the false-alarm (and false-SAME)
rate above one test's, so the comparison is run with `looks = max_looks(budget)` from its first look on and
reports/compare.py tests every look at its levels divided by that many looks (Bonferroni): over all looks the
rates stay at most those of one test (benchmarks/compare_stats.py measures them).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from orchestrator.errors import ConfigError, UsageError
from orchestrator.flow.lifecycle import Options, Plan, execute, load, prepare_file, prepare_stored_cells
from orchestrator.flow.runner import check_baseline, show
from orchestrator.judge.compare import Comparison, Point, resolvable
from orchestrator.run.baseline import params_key
from orchestrator.run.engine import Event
from orchestrator.run.lock import CampaignLock
from orchestrator.run.progress import ProgressReporter
from orchestrator.run.store import INGEST_LAUNCHER, CellRow, Store, check_workspace, read_only
from orchestrator.spec.sweep import Point as PlannedPoint

console = Console(highlight=False, markup=False, emoji=False)
DEFAULT_BUDGET = 6  # extra cells --until-conclusive may run (both sides together)


def max_looks(budget: int) -> int:
    """The most comparisons a pair can see with `budget` extra cells: the first, then one per round of one
    repeat per side (2 cells)."""
    return 1 + max(int(budget), 0) // 2


@dataclass
class Side:
    """One campaign of an A/B run: its tag and its plan (orchestrator/flow/lifecycle.py)."""

    tag: str  # "A" or "B" ("A/B" when both sides are the same campaign)
    plan: Plan


@dataclass
class Driven:
    """What an interleaved run did: cells run in order, and the cells that did not complete (with why)."""

    order: list[CellRow] = field(default_factory=list)
    failed: list[tuple[CellRow, str]] = field(default_factory=list)


def match_planned(
    a: list[PlannedPoint], b: list[PlannedPoint], files: tuple[str, str]
) -> list[tuple[str, str]]:
    """Point ids of A and B paired by equal swept values (or the one point of each side). Raises
    ConfigError naming every point without a partner: the two campaigns must match point by point."""
    ids_a = list(dict.fromkeys(p.point_id for p in a))
    ids_b = list(dict.fromkeys(p.point_id for p in b))
    if len(ids_a) == 1 and len(ids_b) == 1:
        return [(ids_a[0], ids_b[0])]
    by_key_b = {params_key(p.params): p for p in b}
    by_key_a = {params_key(p.params): p for p in a}
    problems = [f"{files[0]}: point [{p.label}] has no point with the same swept values in {files[1]}"
                for key, p in by_key_a.items() if key not in by_key_b]  # fmt: skip
    problems += [f"{files[1]}: point [{p.label}] has no point with the same swept values in {files[0]}"
                 for key, p in by_key_b.items() if key not in by_key_a]  # fmt: skip
    if problems:
        raise ConfigError(problems + ["the two campaigns must sweep the same values (they may differ in "
                                      "anything else): align their sweep: sections"])  # fmt: skip
    return [(p.point_id, by_key_b[key].point_id) for key, p in by_key_a.items()]


def alternate(a: list[CellRow], b: list[CellRow], pairs: list[tuple[str, str]]) -> list[CellRow]:
    """The run order: for each repeat index, for each matched pair, A's cell then B's (A B A B …)."""
    cells_a = {(c.point_id, c.repeat): c for c in a}
    cells_b = {(c.point_id, c.repeat): c for c in b}
    repeats = sorted({c.repeat for c in a} | {c.repeat for c in b})
    order: list[CellRow] = []
    for repeat in repeats:
        for point_a, point_b in pairs:
            order += [c for c in (cells_a.get((point_a, repeat)), cells_b.get((point_b, repeat))) if c]
    return order


@contextlib.contextmanager
def locked(workspace: Path, names: list[str]) -> Iterator[None]:
    """Both campaign locks (each name once), held while cells run (the lifecycle takes them again, re-entrant)."""
    with contextlib.ExitStack() as stack:
        for name in dict.fromkeys(names):
            stack.enter_context(CampaignLock(workspace / name))
        yield


def options_of(workspace: Path, launcher: str | None, max_cells: int | None = None,
               repeats: int | None = None) -> Options:  # fmt: skip
    """The lifecycle's options of an A/B run: no report or W&B per side (`mbx compare` writes the result)."""
    return Options(Path(workspace), launcher=launcher, max_cells=max_cells, repeats=repeats, make_report=False,
                   log_wandb=False)  # fmt: skip


def run_files(workspace: Path, file_a: Path, file_b: Path, *, repeats: int | None = None,
              launcher: str | None = None, max_cells: int | None = None) -> tuple[str, str, Driven]:  # fmt: skip
    """`mbx compare --run A.yaml B.yaml`: prepare both campaigns as `mbx campaign run` does (parity sides as
    sweep factors, infeasible points recorded and skipped, `--strict` aside), register both and run their cells
    alternately; returns the two campaign names (as stored) and what was run. Nothing is written before both
    files are checked."""
    options = options_of(workspace, launcher, max_cells, repeats)
    side_a, side_b = Side("A", _prepared(file_a, options)), Side("B", _prepared(file_b, options))
    name_a, name_b = side_a.plan.campaign.name, side_b.plan.campaign.name
    if name_a == name_b:
        raise ConfigError(f"name: both files name the campaign {name_a!r}; an A/B run stores "
                          f"each side as its own campaign: give {file_b} another name", file=str(file_b))  # fmt: skip
    windows = (side_a.plan.campaign.collect.window, side_b.plan.campaign.collect.window)
    if windows[0] != windows[1]:
        raise ConfigError(f"collect.window: {file_a} measures the last {windows[0]} steps and {file_b} the last "
                          f"{windows[1]}: an A/B compares like with like, give both the same window")  # fmt: skip
    pairs = match_planned(side_a.plan.points, side_b.plan.points, (str(file_a), str(file_b)))
    workspace = check_workspace(Path(workspace))
    for side in (side_a, side_b):
        check_baseline(workspace, side.plan.campaign, side.plan.source)
    order = alternate(side_a.plan.cells, side_b.plan.cells, pairs)
    with locked(workspace, [name_a, name_b]):
        for side in (side_a, side_b):  # both registered (with their estimates) before any cell runs
            execute(side.plan, [], _quiet, closing=False)
        console.print(Text(f"interleaved A/B: A = {name_a}, B = {name_b}, {len(pairs)} matched point(s), "
                           f"{len(order)} cell(s) run one at a time, A B A B …"))  # fmt: skip
        driven = drive({name_a: side_a, name_b: side_b}, order)
    return name_a, name_b, driven


def _prepared(file: Path, options: Options) -> Plan:
    """A side's plan: every point of its file (a `sweep.search` file's whole grid, as before issue 34: an A/B
    compares points, it does not search)."""
    campaign, points = load(file, options)
    return prepare_file(campaign, points, file, options)


def _quiet(event: Event) -> None:
    """No progress to show: a registration runs no cell."""


def drive(sides: dict[str, Side], order: list[CellRow]) -> Driven:
    """Run `order` one cell at a time, each executed by the lifecycle with its campaign's plan (completed cells
    are skipped; every stored verdict of that campaign is judged again with its gates after each)."""
    driven = Driven(order=order)
    title = " ⇄ ".join(f"{s.tag} {name}" for name, s in sides.items())
    with ProgressReporter(len(order), title) as progress:

        def on_event(event: Event) -> None:
            side = sides[event.cell.campaign]
            label = f"{side.tag}: {event.cell.label}"
            show(progress, dataclasses.replace(event, cell=dataclasses.replace(event.cell, label=label)))

        try:
            for cell in order:
                finished = execute(sides[cell.campaign].plan, [cell], on_event, max_in_flight=1, closing=False)
                driven.failed += finished.outcome.failed
                # refused on its node's GPU (orchestrator/run/engine.py): not run, so the comparison lacks it
                refused = finished.outcome.infeasible
                driven.failed += [(c, f"infeasible, not run: {why}") for c, why in refused]
        except KeyboardInterrupt:
            progress.progress.stop()
            names = " and ".join(sides)
            console.print(Text(f"interrupted: the same command resumes (completed cells of {names} are kept; "
                               "an attempt already started is adopted)"), style="yellow")  # fmt: skip
            raise SystemExit(130) from None
    for cell, why in driven.failed:
        console.print(Text(f"  {sides[cell.campaign].tag} {cell.cell_id} [{cell.label}] did not complete: {why}",
                           style="red"), soft_wrap=True)  # fmt: skip
    return driven


# ---- --until-conclusive ------------------------------------------------------------------------------------
def undecided(comparison: Comparison) -> list[tuple[Point, Point]]:
    """The matched pairs with at least one UNKNOWN that more repeats can settle."""
    return [(r.a, r.b) for r in comparison.pairs if any(resolvable(d) for d in r.decisions.values())]


def check_golden(points: list[Point]) -> None:
    """Refuse (exit 2) a golden-values side: more repeats cannot be run for it."""
    for point in points:
        if point.source == "golden":
            raise UsageError(f"--until-conclusive: {point.campaign} is a golden-values file; more repeats "
                             "cannot be run for it (compare with a campaign instead)")  # fmt: skip


def check_runnable(store: Store | None, points: list[Point]) -> None:
    """Refuse (exit 2) campaigns more repeats cannot be run for: ingested logs."""
    for point in points:
        record = (store.campaign(point.campaign) if store is not None else None) or {}
        if record.get("launcher") == INGEST_LAUNCHER:
            raise UsageError(f"--until-conclusive: campaign {point.campaign!r} holds ingested logs; more repeats "
                             "cannot be run for it")  # fmt: skip


def next_repeat(cells: list[CellRow], point: Point) -> CellRow:
    """A new repeat cell of a point: `<point>-r<n>` after the point's highest active repeat (a cell of that id
    made earlier and since deactivated is reused with its results)."""
    last = max((c for c in cells if c.point_id == point.point_id), key=lambda c: c.repeat)
    repeat = last.repeat + 1
    return dataclasses.replace(last, cell_id=f"{point.point_id}-r{repeat}", repeat=repeat)


def with_cells(plan: Plan, new: list[CellRow]) -> Plan:
    """The stored campaign's plan (not executed yet) with `new` cells after its active ones: `execute`
    registers them with the rest (spec, source and launcher kept)."""
    start = max((c.ordinal for c in plan.cells), default=-1) + 1
    mine = [dataclasses.replace(c, ordinal=start + i) for i, c in enumerate(new)]
    return dataclasses.replace(plan, cells=plan.cells + mine)


def one_round(workspace: Path, pairs: list[tuple[Point, Point]], launcher: str | None) -> Driven:
    """One more repeat of each side of each pair (A then B), registered and run under both locks."""
    names = [pairs[0][0].campaign, pairs[0][1].campaign]  # every pair's A (B) point is of campaign A (B)
    tags = ("A", "B") if names[0] != names[1] else ("A/B", "A/B")
    with locked(workspace, names):
        with read_only(workspace) as store:
            check_runnable(store, [p for pair in pairs for p in pair])
        plans = {name: prepare_stored_cells(workspace, name, options_of(workspace, launcher)) for name in names}
        new: dict[tuple[str, str], CellRow] = {}
        for point in (p for pair in pairs for p in pair):
            if (point.campaign, point.point_id) not in new:  # a point on both sides gets one cell per round
                new[(point.campaign, point.point_id)] = next_repeat(plans[point.campaign].cells, point)
        sides: dict[str, Side] = {}
        for name, tag in dict(zip(names, tags, strict=True)).items():
            plan = with_cells(plans[name], [c for c in new.values() if c.campaign == name])
            execute(plan, [], _quiet, closing=False)  # the new cells registered before any runs
            sides[name] = Side(tag, plan)
        return drive(sides, list(new.values()))


def until_conclusive(workspace: Path, comparison: Comparison, again: Callable[[], Comparison],
                     budget: int = DEFAULT_BUDGET, launcher: str | None = None) -> tuple[Comparison, Driven]:  # fmt: skip
    """Run more repeats of the points of undecided pairs, a round at a time (one repeat per side per pair),
    comparing again after each round, until nothing is UNKNOWN or fewer than 2 extra cells remain in the
    budget (a reused cell counts). Returns the final comparison and the extra cells (run or failed)."""
    check_golden([p for pair in undecided(comparison) for p in pair])
    workspace = check_workspace(Path(workspace).expanduser().resolve(), create=False)
    spent, total = 0, Driven()
    while True:
        pairs = undecided(comparison)
        room = (budget - spent) // 2
        if not pairs or room < 1:
            break
        pairs = pairs[:room]
        console.print(Text(f"--until-conclusive: {len(pairs)} pair(s) undecided; one more repeat per side "
                           f"(extra cells {spent}/{budget} used so far)", style="bold"))  # fmt: skip
        driven = one_round(workspace, pairs, launcher)
        spent += len(driven.order)
        total.order += driven.order
        total.failed += driven.failed
        comparison = again()
    left = undecided(comparison)
    if left:
        console.print(Text(f"--until-conclusive: budget of {budget} extra cell(s) spent ({spent} run) with "
                           f"{len(left)} pair(s) still UNKNOWN; raise --budget to go on", style="yellow"))  # fmt: skip
    return comparison, total
