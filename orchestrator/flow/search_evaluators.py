"""Runs a search's candidates: a recorded table (TableEvaluator) or the real engine (CampaignEvaluator)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from orchestrator.flow.options import Options
from orchestrator.flow.search_length import full_steps
from orchestrator.judge.compare import Point, Repeat, floors_of, load_points
from orchestrator.judge.run_floor import FloorBook
from orchestrator.judge.search_rank import BASE_KEY, Candidate, Evidence, candidate_key
from orchestrator.run.regate import gates_of, judge_campaign
from orchestrator.run.store import Store
from orchestrator.spec.campaign import Campaign, Sweep
from orchestrator.spec.search import Search
from orchestrator.spec.sweep import Point as SweepPoint
from orchestrator.trainers import expand
from trainer import rundir

console = Console(highlight=False, markup=False, emoji=False)  # labels are user text: never markup

# What runs a rung's points: the lifecycle (prepare and execute them, or render them for a dry run), passed in by
# lifecycle.execute / render; tests/test_verdicts_search.py passes a replay of recorded runs instead.
RungRunner = Callable[[Campaign, list[SweepPoint]], object]


# ---- a recorded table ----------------------------------------------------------------------------------------
class TableEvaluator:
    """Replays recorded runs instead of running (benchmarks/search_budget.py): each candidate key has runs by
    length (`{steps: [metrics rows]}`); a length not recorded is the first `steps` rows of a longer run (the
    same steps a shorter run would time; only its learning-rate schedule, not timed here, would differ)."""

    def __init__(
        self, runs: dict[str, dict[int, list[dict[str, Any]]]], full_steps: int, window: int = 10
    ) -> None:
        self.runs, self.full_steps, self.window, self.repeats = runs, full_steps, window, 1

    @classmethod
    def load(
        cls, path: Path, steps_key: str = "training.steps", window: int = 10
    ) -> tuple[list[Candidate], TableEvaluator, dict[str, list[Any]]]:
        """(candidates, evaluator, axes) of a table written by benchmarks/search_budget.py: `points`, each with
        `params`, `label` and `runs` ({steps: metrics rows})."""
        import json

        runs: dict[str, dict[int, list[dict[str, Any]]]] = {}
        cands, axes = [], {}
        for entry in json.loads(Path(path).read_text())["points"]:
            key = candidate_key(entry["params"], steps_key)
            cands.append(Candidate(key, entry["label"], entry["params"]))
            runs[key] = {int(n): rows for n, rows in entry["runs"].items()}
            for name, value in entry["params"].items():
                values = axes.setdefault(name, [])
                values.extend([value] if value not in values else [])
        return cands, cls(runs, max(max(r) for r in runs.values()), window), axes

    def rows(self, key: str, steps: int) -> list[dict[str, Any]]:
        by_length = self.runs[key]
        if steps in by_length:
            return by_length[steps]
        longer = min(n for n in by_length if n > steps)
        return [r for r in by_length[longer] if r["step"] <= steps]

    def evaluate(
        self, candidates: list[Candidate], steps: int, base: bool
    ) -> tuple[dict[str, Evidence], Evidence | None]:
        from reports.window import summarize, window_rows

        out = {}
        for c in candidates:
            rows = self.rows(c.key, steps)
            repeat = Repeat(
                f"{c.key}@{steps}",
                summarize(rows, self.window).to_dict(),
                window_rows(rows, self.window),
                {},
                rows,
            )
            point = Point("table", f"{c.key}@{steps}", c.label, c.params, [repeat.cell_id], [repeat])
            hours = sum(float(r.get("step_time_ms") or 0) for r in rows) / 3.6e6
            out[c.key] = Evidence(
                c, steps, "completed", point, verdict="pass", cost_steps=steps, gpu_hours=hours
            )
        return out, None

    def floors(self) -> FloorBook | None:
        """No workspace: one-run verdicts take the stated default floor."""
        return None


# ---- the real engine --------------------------------------------------------------------------------------
class CampaignEvaluator:
    """Runs candidates through the lifecycle (`runner`: prepare the rung's points and execute them, passed in by
    lifecycle.execute): the rung's points only, the run length
    set through `search.steps_key` (a one-value axis, so a shorter run is its own cell and its label says
    `steps=N`); a full-length run is exactly the grid's cell. Infeasible and failed trials already in the
    store's `trials` table are read back and not run again. With `dry_run` (`mbx campaign run --dry-run`), the
    first batch the strategy asks for (the first rung of a halving, the first trial of Optuna, the sample of
    random, the whole grid) is rendered at its run length, then the search stops; nothing is written."""

    def __init__(self, campaign: Campaign, points: list[SweepPoint], file: Path | None, options: Options) -> None:
        self.workspace, self.campaign, self.file, self.options = Path(options.workspace), campaign, file, options
        self.runner: RungRunner | None = None  # set by the lifecycle when the plan executes (or renders)
        self.dry_run = False
        self.search: Search = campaign.sweep.search or Search()
        self.repeats = campaign.sweep.repeats
        self.full_steps = full_steps(points)
        self.expanded: dict[int, dict[str, list[SweepPoint]]] = {self.full_steps: self.by_key(points)}
        self.ran: dict[str, SweepPoint] = {}  # every cell run, for the report
        self.known: dict[tuple[str, int], Evidence] = {}

    def by_key(self, points: list[SweepPoint]) -> dict[str, list[SweepPoint]]:
        grouped: dict[str, list[SweepPoint]] = {}
        for p in points:
            grouped.setdefault(candidate_key(p.params, self.search.steps_key), []).append(p)
        return grouped

    def campaign_at(self, steps: int, base: bool = False) -> Campaign:
        """The campaign whose points run `steps` long (`base`: the base recipe alone, no sweep)."""
        sweep = self.campaign.sweep.model_dump(mode="json", by_alias=True, exclude={"search"})
        if base:
            sweep.update(axes={}, zip=[], cells=[], exclude=[])
        if steps != self.full_steps:
            sweep["axes"] = {**sweep["axes"], self.search.steps_key: [steps]}
        return self.campaign.model_copy(update={"sweep": Sweep.model_validate(sweep)})

    def points_at(self, steps: int) -> dict[str, list[SweepPoint]]:
        if steps not in self.expanded:
            self.expanded[steps] = self.by_key(expand(self.campaign_at(steps), self.file, None, strict=False))
        return self.expanded[steps]

    def cells_to_run(self, candidates: list[Candidate], steps: int, base: bool
                     ) -> tuple[list[Candidate], list[SweepPoint], list[SweepPoint], list[SweepPoint]]:
        """(candidates not yet known, their cells, the base recipe's cells, all cells to run once each)."""
        at = self.points_at(steps)
        todo = [c for c in candidates if (c.key, steps) not in self.known]
        cells = [p for c in todo for p in at[c.key]]
        base_cells = expand(self.campaign_at(steps, base=True), self.file, None, strict=False) if base else []
        run = list(
            {p.cell_id: p for p in cells + base_cells}.values()
        )  # the base recipe may be a swept point
        return todo, cells, base_cells, run

    def evaluate(
        self, candidates: list[Candidate], steps: int, base: bool
    ) -> tuple[dict[str, Evidence], Evidence | None]:
        if self.dry_run:
            self.first_batch(candidates, steps, base)
        assert self.runner is not None, "the lifecycle sets the runner when the plan executes"
        at = self.points_at(steps)
        todo, cells, base_cells, run = self.cells_to_run(candidates, steps, base)
        if run:
            extra = {p.cell_id for p in base_cells} - {p.cell_id for p in cells}
            with_base = " and the base recipe" if extra else ""
            console.print(Text(f"{self.campaign.name}: search {self.search.method}: {len(todo)} point(s){with_base} "
                               f"at {steps} steps"))  # fmt: skip
            self.runner(self.campaign, run)
        with Store(self.workspace, create=False) as store:
            read = StoreReader(store, self.campaign.name)
            found = {
                c.key: self.known.get((c.key, steps)) or read.evidence(c, at[c.key], steps)
                for c in candidates
            }
            base_evidence = (
                read.evidence(Candidate(BASE_KEY, "base", {}), base_cells, steps) if base else None
            )
        if base_evidence is not None and {p.cell_id for p in base_cells} <= {p.cell_id for p in cells}:
            base_evidence.cost_steps = base_evidence.gpu_hours = 0  # a swept point: its run is counted there
        if run:  # the cells that ran, for the report: not those of a point its node refused (infeasible)
            refused = {c.key for c in todo if found[c.key].state == "infeasible"}
            if base_evidence is not None and base_evidence.state == "infeasible":
                refused.add(BASE_KEY)
            keyed = [(c.key, p) for c in todo for p in at[c.key]] + [(BASE_KEY, p) for p in base_cells]
            self.ran.update({p.cell_id: p for key, p in keyed if key not in refused})
        return found, base_evidence


    def floors(self) -> FloorBook | None:
        """The workspace's run-to-run floors as they stand (the same `mbx freeze` reads afterwards)."""
        with Store(self.workspace, create=False) as store:
            return floors_of(store)


    def first_batch(self, candidates: list[Candidate], steps: int, base: bool) -> None:
        """A dry run: the first batch rendered by the runner (the lifecycle's dry run), then FirstBatchShown."""
        todo, _, base_cells, run = self.cells_to_run(candidates, steps, base)
        with_base = " and the base recipe" if base_cells else ""
        console.print(Text(f"{self.campaign.name}: search {self.search.method} would first run {len(todo)} "
                           f"point(s){with_base} at {steps} steps ({len(run)} cell(s))"))  # fmt: skip
        if run and self.runner is not None:
            self.runner(self.campaign, run)
        raise FirstBatchShown


class FirstBatchShown(Exception):
    """Raised by a dry run's evaluator once the search's first batch is rendered: what runs next depends on it."""


class StoreReader:
    """A rung's evidence as the store has it after the rung ran: completed repeats, verdicts, failures."""

    def __init__(self, store: Store, name: str) -> None:
        self.latest = store.latest_attempts(name)
        self.points = {p.point_id: p for p in load_points(store, name)}
        record = store.campaign(name) or {"spec": {}}
        judged = judge_campaign(store, name, gates_of(record), record["spec"].get("baseline"))
        self.verdicts = {p.point_id: p.verdict for p in judged.points}
        self.estimates = (
            {r["point_id"]: r for r in store.estimates(name)} if hasattr(store, "estimates") else {}
        )

    def evidence(self, candidate: Candidate, cells: list[SweepPoint], steps: int) -> Evidence:
        """The candidate's evidence at `steps`; an attempt its node refused (the GPU check: class infeasible,
        exit 78, the trainer never started) costs nothing: not in the steps, GPU-hours or points spent."""
        ran = [(self.latest[p.cell_id], p) for p in cells if p.cell_id in self.latest]
        attempts = [a for a, _ in ran]
        charged = [(a, p) for a, p in ran if a.failure_class != rundir.INFEASIBLE]
        hours = sum(max(0.0, (a.ended_at or a.submitted_at or 0) - (a.submitted_at or 0)) * p.world_size
                    for a, p in charged) / 3600  # fmt: skip
        ev = Evidence(candidate, steps, "completed", cost_steps=steps * len(charged), gpu_hours=hours)
        point_id = cells[0].point_id if cells else None
        point = self.points.get(point_id) if point_id else None
        estimate = self.estimates.get(point_id) if point_id else None
        if cells and cells[0].infeasible:
            ev.state, ev.reason = "infeasible", "; ".join(cells[0].infeasible)
        elif point is not None and attempts and len(point.repeats) == len(cells):
            ev.point, ev.verdict = point, self.verdicts.get(point.point_id, "none")
        elif any(a.failure_class == "oom" for a in attempts):
            ev.state, ev.reason = "infeasible", "out of memory"
        elif estimate is not None and not estimate.get("feasible", True):
            ev.state, ev.reason = "infeasible", str(estimate.get("reason") or "does not fit the GPU")
        else:
            failed = [a for a in attempts if a.state != "completed"]
            why = f"{failed[0].state}: {failed[0].reason}" if failed else "not run"
            ev.state, ev.reason = "failed", why
        return ev
