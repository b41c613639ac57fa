"""Baseline summaries a campaign's relative gates compare with, matched cell by cell."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.run.store import CellRow, Store
from reports.window import Summary

SOLE_BASELINE = "*"  # key of the baseline summary that serves every cell (a baseline with a single point)


def summary_from_dict(data: dict[str, Any] | None) -> Summary | None:
    """A stored window summary (the results table's summary_json) as a Summary."""
    return Summary(**data) if data else None


def params_key(params: dict[str, Any]) -> str:
    return "params:" + json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


def baseline_for(baselines: dict[str, Summary], cell: CellRow) -> Summary | None:
    """A cell's baseline: the same point, else the baseline cell with equal swept values, else the
    baseline campaign's only point (e.g. one ingested past run)."""
    return (
        baselines.get(cell.point_id)
        or (baselines.get(params_key(cell.params)) if cell.params else None)
        or baselines.get(SOLE_BASELINE)
    )


def baseline_summaries(store: Store, baseline: str | None) -> dict[str, Summary]:
    """Window summaries of the baseline campaign's completed cells by point id (first repeat wins),
    by swept values (`params:...`), and under `*` when the baseline has a single point."""
    if not baseline:
        return {}
    summaries: dict[str, Summary] = {}
    latest = store.latest_attempts(baseline)
    points: set[str] = set()
    for cell in store.cells(baseline):
        points.add(cell.point_id)
        attempt = latest.get(cell.cell_id)
        if attempt is None or attempt.state != "completed" or cell.point_id in summaries:
            continue
        result = store.result(baseline, cell.cell_id, attempt.attempt)
        summary = summary_from_dict(result.summary) if result else None
        if summary is not None:
            summaries[cell.point_id] = summary
            if cell.params:
                summaries.setdefault(params_key(cell.params), summary)
    if len(points) == 1 and summaries:
        summaries[SOLE_BASELINE] = next(iter(summaries.values()))
    return summaries
