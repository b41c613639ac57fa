"""The bundled trainer kind: `python -m trainer --recipe recipe.yaml --out RUN_DIR`, configured by a recipe."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from orchestrator import software
from orchestrator.campaign import Campaign, Resources
from orchestrator.keys import set_path, split_namespace, unknown_key_problem
from orchestrator.loader import validation_problems
from orchestrator.sweep import PointProblems, ResolvedPoint, canonical_json
from orchestrator.trainers.base import TrainerKind, software_env
from trainer import rundir
from trainer.recipe import Recipe, launch_problems

if TYPE_CHECKING:
    from orchestrator.store import CellRow


class BundledKind(TrainerKind):
    """The bundled MoE GPT trainer: it writes metrics.jsonl and status.json itself, so nothing is followed."""

    name = "bundled"
    module = "trainer"

    def key_problems(self, campaign: Campaign, locations: list[tuple[str, str]]) -> list[str]:
        problems = []
        for where, key in locations:
            namespace, rest = split_namespace(key)
            if namespace == "recipe":
                problem = unknown_key_problem(rest)
            elif namespace == "resources":
                problem = unknown_key_problem(rest, Resources, "resources")
            elif namespace in ("software", "container"):
                problem = software.key_problem(campaign.software, key)
            else:
                problem = None if "." not in rest else f"env keys are single names, got {rest!r}"
            if problem:
                problems.append(f"{where}: {problem}")
        return problems

    def resolve(
        self, campaign: Campaign, assignment: dict[str, Any], campaign_file: Path | None, where: str
    ) -> ResolvedPoint:
        return self.resolver(campaign, campaign_file)(assignment, where)

    def resolver(
        self, campaign: Campaign, campaign_file: Path | None
    ) -> Callable[[dict[str, Any], str], ResolvedPoint]:
        """Resolve points over one base recipe (read once); each distinct recipe and resources is validated once."""
        base = {
            "recipe": campaign.base_recipe(campaign_file),
            "resources": campaign.resources.model_dump(),
            "env": dict(campaign.env.values),
        }
        valid: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]] = {}
        versions = software.SoftwareResolver(campaign.software, campaign_file)
        own = ("recipe", "resources")  # the resolved recipe and resources depend only on these swept keys

        def resolve(assignment: dict[str, Any], where: str) -> ResolvedPoint:
            docs = _apply(base, assignment)
            docs["env"].update(software_env(versions, assignment, where))
            try:
                key = canonical_json([[k, v] for k, v in assignment.items() if split_namespace(k)[0] in own])
            except (TypeError, ValueError):  # mapping keys of mixed types: validation says what is wrong
                key = ""
            if not key or key not in valid:
                valid[key] = _validate(docs, where)
            recipe, resources, recipe_id, resources_id = valid[key]
            identity = {"trainer": "bundled", "recipe": recipe_id, "resources": resources_id,
                        "env": software.identity_env(docs["env"])}  # fmt: skip
            return ResolvedPoint(recipe, resources, docs["env"], identity)

        return resolve

    def args(self, cell: CellRow, run_dir: Path, attempt: int) -> list[str]:
        return ["--recipe", str(run_dir / rundir.RECIPE), "--out", str(run_dir)]

    def planned_steps(self, cell: CellRow) -> int | None:
        steps = (cell.recipe.get("training") or {}).get("steps")
        return int(steps) if isinstance(steps, int) else None


def _apply(base: dict[str, dict[str, Any]], assignment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The base recipe, resources and env with one point's swept keys set (set_path copies what it changes)."""
    docs = {"recipe": dict(base["recipe"]), "resources": dict(base["resources"]), "env": dict(base["env"])}
    for key, value in assignment.items():
        namespace, rest = split_namespace(key)
        if namespace == "env":
            docs["env"][rest] = str(value)
        elif namespace in ("software", "container"):
            continue  # resolved by orchestrator/software.py
        else:
            set_path(docs[namespace], rest, value)
    return docs


def _validate(
    docs: dict[str, dict[str, Any]], where: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(recipe, resources, and their identities) of a valid point; PointProblems naming `where` otherwise."""
    try:
        recipe = Recipe.model_validate(docs["recipe"])
    except ValidationError as err:
        raise PointProblems(validation_problems(err, Recipe, f"{where}trainer.recipe.")) from None
    try:
        resources = Resources.model_validate(docs["resources"])
    except ValidationError as err:
        raise PointProblems(validation_problems(err, Resources, f"{where}resources.")) from None
    problems = launch_problems(recipe, resources.nodes * resources.gpus_per_node)
    if problems:
        raise PointProblems([f"{where}{p}" for p in problems])
    return (
        recipe.model_dump(mode="json"),
        resources.model_dump(mode="json"),
        recipe.model_dump(mode="json", exclude_defaults=True),
        resources.model_dump(mode="json", exclude_defaults=True),
    )
