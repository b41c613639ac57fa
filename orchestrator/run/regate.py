"""Verdicts derived from stored results and a campaign's gates: per attempt, per point (all its repeats), and
`regate`, which stores them again when the gates (or the baseline's figures) changed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.run.baseline import baseline_for, baseline_summaries, summary_from_dict
from orchestrator.run.store import TERMINAL_STATES, CellRow, Store
from reports.gates import GateResult, GateSpec, Repeat, evaluate, judge_point
from reports.numerics import Spike, grad_norm_spikes
from trainer import rundir


@dataclass
class PointVerdict:
    """One point of a campaign: its cells (one per repeat) and the verdict of its finished repeats."""

    point_id: str
    label: str
    cells: list[CellRow]
    gate: GateResult | None  # None while no repeat has finished
    finished: int = 0  # repeats judged

    @property
    def verdict(self) -> str:
        return self.gate.verdict if self.gate is not None else "none"

    def why(self) -> str:
        """The failed checks' messages, else the undecided ones' (why a verdict is not a pass)."""
        if self.gate is None:
            return "no repeat has finished"
        checks = self.gate.failed or self.gate.unchecked
        return "; ".join(c.message for c in checks)


@dataclass
class Judged:
    """Fresh verdicts of a campaign from its stored results."""

    gates: dict[str, GateResult] = field(default_factory=dict)  # cell id → its latest finished attempt's
    attempts: dict[str, int] = field(default_factory=dict)  # cell id → that attempt's number
    stored: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # cell id → the stored gate result
    points: list[PointVerdict] = field(default_factory=list)
    infeasible: int = 0  # points recorded infeasible (the estimates: at plan time or on their node's GPU)


def run_spikes(
    spec: GateSpec, run_dir: str | Path | None, rows: list[dict[str, Any]] | None = None
) -> list[Spike] | None:
    """The grad-norm spikes of an attempt when the spike gate is set (from `rows`, else its metrics.jsonl);
    None when the gate is unset or the metrics cannot be read."""
    if spec.grad_norm_spikes_max is None:
        return None
    if rows is None:
        if run_dir is None:
            return None
        rows, problem = rundir.read_metrics_checked(Path(run_dir))
        if problem:
            return None
    return grad_norm_spikes(rows)


def gates_of(record: dict[str, Any]) -> GateSpec:
    """The gates of a stored campaign record; a headroom gate without gpu_memory_gib takes the memory of the
    campaign's GPU (resources.gpu, where `run --gpu` is recorded) from orchestrator/run/feasibility.py's table."""
    spec = GateSpec.model_validate(record["spec"].get("gates") or {})
    gpu = (record["spec"].get("resources") or {}).get("gpu")
    if spec.headroom_gib_min is None or spec.gpu_memory_gib is not None or not gpu:
        return spec
    from orchestrator.errors import ConfigError
    from orchestrator.run.feasibility import gpu_memory_gib

    try:
        return spec.model_copy(update={"gpu_memory_gib": gpu_memory_gib(str(gpu))})
    except ConfigError:  # an unknown name: the gate says the memory is not known
        return spec


def judge_campaign(store: Store, name: str, spec: GateSpec, baseline: str | None) -> Judged:
    """Every active cell's latest finished attempt judged with `spec`, and every point from all its repeats."""
    baselines = baseline_summaries(store, baseline)
    latest = store.latest_attempts(name)
    judged = Judged(infeasible=sum(not e["feasible"] for e in store.estimates(name)))
    by_point: dict[str, list[CellRow]] = {}
    for cell in store.cells(name):
        by_point.setdefault(cell.point_id, []).append(cell)
    for point_id, cells in by_point.items():
        repeats: list[Repeat] = []
        for cell in cells:
            attempt = latest.get(cell.cell_id)
            if attempt is None or attempt.state not in TERMINAL_STATES:
                continue
            result = store.result(name, cell.cell_id, attempt.attempt)
            summary = summary_from_dict(result.summary) if result else None
            spikes = run_spikes(spec, attempt.run_dir) if attempt.state == "completed" else None
            repeat = Repeat(f"repeat {cell.repeat}", attempt.state, attempt.reason, summary, spikes)
            judged.gates[cell.cell_id] = evaluate(spec, summary, repeat.state, repeat.reason,
                                                  baseline_for(baselines, cell), spikes)  # fmt: skip
            judged.attempts[cell.cell_id] = attempt.attempt
            judged.stored[cell.cell_id] = result.gate if result else None
            repeats.append(repeat)
        gate = judge_point(spec, repeats, baseline_for(baselines, cells[0])) if repeats else None
        judged.points.append(PointVerdict(point_id, cells[0].label, cells, gate, len(repeats)))
    return judged


def _same(stored: dict[str, Any] | None, fresh: GateResult) -> bool:
    """Whether a stored gate result says what a fresh one says (messages aside: a stored one may carry a
    collection note, e.g. which metrics file was damaged)."""
    if stored is None:
        return False

    def key(check: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(check.get(k) for k in ("gate", "ok", "value", "limit", "low", "high"))

    fresh_dict = fresh.to_dict()
    return stored.get("verdict") == fresh_dict["verdict"] and [key(c) for c in stored.get("checks", [])] == [
        key(c) for c in fresh_dict["checks"]
    ]


@dataclass
class Regated:
    """What `regate` did: the fresh verdicts, and one line per point or stored result whose verdict changed."""

    judged: Judged
    changes: list[str]
    rewritten: int  # stored results written again
    gates_changed: bool
    # each verdict kind's records, judged again (kind name → records; "parity": the pairs)
    verdicts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    trials: list[dict[str, Any]] = field(default_factory=list)  # a search's trial rows: its answer
    # set by the lifecycle (judge/outcome.py's Outcome; run/ stays below judge/): a search's outcome, its answer
    # judged again (judge/search_answer.py), and the campaign's outcome, what regate's closing line says
    searched: Any = None
    outcome: Any = None
    unwritten: dict[str, Path] = field(default_factory=dict)  # outputs a full disk kept out, and where


def regate(store: Store, name: str, spec: GateSpec | None = None) -> Regated:
    """Re-judge every stored result of campaign `name` with its gates (or `spec`, which is then stored as its
    gates) and store the results that changed, in one transaction (orchestrator/run/store.py)."""
    record = store.campaign(name)
    if record is None:
        raise KeyError(name)
    baseline = record["spec"].get("baseline")
    old = gates_of(record)
    new = spec if spec is not None else old
    gates_changed = new.model_dump(mode="json") != old.model_dump(mode="json")
    after = judge_campaign(store, name, new, baseline)
    before = judge_campaign(store, name, old, baseline) if gates_changed else after
    updates = {(cell_id, after.attempts[cell_id]): gate.to_dict()
               for cell_id, gate in after.gates.items() if not _same(after.stored[cell_id], gate)}  # fmt: skip
    new_spec = {**record["spec"], "gates": new.model_dump(mode="json")} if gates_changed else None
    if updates or new_spec is not None:
        store.update_verdicts(name, updates, new_spec)
    changes, named = [], set()
    for was, now in zip(before.points, after.points, strict=True):
        if was.verdict != now.verdict:
            why = f": {now.why()}" if now.verdict != "pass" else ""
            changes.append(f"point {now.point_id} [{now.label}]: {was.verdict} → {now.verdict}{why}")
            named.update(c.cell_id for c in now.cells)
    for cell_id, gate in after.gates.items():
        stored = (after.stored[cell_id] or {}).get("verdict")
        if stored != gate.verdict and cell_id not in named:
            changes.append(f"cell {cell_id} attempt {after.attempts[cell_id]}: stored verdict "
                           f"{stored or 'none'} → {gate.verdict}")  # fmt: skip
    return Regated(after, changes, len(updates), gates_changed)
