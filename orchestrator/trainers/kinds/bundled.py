"""The bundled trainer kind: `python -m trainer --recipe recipe.yaml --out RUN_DIR`, configured by a recipe."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError

from orchestrator.errors import ConfigError
from orchestrator.spec import profile_spec, software
from orchestrator.spec.campaign import Campaign, Resources
from orchestrator.spec.keys import deep_merge, set_path, split_namespace, unknown_key_problem
from orchestrator.spec.loader import validation_problems
from orchestrator.spec.sweep import Point, PointProblems, ResolvedPoint, canonical_json
from orchestrator.spec.trainer_section import TrainerSection
from orchestrator.spec.yamlio import load_yaml_file
from orchestrator.trainers.base import Rebuilt, TrainerKind, software_env
from orchestrator.trainers.registry import register
from trainer import rundir
from trainer.recipe import Recipe, launch_problems, layout_problems

EVAL_KEY = "training.eval_interval"  # what parity.eval_check sets to null on its train-only side

# A validated point: recipe, resources, their identities, layout problems (infeasible when not empty).
Validated = tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any], tuple[str, ...]]

if TYPE_CHECKING:
    from launchers.base import LaunchSpec
    from orchestrator.rows import AttemptRow, CellRow
    from trainer.memory import MemoryEstimate


class BundledTrainer(TrainerSection):
    """The bundled MoE GPT trainer (`python -m trainer`), configured by a recipe."""

    kind: Literal["bundled"] = Field("bundled", description="Use the bundled trainer.")
    recipe: dict[str, Any] = Field(
        default_factory=dict,
        description="Base recipe (trainer/recipe.py schema); sweep keys override its fields.",
    )
    recipe_file: str | None = Field(
        None,
        description="A recipe YAML file (relative to the campaign file) used as the base; `recipe` overrides it.",
    )


def base_recipe(campaign: Campaign, campaign_file: Path | None) -> dict[str, Any]:
    """The campaign's base recipe mapping (recipe_file, then `recipe` merged over it)."""
    section = campaign.trainer
    if not isinstance(section, BundledTrainer):
        raise TypeError(f"campaign {campaign.name!r} does not run the bundled trainer")
    base: dict[str, Any] = {}
    if section.recipe_file:
        root = campaign_file.parent if campaign_file else Path.cwd()
        loaded = load_yaml_file(root / section.recipe_file)
        if not isinstance(loaded, dict):
            raise ConfigError("trainer.recipe_file: must hold a mapping", file=str(campaign_file))
        base = loaded
    return deep_merge(base, section.recipe)


@register
class BundledKind(TrainerKind):
    """The bundled MoE GPT trainer: it writes metrics.jsonl and status.json itself, so nothing is followed."""

    name = "bundled"
    Section = BundledTrainer
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

    def resolver(
        self, campaign: Campaign, campaign_file: Path | None
    ) -> Callable[[dict[str, Any], str], ResolvedPoint]:
        """Resolve points over one base recipe (read once); each distinct recipe and resources is validated once."""
        base = {
            "recipe": base_recipe(campaign, campaign_file),
            "resources": campaign.resources.model_dump(),
            "env": dict(campaign.env.values),
        }
        valid: dict[str, Validated] = {}
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
            recipe, resources, recipe_id, resources_id, infeasible = valid[key]
            steps = (recipe.get("training") or {}).get("steps")
            if problem := profile_spec.window_problem(campaign.profile, steps, campaign.collect.window):
                raise PointProblems([f"{where}{problem}"])  # profiled steps would spoil the measured window
            identity = {"trainer": "bundled", "recipe": recipe_id, "resources": resources_id,
                        "env": software.identity_env(docs["env"])}  # fmt: skip
            return ResolvedPoint(recipe, resources, docs["env"], identity, infeasible)

        return resolve

    def args(self, cell: CellRow, run_dir: Path, attempt: int) -> list[str]:
        return ["--recipe", str(run_dir / rundir.RECIPE), "--out", str(run_dir)]

    def launch_spec(self, campaign: Campaign, cell: CellRow, attempt: AttemptRow) -> LaunchSpec:
        """The base spec, plus the campaign's `profile:` switch (orchestrator/spec/profile_spec.py; not identity)."""
        spec = super().launch_spec(campaign, cell, attempt)
        spec.env.update(profile_spec.trainer_env(campaign.profile))
        return spec

    def resolved_recipe(self, recipe: dict[str, Any]) -> dict[str, Any] | None:
        return recipe

    def frozen_sections(self, recipe: dict[str, Any], resources: dict[str, Any], params: dict[str, Any],
                        repeats: int) -> dict[str, Any]:
        """The resolved recipe itself (no sweep left to resolve), its resources, `repeats` repeats."""
        return {"trainer": {"kind": "bundled", "recipe": recipe}, "resources": resources,
                "sweep": {"repeats": repeats}}  # fmt: skip

    def steps_key(self, campaign: Campaign) -> str | None:
        return "training.steps"

    def planned_steps(self, cell: CellRow) -> int | None:
        steps = (cell.recipe.get("training") or {}).get("steps")
        return int(steps) if isinstance(steps, int) else None

    def eval_interval_key(self, campaign: Campaign) -> str:
        return EVAL_KEY

    def eval_interval(self, campaign: Campaign, campaign_file: Path | None) -> Any:
        """The base recipe's training.eval_interval."""
        training = base_recipe(campaign, campaign_file).get("training")
        if training is not None and not isinstance(training, dict):
            raise ConfigError(f"trainer.recipe.training: must be a mapping of training settings, not "
                              f"{type(training).__name__} (parity.eval_check reads training.eval_interval)")
        value = (training or {}).get("eval_interval")
        if value is None:
            raise ConfigError("parity.eval_check: the recipe does not evaluate (training.eval_interval is not set): "
                              "set it, or drop eval_check")
        return value

    def checkpoint_keys(self, campaign: Campaign) -> tuple[str, str]:
        """checkpoint.save_at and checkpoint.reload_with (trainer/checkpoint.py: one run saves, then reloads)."""
        return "checkpoint.save_at", "checkpoint.reload_with"

    def rebuilt(self, recipes: list[dict[str, Any]]) -> Rebuilt:
        """The first cell's whole recipe as the base, the keys whose values differ between cells swept; the
        recipe.yaml of a bundled cell keeps no environment."""
        return Rebuilt({"kind": self.name, "recipe": recipes[0]}, sweeps_recipe=True, keeps_env=False)

    def memory_estimate(self, point: Point, on_gpu: bool) -> MemoryEstimate | None:
        """trainer/memory.py's model of what the bundled trainer allocates (ValueError for a refused layout);
        points that differ only in fields the model never reads (seed, steps, learning rates) share one."""
        reduced = {**point.recipe}
        for section, names in NOT_MEMORY.items():
            reduced[section] = {k: v for k, v in (reduced.get(section) or {}).items() if k not in names}
        # the recipe is a model_dump (fields in schema order): its repr is a key, much cheaper than sorted JSON
        return _estimate(repr(reduced), reduced, point.world_size, True if on_gpu else None)


# Recipe fields trainer/memory.py never reads: points that differ only in them share one estimate.
NOT_MEMORY = {
    "training": ("seed", "steps", "eval_interval", "log_interval"),
    "optimizer": ("lr", "min_lr", "warmup_steps", "weight_decay", "beta1", "beta2", "eps", "clip_grad"),
}


_ESTIMATES: dict[tuple[str, int, bool | None], MemoryEstimate] = {}


def _estimate(key: str, recipe: dict[str, Any], world_size: int, gpu: bool | None) -> MemoryEstimate:
    """The estimate of a recipe, computed once per distinct (recipe key, world, device) in a process."""
    from trainer.memory import estimate  # (estimates are made by plan and run, not validate)

    cached = _ESTIMATES.get((key, world_size, gpu))
    if cached is None:
        if len(_ESTIMATES) >= 4096:
            _ESTIMATES.clear()
        cached = _ESTIMATES[(key, world_size, gpu)] = estimate(
            Recipe.model_validate(recipe), world_size, gpu=gpu
        )
    return cached


def _apply(base: dict[str, dict[str, Any]], assignment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The base recipe, resources and env with one point's swept keys set (set_path copies what it changes)."""
    docs = {"recipe": dict(base["recipe"]), "resources": dict(base["resources"]), "env": dict(base["env"])}
    for key, value in assignment.items():
        namespace, rest = split_namespace(key)
        if namespace == "env":
            docs["env"][rest] = str(value)
        elif namespace in ("software", "container"):
            continue  # resolved by orchestrator/spec/software.py
        else:
            set_path(docs[namespace], rest, value)
    return docs


def _validate(docs: dict[str, dict[str, Any]], where: str) -> Validated:
    """(recipe, resources, their identities, layout problems) of a point; PointProblems naming `where` for
    anything but its parallel layout. A point whose only problems are its layout (the checks of
    trainer.recipe.layout_problems, or a recipe that validates once its `parallel` section is reset) is
    returned with those problems: infeasible, not invalid (orchestrator/run/feasibility.py)."""
    recipe: Recipe | None = None
    try:
        recipe = Recipe.model_validate(docs["recipe"])
    except ValidationError as err:
        layout = validation_problems(err, Recipe, f"{where}trainer.recipe.")
        if not _layout_only(docs["recipe"]):
            raise PointProblems(layout) from None
    try:
        resources = Resources.model_validate(docs["resources"])
    except ValidationError as err:
        raise PointProblems(validation_problems(err, Resources, f"{where}resources.")) from None
    res, res_id = resources.model_dump(mode="json"), resources.model_dump(mode="json", exclude_defaults=True)
    if recipe is None:  # only its layout is wrong: kept as given, never run
        return docs["recipe"], res, docs["recipe"], res_id, tuple(layout)
    world = resources.nodes * resources.gpus_per_node
    problems = launch_problems(recipe, world)
    in_layout = set(layout_problems(recipe, world))
    invalid = [f"{where}{p}" for p in problems if p not in in_layout]
    if invalid:
        raise PointProblems(invalid)
    return (recipe.model_dump(mode="json"), res, recipe.model_dump(mode="json", exclude_defaults=True), res_id,
            tuple(f"{where}{p}" for p in problems if p in in_layout))  # fmt: skip


def _layout_only(recipe: dict[str, Any]) -> bool:
    """Whether a recipe that fails validation is valid with its `parallel` section at the defaults (so its
    problem is how it is split over ranks, e.g. experts not divisible by EP)."""
    if "parallel" not in recipe:
        return False
    try:
        Recipe.model_validate({k: v for k, v in recipe.items() if k != "parallel"})
    except ValidationError:
        return False
    return True
