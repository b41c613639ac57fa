"""Plain data the report writers take: one campaign and its cells, as collected from the run store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reports.gates import GateResult
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


@dataclass
class CampaignView:
    """A campaign as the report shows it."""

    name: str
    description: str
    axes: list[str]  # swept dotted keys, in campaign order
    cells: list[CellView]
    gates: dict[str, Any]  # the GateSpec as configured (unset limits omitted)
    window: int
    source_file: str | None = None
    generated_at: str | None = None
    baseline: str | None = None

    def best_cell(self) -> CellView | None:
        """Highest window TFLOP/s/GPU among completed cells that did not fail a gate."""
        candidates = [
            c
            for c in self.cells
            if c.state == "completed"
            and c.summary is not None
            and c.summary.tflops_per_gpu is not None
            and (c.gate is None or c.gate.verdict != "fail")
        ]
        return max(candidates, key=lambda c: c.summary.tflops_per_gpu, default=None)  # type: ignore[union-attr]
