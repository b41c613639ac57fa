"""A search's run lengths: the sweep's planned length (every point's), its full length (the run length its best
is picked at) from the campaign as the store keeps it: what its report calls "full length", even when its budget
stopped it before any trial ran that long; and the check that its steps key really sets a shorter trial's length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator import trainers
from orchestrator.errors import ConfigError, MbxError
from orchestrator.judge.search_rank import target_steps
from orchestrator.run.store import CellRow
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.search import Search
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


def short_steps(search: Search, full: int) -> int | None:
    """The length of the shorter trials a search runs through its steps key (a halving's first rung, an Optuna
    trial's short run when it prunes); None: it runs every trial at full length (grid, random)."""
    if search.method == "halving":
        return search.halving.steps[0]
    if search.method == "optuna" and search.optuna.prune:
        short = search.optuna.prune_at or max(5, full // 10)
        return short if short < full else None
    return None


def check_steps_key(campaign: Campaign, points: list[SweepPoint], file: Path | None) -> None:
    """ConfigError (exit 2, before anything is written) when a search that runs shorter trials cannot set their
    length through `sweep.search.steps_key`: the trainer kind refuses the key, or its planned steps stay the
    same (e.g. a command's trainer.steps overrides params.train_iters)."""
    search = campaign.sweep.search
    if search is None or not points:
        return
    short = short_steps(search, full_steps(points))
    if short is None:
        return
    key, where = search.steps_key, str(file) if file else campaign.name
    sweep = campaign.sweep.model_copy(update={"axes": {key: [short]}, "zip": [], "cells": [], "exclude": [],
                                              "search": None, "repeats": 1})  # fmt: skip
    probe = campaign.model_copy(update={"sweep": sweep})  # the base recipe at the short length
    try:
        planned = {trainers.get(p.trainer_kind).planned_steps(cell_rows_of(p)) for p in
                   trainers.expand(probe, file, None, strict=False)}  # fmt: skip
        problem = None if planned == {short} else f"its trials would still plan {sorted(map(str, planned))} steps"
    except ConfigError as err:
        problem = "; ".join(p.split(": ", 1)[-1] for p in err.problems)
    if problem is None:
        return
    raise ConfigError([f"sweep.search.steps_key: {key!r} does not set a {short}-step trial's length "
                       f"({problem}); {_steps_key_hint(campaign, search)}"], file=where)  # fmt: skip


def _steps_key_hint(campaign: Campaign, search: Search) -> str:
    """What to set instead: the kind's own steps key; for a command, trainer.steps left out (it overrides
    params.train_iters); for Optuna, no pruning (every trial at full length)."""
    kind = trainers.for_campaign(campaign)
    fits, why = kind.steps_key(campaign), "its rungs" if search.method == "halving" else "its short runs"
    hints = [f"the search runs {why} through it"]
    if fits is not None and fits != search.steps_key:
        hints.append(f"set sweep.search.steps_key: {fits} (what sets a {kind.name} trainer's run length)")
    steps = getattr(campaign.trainer, "steps", None)
    if kind.name == "command" and steps:
        hints.append(f"trainer.steps ({steps}) overrides {fits}: leave it out and give the run length as {fits}")
    if search.method == "optuna":
        hints.append("or set sweep.search.optuna.prune: false (every trial at full length)")
    return "; ".join(hints)
