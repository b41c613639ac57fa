"""Sweep expansion: the one loop from a campaign to its points (each with a stable cell id); a trainer kind
supplies how one point resolves (`PointResolver`)."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.errors import ConfigError
from orchestrator.rows import DEFAULT_KIND
from orchestrator.spec.campaign import Campaign

DEFAULT_MAX_CELLS = 10_000  # cells a sweep may name (before exclusions); --max-cells raises it


@dataclass(frozen=True)
class Point:
    """One cell: a resolved recipe and resources, repeated `repeat` times."""

    cell_id: str
    point_id: str
    repeat: int
    params: dict[str, Any]
    recipe: dict[str, Any]  # resolved recipe, all fields (what is written to recipe.yaml); read-only, shared
    # between the cells of one point (and of points that resolve to the same recipe)
    resources: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    label: str = ""
    trainer_kind: str = DEFAULT_KIND  # the trainer kind that runs it (orchestrator.trainers)
    infeasible: tuple[str, ...] = ()  # layout problems (`point [..]: key: problem`): it cannot run as asked

    @property
    def world_size(self) -> int:
        return int(self.resources["nodes"]) * int(self.resources["gpus_per_node"])


def canonical_json(data: Any) -> str:
    """JSON with sorted keys and no whitespace: the input of cell-id hashes."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def point_digest(identity: dict[str, Any]) -> str:
    """10 hex digits of sha256 over the canonical identity of a point."""
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:10]


def _factors(campaign: Campaign) -> list[list[dict[str, Any]]]:
    factors = [[{key: value} for value in values] for key, values in campaign.sweep.axes.items()]
    for group in campaign.sweep.zip:
        keys = list(group)
        length = len(group[keys[0]])
        factors.append([{key: group[key][i] for key in keys} for i in range(length)])
    return factors


def assignments(campaign: Campaign) -> list[dict[str, Any]]:
    """The swept key → value mappings of every point, in order, before repeats, exclusions applied."""
    factors = _factors(campaign)
    points: list[dict[str, Any]] = []
    if factors:
        for combo in itertools.product(*factors):
            merged: dict[str, Any] = {}
            for part in combo:
                merged.update(part)
            points.append(merged)
    points.extend(dict(cell) for cell in campaign.sweep.cells)
    if not points:
        points = [{}]
    return [p for p in points if not any(_matches(rule, p) for rule in campaign.sweep.exclude)]


def _matches(rule: dict[str, Any], point: dict[str, Any]) -> bool:
    for key, wanted in rule.items():
        if key not in point:
            return False
        options = wanted if isinstance(wanted, list) else [wanted]
        if point[key] not in options:
            return False
    return True


def swept_keys(campaign: Campaign) -> list[str]:
    """Every dotted key the sweep sets, in campaign order."""
    keys: list[str] = list(campaign.sweep.axes)
    for group in campaign.sweep.zip:
        keys.extend(k for k in group if k not in keys)
    for cell in campaign.sweep.cells:
        keys.extend(k for k in cell if k not in keys)
    return keys


def _short_labels(keys: list[str]) -> dict[str, str]:
    """Shortest unique dotted suffix of each key, for readable labels."""
    short: dict[str, str] = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            candidate = ".".join(parts[-n:])
            if sum(1 for other in keys if other == candidate or other.endswith("." + candidate)) == 1:
                short[key] = candidate
                break
        else:
            short[key] = key
    return short


def key_locations(campaign: Campaign) -> list[tuple[str, str]]:
    """(where in the file, dotted key) of every key the sweep names, exclusions included."""
    locations = [(f"sweep.axes.{k}", k) for k in campaign.sweep.axes]
    locations += [(f"sweep.zip[{i}].{k}", k) for i, g in enumerate(campaign.sweep.zip) for k in g]
    locations += [(f"sweep.cells[{i}].{k}", k) for i, c in enumerate(campaign.sweep.cells) for k in c]
    locations += [(f"sweep.exclude[{i}].{k}", k) for i, r in enumerate(campaign.sweep.exclude) for k in r]
    return locations


@dataclass(frozen=True)
class ResolvedPoint:
    """One point as a trainer kind resolved it: what recipe.yaml records, resources, env, and its identity."""

    recipe: dict[str, Any]
    resources: dict[str, Any]
    env: dict[str, str]
    identity: dict[str, Any]  # the input of the cell id: everything that changes what runs
    infeasible: tuple[str, ...] = ()  # layout problems: a valid point that cannot run on its world as asked


class PointProblems(ValueError):
    """Why a point cannot run: lines such as `point [top_k=16]: trainer.recipe.model.moe: ...`."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


class PointResolver(Protocol):
    """How a trainer kind turns sweep keys and one assignment into a point."""

    name: str

    def key_problems(self, campaign: Campaign, locations: list[tuple[str, str]]) -> list[str]:
        """`where: problem` for sweep keys this kind cannot address."""
        ...

    def resolver(
        self, campaign: Campaign, campaign_file: Path | None
    ) -> Callable[[dict[str, Any], str], ResolvedPoint]:
        """A function resolving one assignment (`where`: the point's prefix for problems); work every point
        shares (the base recipe, a recipe file) is done once. It raises PointProblems."""
        ...


def cell_count(campaign: Campaign) -> int:
    """Cells the sweep names before exclusions and deduplication, from lengths alone (nothing is expanded):
    (product of axis and zip-group lengths + explicit cells, or 1 for no sweep) × repeats."""
    sweep = campaign.sweep
    lengths = [len(values) for values in sweep.axes.values()]
    lengths += [len(next(iter(group.values()), [])) for group in sweep.zip]
    product = math.prod(lengths) if lengths else 0
    return ((product + len(sweep.cells)) or 1) * sweep.repeats


def check_size(campaign: Campaign, max_cells: int | None, file: str | None) -> None:
    """Refuse a sweep of more than `max_cells` (None: DEFAULT_MAX_CELLS) cells before expanding it."""
    max_cells = DEFAULT_MAX_CELLS if max_cells is None else max_cells
    count = cell_count(campaign)
    if count > max_cells:
        sweep = campaign.sweep
        parts = [f"{len(v)} {k}" for k, v in sweep.axes.items()]
        parts += [f"{len(next(iter(g.values()), []))} zip[{i}]" for i, g in enumerate(sweep.zip)]
        shape = " × ".join(parts) or "no axes"
        raise ConfigError(
            f"sweep: {count:,} cells ({shape}, + {len(sweep.cells)} cells, × {sweep.repeats} repeats; before "
            f"exclusions) is more than the limit of {max_cells:,}: shrink the sweep or raise the limit with "
            f"--max-cells {count if count < 10**9 else 'N'}",
            file=file,
        )


def expand_points(
    campaign: Campaign,
    campaign_file: Path | None,
    kind: PointResolver,
    max_cells: int | None = None,
    strict: bool = True,
) -> list[Point]:
    """All cells of a campaign, each point resolved by `kind`. Raises ConfigError listing every invalid point,
    for a sweep of more than `max_cells` cells (checked before expanding) and for one that excludes every point.
    A point with layout problems is invalid with `strict`; without, it is kept with `Point.infeasible` set
    (orchestrator/run/feasibility.py records and skips it)."""
    file = str(campaign_file) if campaign_file else None
    check_size(campaign, max_cells, file)
    problems = kind.key_problems(campaign, key_locations(campaign))
    if problems:
        raise ConfigError(problems, file=file)
    resolve = kind.resolver(campaign, campaign_file)
    keys = swept_keys(campaign)
    short = _short_labels(keys)
    points: list[Point] = []
    seen: set[str] = set()
    found: dict[str, None] = {}  # problems in order, each once
    for assignment in assignments(campaign):
        label = ", ".join(f"{short[k]}={assignment[k]}" for k in keys if k in assignment) or "base"
        try:
            resolved = resolve(assignment, f"point [{label}]: " if assignment else "")
        except PointProblems as err:
            found.update(dict.fromkeys(err.problems))
            continue
        if strict and resolved.infeasible:
            found.update(dict.fromkeys(resolved.infeasible))
            continue
        point_id = point_digest(resolved.identity)
        if point_id in seen:
            continue  # the same point listed twice (e.g. an explicit cell equal to a product point)
        seen.add(point_id)
        points.extend(_repeats(campaign, point_id, assignment, resolved, label, kind.name))
    if found:
        raise ConfigError(list(found), file=file)
    if not points:
        raise ConfigError(
            "sweep.exclude: the rules exclude every point of the sweep, so nothing would run: loosen or remove "
            "a rule",
            file=file,
        )
    return points


def _repeats(
    campaign: Campaign,
    point_id: str,
    assignment: dict[str, Any],
    resolved: ResolvedPoint,
    label: str,
    kind: str,
) -> list[Point]:
    """The cells of one point: one per repeat (they share the resolved recipe: read-only)."""
    return [
        Point(
            cell_id=f"{point_id}-r{repeat}",
            point_id=point_id,
            repeat=repeat,
            params=dict(assignment),
            recipe=resolved.recipe,
            resources=dict(resolved.resources),
            env=dict(resolved.env),
            label=label,
            trainer_kind=kind,
            infeasible=tuple(resolved.infeasible),
        )
        for repeat in range(campaign.sweep.repeats)
    ]
