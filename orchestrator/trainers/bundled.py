"""The bundled trainer kind: `python -m trainer --recipe recipe.yaml --out RUN_DIR`, configured by a recipe."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from orchestrator.campaign import Campaign, Resources
from orchestrator.keys import set_path, split_namespace, unknown_key_problem
from orchestrator.loader import validation_problems
from orchestrator.sweep import PointProblems, ResolvedPoint
from orchestrator.trainers.base import TrainerKind
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
            else:
                problem = None if "." not in rest else f"env keys are single names, got {rest!r}"
            if problem:
                problems.append(f"{where}: {problem}")
        return problems

    def resolve(
        self, campaign: Campaign, assignment: dict[str, Any], campaign_file: Path | None, where: str
    ) -> ResolvedPoint:
        docs: dict[str, dict[str, Any]] = {
            "recipe": copy.deepcopy(campaign.base_recipe(campaign_file)),
            "resources": campaign.resources.model_dump(),
            "env": dict(campaign.env.values),
        }
        for key, value in assignment.items():
            namespace, rest = split_namespace(key)
            if namespace == "env":
                docs["env"][rest] = str(value)
            else:
                set_path(docs[namespace], rest, value)
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
        identity = {
            "trainer": "bundled",
            "recipe": recipe.model_dump(mode="json", exclude_defaults=True),
            "resources": resources.model_dump(mode="json", exclude_defaults=True),
            "env": docs["env"],
        }
        return ResolvedPoint(
            recipe.model_dump(mode="json"), resources.model_dump(mode="json"), docs["env"], identity
        )

    def args(self, cell: CellRow, run_dir: Path, attempt: int) -> list[str]:
        return ["--recipe", str(run_dir / rundir.RECIPE), "--out", str(run_dir)]

    def planned_steps(self, cell: CellRow) -> int | None:
        steps = (cell.recipe.get("training") or {}).get("steps")
        return int(steps) if isinstance(steps, int) else None
