"""`mbx campaign status`: one row per point (its verdict from all repeats, the repeats under it) as a table, or
every cell as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from orchestrator.judge.outcome import Outcome, view_outcome
from orchestrator.run.progress import fmt
from reports import flops_check
from reports.views import CampaignView, CellView, PointView
from reports.window import Summary


def status_payload(view: CampaignView) -> list[dict[str, Any]]:
    """Every cell with its attempt's verdict and its point's verdict (from all the point's repeats)."""
    point_verdicts = {p.point_id: p.verdict for p in view.points}
    return [
        {
            "cell_id": c.cell_id,
            "point_id": c.point_id,
            "repeat": c.repeat,
            "point_verdict": point_verdicts.get(c.point_id),
            "label": c.label,
            "params": c.params,
            "state": c.state,
            "attempt": c.attempt,
            "reason": c.reason,
            "failure_class": c.failure_class,
            "verdict": c.gate.verdict if c.gate else None,
            "summary": c.summary.to_dict() if c.summary else None,
            "run_dir": c.run_dir,
            "damaged": c.damaged,
            "flops_check": _flops_json(flops_check.check(c.summary)),
        }
        for c in view.cells
    ]


def _flops_json(found: flops_check.FlopsCheck | None) -> dict[str, Any] | None:
    """The printed TFLOP/s/GPU against mbx's own count (reports/flops_check.py); None where either is missing."""
    if found is None:
        return None
    return {"printed": found.printed, "mbx": found.mbx, "delta": found.delta, "agrees": found.agrees,
            "note": found.note()}  # fmt: skip


def status_table(view: CampaignView) -> Table:
    """One row per point with its verdict (from all repeats); a point's repeats in rows under it. The swept
    values go under the id so it fits 80 columns."""
    title = Text(f"{view.name}: {len(view.points)} point(s), {len(view.cells)} cell(s), window {view.window}")
    table = Table(title=title, title_justify="left")
    table.add_column("point / params", min_width=14, overflow="fold")
    table.add_column("state")
    for column in ("try", "TFLOP/s", "ms/step", "GiB"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("loss", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for point in view.points:
        if len(point.repeats) == 1:
            table.add_row(*_status_cells(point.repeats[0], point.verdict))
            continue
        table.add_row(*_point_cells(point))
        for cell in point.repeats:
            table.add_row(*_repeat_cells(cell))
    return table


def damaged_lines(view: CampaignView) -> list[Text]:
    """One line per damaged run-dir file (the table shows what the store holds; these say what is unreadable)."""
    return [
        Text.assemble(("  damaged: ", "bold yellow"), f"{cell.cell_id}: ", (problem, "yellow"))
        for cell in view.cells
        for problem in cell.damaged
    ]


def flops_lines(view: CampaignView) -> list[Text]:
    """Under the table: whether the printed TFLOP/s/GPU agrees with mbx's own Megatron-LM count (one line for the
    cells that agree, one per cell that does not; nothing where mbx has no count)."""
    agreed = flops_check.agreement_line(view.cells)
    lines = [Text(f"  {agreed}")] if agreed else []
    return lines + [
        Text.assemble(("  warning: ", "bold yellow"), f"{cell.cell_id}: ", (found.note(), "yellow"))
        for cell, found in flops_check.disagreements(view.cells)
    ]


_STYLE = {"pass": "green", "fail": "red", "inconclusive": "yellow"}


def _figures(s: Summary | None) -> list[str]:
    return [
        fmt(s.tflops_per_gpu if s else None),
        fmt(s.step_time_ms if s else None, 4),
        fmt(s.peak_alloc_gib if s else None),
        f"{fmt(s.first_loss)}→{fmt(s.last_loss)}" if s else "—",
    ]


def _state(cell: CellView) -> Text:
    state = cell.state + (f" ({cell.failure_class})" if cell.failure_class else "")
    return Text(state, style="red" if cell.state in ("failed", "timeout", "cancelled") else "")


def _status_cells(cell: CellView, verdict: str) -> list[Any]:
    """A point of one repeat: its cell's row, with the point's verdict."""
    verdict = "—" if verdict == "none" else verdict
    note = ("\ndamaged file(s): see below", "yellow") if cell.damaged else ""
    return [
        Text.assemble(cell.cell_id, "\n", (cell.label, "dim"), note),
        _state(cell),
        str(cell.attempt or "—"),
        *_figures(cell.summary),
        Text(verdict, style=_STYLE.get(verdict, "")),
    ]


def _point_cells(point: PointView) -> list[Any]:
    """A point of several repeats: the means of its completed repeats and its verdict."""
    verdict = "—" if point.verdict == "none" else point.verdict
    loss = f"{fmt(point.mean('first_loss'))}→{fmt(point.mean('last_loss'))}" if point.completed else "—"
    return [
        Text.assemble(point.point_id, f" ({point.repeat_count} repeats, means)", "\n", (point.label, "dim")),
        Text(point.state),
        "",
        fmt(point.mean("tflops_per_gpu")),
        fmt(point.mean("step_time_ms"), 4),
        fmt(point.mean("peak_alloc_gib")),
        loss,
        Text(verdict, style="bold " + _STYLE[verdict] if verdict in _STYLE else ""),
    ]


def _repeat_cells(cell: CellView) -> list[Any]:
    """One repeat under its point: its figures and its own attempt's verdict (dim)."""
    note = ("\n  damaged file(s): see below", "yellow") if cell.damaged else ""
    verdict = cell.gate.verdict if cell.gate else "—"
    return [
        Text.assemble(f"  └ {cell.cell_id}", note),
        _state(cell),
        str(cell.attempt or "—"),
        *_figures(cell.summary),
        Text(verdict, style="dim"),
    ]


def status_json(workspace: Path, view: CampaignView) -> dict[str, Any]:
    """`status --json` (and the `--json` closings of run, resume, regate): the campaign's outcome and every cell."""
    return {"campaign": view.name, **_outcome(workspace, view).to_dict(), "cells": status_payload(view)}


def _outcome(workspace: Path, view: CampaignView) -> Outcome:
    """The campaign's outcome now (a search: its answer judged again with the current gates)."""
    from orchestrator.judge.search_answer import search_answer

    return view_outcome(view, searched=search_answer(workspace, view.name))


def verdict_lines(workspace: Path, view: CampaignView) -> list[Text]:
    """Below the table: the campaign's outcome (orchestrator/judge/outcome.py, the closing line's word), the
    verdict kinds' records that did not pass (parity pairs), and the best point as the report names it
    (orchestrator/flow/runner.py's pick_winner: the verdicts' pick, never a point a verdict kind rules out), or
    why there is none."""
    from orchestrator.flow.runner import pick_winner
    from orchestrator.judge import closing, verdict_kinds
    from reports.site_data import SiteExtras

    lines = [closing.closing_text(_outcome(workspace, view)), *closing.verdict_lines(verdict_kinds.of_view(view))]
    if not any(c.state == "completed" for c in view.cells):
        return lines
    picked = SiteExtras()
    pick_winner(workspace, view, picked)
    if picked.winner is None:
        note = (picked.freeze_note or "").removeprefix("No winner picked by the verdicts: ")
        return [*lines, Text.assemble(("no best point: ", "bold yellow"), note.removeprefix("No best point: "))]
    label = next((p.label for p in view.points if p.point_id == picked.winner), "")
    return [*lines, Text.assemble(("best: ", "bold"), f"{picked.winner} [{label}]: {picked.how}")]
