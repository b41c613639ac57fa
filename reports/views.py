"""Plain data the report writers take: one campaign, its points and their cells, as collected from the run store."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reports.gates import GateResult, GateSpec, Repeat, judge_point
from reports.window import Summary


@dataclass
class CellView:
    """One cell (a point × repeat) and its latest attempt."""

    cell_id: str
    point_id: str
    repeat: int
    label: str  # e.g. "model.moe.capacity_factor=1.25, model.moe.top_k=2"
    params: dict[str, Any]  # swept axis (dotted key) → value for this cell
    state: str  # pending | submitted | running | completed | failed | timeout | cancelled | preempted
    attempt: int = 0
    reason: str | None = None
    failure_class: str | None = None
    run_dir: str | None = None
    summary: Summary | None = None
    gate: GateResult | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)  # step rows, for curves
    fingerprint: dict[str, Any] | None = None  # env fingerprint of the attempt (GPU, driver, torch, ...)
    damaged: list[str] = field(default_factory=list)  # `path: what is wrong` per unreadable run-dir file


def mean_figure(cells: list[CellView], name: str) -> float | None:
    """Mean of a window figure over the completed cells that have it (a point's shown value)."""
    import numpy as np

    values = [getattr(c.summary, name) for c in cells if c.state == "completed" and c.summary is not None]
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite else None


@dataclass
class PointView:
    """One point of the sweep: its repeats (cells) and the verdict judged from all of them."""

    point_id: str
    label: str
    params: dict[str, Any]
    repeats: list[CellView]
    gate: GateResult | None = None  # None while no repeat has finished

    @property
    def verdict(self) -> str:
        """pass, fail or inconclusive; 'none' when no repeat has been judged (pending, running)."""
        return self.gate.verdict if self.gate is not None else "none"

    @property
    def state(self) -> str:
        """The repeats' state when they agree, else counts ('2 completed, 1 running')."""
        states = [c.state for c in self.repeats]
        if len(set(states)) == 1:
            return states[0]
        return ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states))

    @property
    def completed(self) -> list[CellView]:
        return [c for c in self.repeats if c.state == "completed" and c.summary is not None]

    def mean(self, name: str) -> float | None:
        """A figure of the point: its one repeat's (whatever its state), else the mean of completed repeats."""
        if len(self.repeats) == 1:
            summary = self.repeats[0].summary
            return getattr(summary, name) if summary is not None else None
        return mean_figure(self.repeats, name)

    @property
    def repeat_count(self) -> str:
        """'3' when every repeat is judged, else 'judged/all' ('2/3')."""
        judged = sum(1 for c in self.repeats if c.gate is not None)
        total = len(self.repeats)
        return str(total) if judged == total else f"{judged}/{total}"


def group_points(
    cells: list[CellView], judge: Callable[[list[CellView]], GateResult | None]
) -> list[PointView]:
    """Cells grouped by point (first-seen order), each point judged by `judge` from its repeats."""
    by_point: dict[str, list[CellView]] = {}
    for cell in cells:
        by_point.setdefault(cell.point_id, []).append(cell)
    return [PointView(pid, members[0].label, members[0].params, members, judge(members))
            for pid, members in by_point.items()]  # fmt: skip


def judge_cells(spec: GateSpec, cells: list[CellView]) -> GateResult | None:
    """A point's verdict from its cells' stored summaries, without a baseline (views built without a store)."""
    finished = [c for c in cells if c.gate is not None]
    if not finished:
        return None
    return judge_point(spec, [Repeat(f"repeat {c.repeat}", c.state, c.reason, c.summary) for c in finished])


@dataclass
class CampaignView:
    """A campaign as the report shows it: its cells, and its points (one per swept point, all repeats)."""

    name: str
    description: str
    axes: list[str]  # swept dotted keys, in campaign order
    cells: list[CellView]
    gates: dict[str, Any]  # the GateSpec as configured (unset limits omitted), the one the verdicts used
    window: int
    source_file: str | None = None
    generated_at: str | None = None
    baseline: str | None = None
    points: list[PointView] = field(default_factory=list)
    parity: list[dict[str, Any]] = field(
        default_factory=list
    )  # on/off pair verdicts (orchestrator/judge/parity_verdicts.py)
    infeasible: int = 0  # points recorded infeasible, never run (at plan time or on their node's GPU)

    def __post_init__(self) -> None:
        if self.cells and not self.points:  # a view built by hand: judge its points from the cells
            spec = GateSpec.model_validate(self.gates)
            self.points = group_points(self.cells, lambda cells: judge_cells(spec, cells))

    def best_point(self) -> PointView | None:
        """Highest mean window TFLOP/s/GPU among points whose repeats all completed and that did not fail."""
        candidates = [
            p for p in self.points
            if p.verdict in ("pass", "inconclusive") and p.completed and len(p.completed) == len(p.repeats)
            and p.mean("tflops_per_gpu") is not None
        ]  # fmt: skip
        return max(candidates, key=lambda p: p.mean("tflops_per_gpu") or 0.0, default=None)
