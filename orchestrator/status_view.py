"""`mbx campaign status`: every cell's state, attempt, window figures and verdict, as a table or JSON."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from orchestrator.progress import fmt
from reports.views import CampaignView, CellView


def status_payload(view: CampaignView) -> list[dict[str, Any]]:
    return [
        {
            "cell_id": c.cell_id,
            "label": c.label,
            "params": c.params,
            "state": c.state,
            "attempt": c.attempt,
            "reason": c.reason,
            "failure_class": c.failure_class,
            "verdict": c.gate.verdict if c.gate else None,
            "summary": c.summary.to_dict() if c.summary else None,
            "run_dir": c.run_dir,
        }
        for c in view.cells
    ]


def status_table(view: CampaignView) -> Table:
    """Cells with their window figures; the swept values go under the cell id so it fits 80 columns."""
    table = Table(title=f"{view.name}: {len(view.cells)} cell(s), window {view.window}", title_justify="left")
    table.add_column("cell / params", min_width=14, overflow="fold")
    table.add_column("state")
    for column in ("try", "TFLOP/s", "ms/step", "GiB"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("loss", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for cell in view.cells:
        table.add_row(*_status_cells(cell))
    return table


def _status_cells(cell: CellView) -> list[Any]:
    s = cell.summary
    verdict = cell.gate.verdict if cell.gate else "—"
    style = {"pass": "green", "fail": "red", "inconclusive": "yellow"}.get(verdict, "")
    state = cell.state + (f" ({cell.failure_class})" if cell.failure_class else "")
    return [
        Text.assemble(cell.cell_id, "\n", (cell.label, "dim")),
        Text(state, style="red" if cell.state in ("failed", "timeout", "cancelled") else ""),
        str(cell.attempt or "—"),
        fmt(s.tflops_per_gpu if s else None),
        fmt(s.step_time_ms if s else None, 4),
        fmt(s.peak_alloc_gib if s else None),
        f"{fmt(s.first_loss)}→{fmt(s.last_loss)}" if s else "—",
        Text(verdict, style=style),
    ]
