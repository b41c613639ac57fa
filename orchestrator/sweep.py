"""Sweep expansion: a pure function from a campaign to its points, each with a stable cell id."""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.campaign import Campaign, CommandTrainer, Resources
from orchestrator.errors import ConfigError
from orchestrator.keys import set_path, split_namespace, unknown_key_problem
from trainer.recipe import Recipe, launch_problems


@dataclass(frozen=True)
class Point:
    """One cell: a resolved recipe and resources, repeated `repeat` times."""

    cell_id: str
    point_id: str
    repeat: int
    params: dict[str, Any]
    recipe: dict[str, Any]  # resolved recipe, all fields (what is written to recipe.yaml)
    resources: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    label: str = ""

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


def _key_locations(campaign: Campaign) -> list[tuple[str, str]]:
    locations = [(f"sweep.axes.{k}", k) for k in campaign.sweep.axes]
    locations += [(f"sweep.zip[{i}].{k}", k) for i, g in enumerate(campaign.sweep.zip) for k in g]
    locations += [(f"sweep.cells[{i}].{k}", k) for i, c in enumerate(campaign.sweep.cells) for k in c]
    locations += [(f"sweep.exclude[{i}].{k}", k) for i, r in enumerate(campaign.sweep.exclude) for k in r]
    return locations


def _key_problems(campaign: Campaign) -> list[str]:
    if isinstance(campaign.trainer, CommandTrainer):
        from orchestrator.command import key_problems

        return key_problems(campaign, _key_locations(campaign))
    problems = []
    for where, key in _key_locations(campaign):
        namespace, rest = split_namespace(key)
        if namespace == "recipe":
            problem = unknown_key_problem(rest)
        elif namespace == "resources":
            problem = unknown_key_problem(rest, Resources, "resources")
        else:
            problem = None if "." not in rest else f"env keys are single names, got {rest!r}"
        if problem:
            problems.append(f"{where}: {problem}")
    return problems


def _pydantic_problems(err: ValidationError, prefix: str) -> list[str]:
    lines = []
    for item in err.errors():
        loc = ".".join(str(p) for p in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        elif item["type"] in ("literal_error", "enum"):
            expected = item.get("ctx", {}).get("expected")
            message = f"must be one of {expected} (got {item.get('input')!r})"
        lines.append(f"{prefix}{loc}: {message}" if loc else f"{prefix.rstrip('.')}: {message}")
    return lines


def expand(campaign: Campaign, campaign_file: Path | None = None) -> list[Point]:
    """All cells of a campaign. Raises ConfigError listing every invalid point."""
    file = str(campaign_file) if campaign_file else None
    problems = _key_problems(campaign)
    if problems:
        raise ConfigError(problems, file=file)
    if isinstance(campaign.trainer, CommandTrainer):
        return _expand_command(campaign, campaign_file)
    base_recipe = campaign.base_recipe(campaign_file)
    keys = swept_keys(campaign)
    short = _short_labels(keys)
    points: list[Point] = []
    seen: set[str] = set()
    for assignment in assignments(campaign):
        label = ", ".join(f"{short[k]}={assignment[k]}" for k in keys if k in assignment) or "base"
        docs: dict[str, dict[str, Any]] = {
            "recipe": copy.deepcopy(base_recipe),
            "resources": campaign.resources.model_dump(),
            "env": dict(campaign.env.values),
        }
        for key, value in assignment.items():
            namespace, rest = split_namespace(key)
            if namespace == "env":
                docs["env"][rest] = str(value)
            else:
                set_path(docs[namespace], rest, value)
        where = f"point [{label}]: " if assignment else ""
        try:
            recipe = Recipe.model_validate(docs["recipe"])
        except ValidationError as err:
            problems.extend(_pydantic_problems(err, f"{where}trainer.recipe."))
            continue
        try:
            resources = Resources.model_validate(docs["resources"])
        except ValidationError as err:
            problems.extend(_pydantic_problems(err, f"{where}resources."))
            continue
        world = resources.nodes * resources.gpus_per_node
        problems.extend(f"{where}{p}" for p in launch_problems(recipe, world))
        identity = {
            "trainer": "bundled",
            "recipe": recipe.model_dump(mode="json", exclude_defaults=True),
            "resources": resources.model_dump(mode="json", exclude_defaults=True),
            "env": docs["env"],
        }
        point_id = point_digest(identity)
        if point_id in seen:
            continue  # the same point listed twice (e.g. an explicit cell equal to a product point)
        seen.add(point_id)
        for repeat in range(campaign.sweep.repeats):
            points.append(
                Point(
                    cell_id=f"{point_id}-r{repeat}",
                    point_id=point_id,
                    repeat=repeat,
                    params=dict(assignment),
                    recipe=recipe.model_dump(mode="json"),
                    resources=resources.model_dump(mode="json"),
                    env=docs["env"],
                    label=label,
                )
            )
    if problems:
        raise ConfigError(problems, file=file)
    return points


def _expand_command(campaign: Campaign, campaign_file: Path | None) -> list[Point]:
    """Points of a command campaign: cell ids hash the resolved argv, env and resources."""
    from orchestrator.command import TemplateError, expansion_problems, resolve_point

    file = str(campaign_file) if campaign_file else None
    keys = swept_keys(campaign)
    short = _short_labels(keys)
    problems: list[str] = []
    points: list[Point] = []
    seen: set[str] = set()
    for assignment in assignments(campaign):
        label = ", ".join(f"{short[k]}={assignment[k]}" for k in keys if k in assignment) or "base"
        where = f"point [{label}]: " if assignment else ""
        try:
            resolved = resolve_point(campaign, assignment, campaign_file)
        except (TemplateError, ValidationError) as err:
            for problem in expansion_problems(err, where):
                if problem not in problems:
                    problems.append(problem)
            continue
        point_id = point_digest(resolved.identity)
        if point_id in seen:
            continue
        seen.add(point_id)
        for repeat in range(campaign.sweep.repeats):
            points.append(
                Point(
                    cell_id=f"{point_id}-r{repeat}",
                    point_id=point_id,
                    repeat=repeat,
                    params=dict(assignment),
                    recipe=resolved.recipe,
                    resources=resolved.resources,
                    env=resolved.env,
                    label=label,
                )
            )
    if problems:
        raise ConfigError(problems, file=file)
    return points
