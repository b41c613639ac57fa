"""The trainer-kind protocol: how a kind expands points, launches an attempt, follows it and finalizes it.

The engine holds no kind-specific branch; for one attempt it calls, in order::

    kind = trainers.get(cell.trainer_kind)
    spec = kind.launch_spec(campaign, cell, attempt)     # what runs: module or argv, env, resources
    kind.write_inputs(cell, spec)                        # recipe.yaml into the run dir
    follower = kind.follower(cell, run_dir)              # None, or update() + progress while it runs
    kind.finalize(campaign, cell, run_dir, follower)     # before collection: the kind's own files
    kind.planned_steps(cell)                             # steps the attempt should make (hang checks)

A new kind is one module of orchestrator/trainers/kinds/, named as the kind: a `TrainerKind` subclass with its
`Section` (the campaign's `trainer:` schema) and its guess at a lost campaign (`claims`, `rebuilt`), decorated
with `orchestrator.trainers.registry.register`. Nothing else lists the kinds.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from launchers.base import LaunchSpec, Resources
from orchestrator.errors import ConfigError
from orchestrator.spec import software
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.parity import ParityAxes
from orchestrator.spec.sweep import Point, PointProblems, ResolvedPoint, expand_points
from orchestrator.spec.trainer_section import TrainerSection
from trainer import rundir

if TYPE_CHECKING:
    from orchestrator.rows import AttemptRow, CellRow
    from trainer.memory import MemoryEstimate


class Progress(Protocol):
    """How far a running attempt is: the last step it logged and the steps it plans (None: not known yet)."""

    last_step: int | None
    planned: int | None


class Follower(Protocol):
    """Something that reads a running attempt's output: `update()` is True when a new step was seen."""

    progress: Progress

    def update(self) -> bool: ...


def software_env(
    resolver: software.SoftwareResolver, assignment: dict[str, Any], where: str
) -> dict[str, str]:
    """The point's software env (orchestrator/spec/software.py); a ref that does not resolve is a PointProblems."""
    try:
        return resolver.env(assignment)
    except ConfigError as err:
        raise PointProblems([f"{where}{p}" for p in err.problems]) from None


def workspace_of(run_dir: Path) -> Path:
    """The workspace of an attempt's run dir (<workspace>/<campaign>/<cell>/<attempt>)."""
    return Path(run_dir).parents[2]


def world_size(cell: CellRow) -> int:
    return int(cell.resources.get("nodes", 1)) * int(cell.resources.get("gpus_per_node", 1))


@dataclass(frozen=True)
class Rebuilt:
    """A kind's guess at the campaign that wrote some run dirs, from their recipe.yaml files (`mbx store rebuild`
    of a campaign whose campaign.json is lost: orchestrator/run/rebuild_rundirs.py)."""

    section: dict[str, Any]  # the campaign's `trainer:` section
    sweeps_recipe: bool  # the recipe keys whose values differ between cells were its sweep axes
    keeps_env: bool  # each recipe.yaml records its point's environment (`env`); else that is lost


class TrainerKind(abc.ABC):
    """One kind of trainer (`trainer.kind` of a campaign; `trainer_kind` of a cell)."""

    name: ClassVar[str]
    Section: ClassVar[type[TrainerSection]]  # the campaign's `trainer:` section of this kind
    module: ClassVar[str | None] = None  # the Python module every rank runs; None: the argv runs as given

    # ---- expansion (sweep.expand_points calls key_problems and resolver) --------------------------------
    def expand(
        self,
        campaign: Campaign,
        campaign_file: Path | None = None,
        max_cells: int | None = None,
        strict: bool = True,
    ) -> list[Point]:
        """All cells of a campaign of this kind. Raises ConfigError listing every invalid point (and for a
        sweep of more than `max_cells` cells, before expanding it); without `strict`, points with layout
        problems are kept, marked `infeasible` (orchestrator/run/feasibility.py skips them)."""
        return expand_points(campaign, campaign_file, self, max_cells, strict)

    def memory_estimate(self, point: Point, on_gpu: bool) -> MemoryEstimate | None:
        """The point's peak memory per GPU before it runs (trainer/memory.py), None when this kind cannot tell;
        `on_gpu`: estimate it as on a GPU whatever the recipe's device. Raises ValueError when the point's
        settings do not give an estimate."""
        return None

    @abc.abstractmethod
    def resolver(
        self, campaign: Campaign, campaign_file: Path | None
    ) -> Callable[[dict[str, Any], str], ResolvedPoint]:
        """A function resolving one point (an assignment of swept keys, its location in messages) of this
        campaign; raises sweep.PointProblems. Work common to the points (a base recipe read, a software ref
        resolved) is done once per resolver."""

    @abc.abstractmethod
    def key_problems(self, campaign: Campaign, locations: list[tuple[str, str]]) -> list[str]:
        """`where: problem` for sweep keys this kind cannot address."""

    # ---- one attempt -------------------------------------------------------------------------------------
    @abc.abstractmethod
    def args(self, cell: CellRow, run_dir: Path, attempt: int) -> list[str]:
        """The module's arguments, or the whole argv when `module` is None."""

    def launch_spec(self, campaign: Campaign, cell: CellRow, attempt: AttemptRow) -> LaunchSpec:
        """What the launcher runs for this attempt of this cell (software paths added to its env; a per-point
        container image refused for the local launcher, which runs no container)."""
        run_dir = Path(attempt.run_dir)
        if attempt.launcher == "local" and software.IMAGE in cell.env:
            raise ConfigError(
                f"container.image: point {cell.label!r} sets image {cell.env[software.IMAGE]!r}, but the local "
                "launcher runs no container; run it with a Slurm launcher (--launcher submitit or nemo-run)"
            )
        on_path = {name.lower() for name, repo in campaign.software.repos.items() if repo.pythonpath}
        return LaunchSpec(
            campaign=campaign.name,
            cell_id=cell.cell_id,
            attempt=attempt.attempt,
            run_dir=run_dir,
            resources=Resources(
                nodes=int(cell.resources["nodes"]),
                gpus_per_node=int(cell.resources["gpus_per_node"]),
                time_limit_min=cell.resources.get("time_limit_min"),
            ),
            module=self.module,
            args=self.args(cell, run_dir, attempt.attempt),
            env=software.launch_env(dict(cell.env), workspace_of(run_dir), on_path),
            env_pass=list(campaign.env.pass_names),
        )

    def recipe_record(self, cell: CellRow, spec: LaunchSpec) -> dict[str, Any]:
        """What recipe.yaml records for this attempt."""
        return cell.recipe

    def write_inputs(self, cell: CellRow, spec: LaunchSpec) -> None:
        """The attempt's inputs in its run dir (recipe.yaml), before it is submitted; the worktrees and pip
        overlays of its software are built first (once per workspace; later attempts reuse them)."""
        software.ensure_built(cell.env, workspace_of(spec.run_dir))
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        rundir.write_recipe(spec.run_dir, self.recipe_record(cell, spec))

    def follower(self, cell: CellRow, run_dir: Path) -> Follower | None:
        """A reader of the attempt's output while it runs; None when the kind reports its own end."""
        return None

    def finalize(self, campaign: Campaign, cell: CellRow, run_dir: Path, follower: Follower | None) -> None:
        """Before collection: write what the kind's process did not (metrics.jsonl, status.json)."""
        return None

    # ---- what freeze and cards carry ---------------------------------------------------------------------
    def resolved_recipe(self, recipe: dict[str, Any]) -> dict[str, Any] | None:
        """The resolved recipe a point of this kind runs from, for freeze's recipe.yaml and a card's `recipe`;
        None when the kind runs a command (its point is its params)."""
        return None

    def frozen_sections(self, recipe: dict[str, Any], resources: dict[str, Any], params: dict[str, Any],
                        repeats: int) -> dict[str, Any]:
        """The campaign sections that run one frozen point `repeats` times (freeze's campaign.yaml): by
        default the point's params as its only sweep cell."""
        return {"sweep": {"cells": [params] if params else [], "repeats": repeats}}

    def steps_key(self, campaign: Campaign) -> str | None:
        """The sweep key that sets a run's length (a search's default `sweep.search.steps_key`); None: none."""
        return None

    @abc.abstractmethod
    def planned_steps(self, cell: CellRow) -> int | None:
        """The training steps an attempt of this cell should make (None: not known before it runs)."""

    # ---- a lost campaign rebuilt from its run dirs (orchestrator/run/rebuild_rundirs.py) -------------------
    def claims(self, recipes: list[dict[str, Any]]) -> bool:
        """Whether this kind wrote these recipe.yaml files (one per cell, `env` left out); what no kind claims is
        the default kind's (orchestrator.rows.DEFAULT_KIND)."""
        return False

    @abc.abstractmethod
    def rebuilt(self, recipes: list[dict[str, Any]]) -> Rebuilt:
        """The campaign these recipe.yaml files of this kind ran from, as far as they tell."""

    # ---- parity (orchestrator/spec/parity.py): the keys of the checks that depend on the kind -------------
    def eval_interval_key(self, campaign: Campaign) -> str:
        """The sweep key of the evaluation interval parity.eval_check sets to null on its train-only side;
        ConfigError when this kind has none."""
        raise ConfigError(f"parity.eval_check: a {self.name} trainer has no evaluation interval to turn off")

    def eval_interval(self, campaign: Campaign, campaign_file: Path | None) -> Any:
        """The base value of `eval_interval_key` (the train-eval-train side); ConfigError when it does not
        evaluate."""
        raise ConfigError(f"parity.eval_check: a {self.name} trainer has no evaluation interval to turn off")

    def checkpoint_keys(self, campaign: Campaign) -> tuple[str, str]:
        """(save-after-step key, reload-with key) of parity.checkpoint; ConfigError when this kind cannot save
        its state and reload it."""
        raise ConfigError(f"parity.checkpoint: a {self.name} trainer cannot be told to save and reload its state "
                          "(the bundled trainer can: trainer.kind: bundled)")

    def parity_axes(self, campaign: Campaign, campaign_file: Path | None = None, with_values: bool = True
                    ) -> ParityAxes:
        """The keys (and, `with_values`, the eval interval's base value) the campaign's parity section needs."""
        parity, file = campaign.parity, str(campaign_file) if campaign_file else None
        axes = ParityAxes()
        if parity is None:
            return axes
        try:
            if parity.eval_check:
                value = self.eval_interval(campaign, campaign_file) if with_values else None
                axes = replace(axes, eval_key=self.eval_interval_key(campaign), eval_value=value)
            if parity.checkpoint is not None:
                save_key, reload_key = self.checkpoint_keys(campaign)
                axes = replace(axes, save_key=save_key, reload_key=reload_key)
        except ConfigError as err:
            if err.file is not None or file is None:
                raise
            raise ConfigError(err.problems, file=file) from None  # `file: parity.…: problem`
        return axes
