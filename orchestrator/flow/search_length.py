"""A search's run lengths: the sweep's planned length (every point's), and its full length (the run length its best
is picked at) from the campaign as the store keeps it: what its report calls "full length", even when its budget
stopped it before any trial ran that long."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator import trainers
from orchestrator.errors import ConfigError, MbxError
from orchestrator.judge.search_rank import target_steps
from orchestrator.run.store import CellRow
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.sweep import Point as SweepPoint


def search_full_steps(record: dict[str, Any] | None) -> int | None:
    """A halving's last rung, else the sweep's planned run length; None for a campaign that is not a search, or
    whose stored spec no longer resolves (the report then takes its longest trial's)."""
    spec = (record or {}).get("spec") or {}
    if not isinstance(spec.get("sweep"), dict) or not spec["sweep"].get("search"):
        return None
    try:
        campaign = Campaign.model_validate(spec)
        search = campaign.sweep.search
        if search is None:
            return None
        if search.method == "halving":  # its last rung, whatever the recipe's length
            return target_steps(search, 0)
        source = Path(record["source_file"]) if record and record.get("source_file") else None
        file = source if source is not None and source.exists() else None  # a recipe_file is relative to it
        return target_steps(search, full_steps(trainers.expand(campaign, file, None, strict=False)))
    except (MbxError, ValidationError, OSError):
        return None


def full_steps(points: list[SweepPoint]) -> int:
    """The planned run length of the sweep's points (every point must have the same)."""
    lengths = set()
    for p in points:
        cell = cell_rows_of(p)
        lengths.add(trainers.get(p.trainer_kind).planned_steps(cell))
    if len(lengths) != 1 or None in lengths:
        raise ConfigError(f"sweep.search: the points must share one known run length to search over "
                          f"(found {sorted(str(n) for n in lengths)}); set it in the base recipe, not the sweep")  # fmt: skip
    return int(next(iter(lengths)))  # type: ignore[arg-type]


def cell_rows_of(point: SweepPoint) -> CellRow:
    """The store row a swept point's cell would have (what a trainer kind reads its planned steps from)."""
    return CellRow(campaign="", cell_id=point.cell_id, point_id=point.point_id, repeat=point.repeat, ordinal=0,
                   label=point.label, params=point.params, recipe=point.recipe, resources=point.resources,
                   env=point.env, trainer_kind=point.trainer_kind)  # fmt: skip
