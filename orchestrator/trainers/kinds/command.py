"""The command trainer kind: an external trainer (Megatron-LM, Megatron-Bridge, ...) run from an argv template.

Its process writes only logs: while it runs its rank logs are followed (reports/parsers/follow.py), and when
it ends `finalize_command_attempt` turns them into metrics.jsonl and status.json (writer COLLECTOR).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from launchers.base import LaunchSpec
from orchestrator.errors import ConfigError
from orchestrator.spec import profile_spec, software
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.command import attempt_argv, flatten, key_problems, resolve_point
from orchestrator.spec.megatron_layout import estimate_args, layout_problems, megatron_args
from orchestrator.spec.sweep import Point, PointProblems, ResolvedPoint
from orchestrator.spec.trainer_section import TrainerSection
from orchestrator.trainers.base import Follower, Rebuilt, TrainerKind, software_env, workspace_of, world_size
from orchestrator.trainers.registry import register
from trainer import rundir

if TYPE_CHECKING:
    from orchestrator.rows import AttemptRow, CellRow
    from reports.parsers.follow import LogFollower
    from trainer.memory import MemoryEstimate

STOPPED = ("timeout", "cancelled", "preempted")
_CLASS_OF_STOP = {"timeout": "timeout", "preempted": "preempted"}


class CommandTrainer(TrainerSection):
    """An external trainer (Megatron-LM, Megatron-Bridge, ...) started from an argv template; its logs are parsed."""

    kind: Literal["command"] = Field(..., description="Run a command at every point.")
    command: list[str] = Field(
        ...,
        min_length=1,
        description=(
            "argv template, never run by a shell, e.g. [python, ./pretrain_gpt.py]: an element that starts with "
            "./ or ../ is a path relative to the campaign file's folder (the trainer runs in its run directory). "
            "`{name}` placeholders take "
            "params (`{params.name}`), resources ({nodes}, {gpus_per_node}, {world_size}), `{env.NAME}`, "
            "{campaign}, {campaign_dir}, and per attempt {run_dir}, {log_dir}, {cell_id}, {attempt}; a whole "
            "element `{params}` marks where the rendered params go (default: the end); `{{`/`}}` are literal braces."
        ),
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Base values rendered into the argv in `style` (sweep keys params.<name> or bare names override them); "
            "a param used by a placeholder is not rendered again."
        ),
    )
    style: Literal["megatron-lm", "megatron-bridge"] = Field(
        "megatron-lm",
        description=(
            "megatron-lm: `--flag-name value` (underscores → dashes, true → bare flag, false/null → omitted, "
            "lists → repeated values); megatron-bridge: Hydra-style `key.path=value` overrides."
        ),
    )
    log_format: Literal["megatron-lm", "megatron-bridge", "auto"] = Field(
        "auto", description="Dialect of the rank logs in <run dir>/logs/ (auto reads both)."
    )
    seq_length: int | None = Field(
        None, ge=1, description="Sequence length for tokens/s when the log has no argument dump."
    )
    num_gpus: int | None = Field(
        None,
        ge=1,
        description="GPUs for tokens/s/GPU; default the log's world_size, else nodes × gpus_per_node.",
    )
    steps: int | None = Field(
        None,
        ge=1,
        description=(
            "Planned iterations (for failure classes and hang detection); default params train_iters "
            "(train.train_iters for Bridge), else the log's `iteration N/M`."
        ),
    )
    resolved_config: str | None = Field(
        None,
        description=(
            "style megatron-bridge: a ConfigContainer YAML of the base point as Bridge resolved it (the file its "
            "logger.save_config_filepath writes, or `--dryrun` of trainer.bridge_entry or run_recipe.py), relative to "
            "the campaign file. Each point's overrides are applied to it to estimate memory before submission "
            "(points that cannot fit are skipped with the reason); without it only Megatron-LM flags in the argv give "
            "the model's shape."
        ),
    )
    eval_interval_param: str | None = Field(
        None,
        description=(
            "The param that holds the evaluation interval (a key of params, dotted for nested Bridge params), e.g. "
            "eval_interval for Megatron-LM's --eval-interval: parity.eval_check sweeps params.<it> over [its "
            "value, null], null leaving the flag out of the argv (Megatron-LM then evaluates only every 1000 "
            "iterations, its default: keep train_iters below that)."
        ),
    )

    @field_validator("resolved_config")
    @classmethod
    def _bridge_only(cls, path: str | None, info: ValidationInfo) -> str | None:
        if path is not None and info.data.get("style") != "megatron-bridge":
            raise ValueError("a resolved Bridge config applies to style megatron-bridge only")
        return path

    @field_validator("eval_interval_param")
    @classmethod
    def _eval_param_declared(cls, name: str | None, info: ValidationInfo) -> str | None:
        params = info.data.get("params") or {}
        if name is not None and not _has_path(params, name):
            raise ValueError(f"{name!r} is not a param (declared: {', '.join(sorted(params)) or 'none'}); name "
                             "a key of trainer.params")
        return name


def _has_path(tree: dict[str, Any], dotted: str) -> bool:
    """Whether nested mappings hold a value at `a.b.c`."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


@register
class CommandKind(TrainerKind):
    """An argv run as given on every rank (no shell); its logs are parsed for metrics and the final state."""

    name = "command"
    Section = CommandTrainer
    module = None

    def key_problems(self, campaign: Campaign, locations: list[tuple[str, str]]) -> list[str]:
        return key_problems(campaign, locations)

    def resolver(
        self, campaign: Campaign, campaign_file: Path | None
    ) -> Callable[[dict[str, Any], str], ResolvedPoint]:
        """Resolve points with each distinct software ref resolved once; Megatron's layout rules checked on
        the point's argv (orchestrator/spec/megatron_layout.py: problems make it infeasible, not invalid)."""
        versions = software.SoftwareResolver(campaign.software, campaign_file)

        def resolve(assignment: dict[str, Any], where: str) -> ResolvedPoint:
            env = software_env(versions, assignment, where)
            point = resolve_point(campaign, assignment, campaign_file, where, env, kind=self.name)
            if refused := profile_problems(campaign, point.recipe, self.steps_key(campaign)):
                raise PointProblems([f"{where}{p}" for p in refused])  # `profile:` could not do what it says
            args, spelled = megatron_args(point.recipe["argv"])
            world = int(point.resources["nodes"]) * int(point.resources["gpus_per_node"])
            problems = tuple(f"{where}{p}" for p in layout_problems(args, spelled, world))
            return replace(point, infeasible=problems) if problems else point

        return resolve

    def memory_estimate(self, point: Point, on_gpu: bool) -> MemoryEstimate | None:
        """trainer.memory.estimate_megatron of the point's Megatron flags, or of its resolved Bridge config
        (trainer.resolved_config with the point's overrides applied); None when neither gives the model's shape
        (hidden size, layers, heads, sequence length, vocabulary)."""
        from orchestrator.spec import bridge_config  # (estimates are made by plan and run, not validate)
        from trainer.memory import estimate_megatron

        if point.recipe.get("bridge_config"):
            config = bridge_config.with_overrides(_bridge_base(point.recipe["bridge_config"]), point.recipe["argv"])
            flags = bridge_config.megatron_flags(config, point.world_size)
        else:
            flags = megatron_args(point.recipe["argv"])[0]
        args = estimate_args(flags, point.world_size)
        return estimate_megatron(args) if args is not None else None

    def args(self, cell: CellRow, run_dir: Path, attempt: int) -> list[str]:
        paths = software.placeholder_paths(cell.env, workspace_of(run_dir))
        return attempt_argv(cell.recipe["argv"], run_dir, cell.cell_id, attempt, paths)

    def launch_spec(self, campaign: Campaign, cell: CellRow, attempt: AttemptRow) -> LaunchSpec:
        """The base spec; under `profile:` a Megatron-style argv runs inside `nsys profile` where nsys is found,
        a Bridge argv gains its profiling overrides (orchestrator/spec/profile_spec.py; not identity)."""
        spec = super().launch_spec(campaign, cell, attempt)
        style = cell.recipe.get("style") or "megatron-lm"
        spec.args = profile_spec.command_argv(campaign.profile, spec.args, spec.run_dir, style=style)
        return spec

    def recipe_record(self, cell: CellRow, spec: LaunchSpec) -> dict[str, Any]:
        return {**cell.recipe, "argv": spec.args, "env": dict(cell.env)}

    def follower(self, cell: CellRow, run_dir: Path) -> LogFollower:
        return log_follower(Path(run_dir), cell.recipe)

    def finalize(self, campaign: Campaign, cell: CellRow, run_dir: Path, follower: Follower | None) -> None:
        """Logs → metrics.jsonl and status.json; a collection problem is recorded, never raised."""
        from reports.parsers.follow import LogFollower  # (the Megatron log parsers load only to follow logs)

        run_dir = Path(run_dir)
        followed = follower if isinstance(follower, LogFollower) else None  # else the logs are read afresh
        try:
            finalize_command_attempt(run_dir, cell.recipe, world_size(cell), campaign.retry.on, followed)
        except Exception as err:  # noqa: BLE001 - recorded in the run dir instead
            run_dir.mkdir(parents=True, exist_ok=True)
            record = {
                "state": "failed",
                "reason": f"mbx could not collect the logs: {err!r}",
                "failure_class": "unknown",
            }
            rundir.write_status(run_dir, record, rundir.COLLECTOR)

    def steps_key(self, campaign: Campaign) -> str | None:
        """train_iters of the params (Bridge: train.train_iters); trainer.steps, when set, overrides it."""
        bridge = getattr(campaign.trainer, "style", None) == "megatron-bridge"
        return "params.train.train_iters" if bridge else "params.train_iters"

    def planned_steps(self, cell: CellRow) -> int | None:
        return cell.recipe.get("steps")

    def eval_interval_key(self, campaign: Campaign) -> str:
        """params.<trainer.eval_interval_param>: a null value leaves the flag out of the argv."""
        name = getattr(campaign.trainer, "eval_interval_param", None)
        if name is None:
            raise ConfigError("parity.eval_check: name the command's evaluation-interval param in "
                              "trainer.eval_interval_param (e.g. eval_interval for Megatron-LM's --eval-interval)")
        return f"params.{name}"

    def eval_interval(self, campaign: Campaign, campaign_file: Path | None) -> Any:
        """The base value of that param (trainer.params; dotted names reach nested Bridge params)."""
        key = self.eval_interval_key(campaign)
        value = flatten(campaign.trainer.params).get(key.removeprefix("params."))
        if value is None:
            raise ConfigError(f"parity.eval_check: the command does not evaluate (trainer.{key} is not set): set "
                              "it, or drop eval_check")
        return value

    def claims(self, recipes: list[dict[str, Any]]) -> bool:
        """A command's recipe.yaml holds its rendered argv."""
        return any("argv" in recipe for recipe in recipes)

    def rebuilt(self, recipes: list[dict[str, Any]]) -> Rebuilt:
        """The first cell's rendered argv as the command (its params are rendered into it, so nothing is swept);
        each recipe.yaml keeps its point's environment."""
        section = {"kind": self.name, "command": list(recipes[0]["argv"])}
        return Rebuilt(section, sweeps_recipe=False, keeps_env=True)


def profile_problems(campaign: Campaign, recipe: dict[str, Any], steps_key: str) -> list[str]:
    """Why the campaign's `profile:` cannot profile this point as asked: the argv already sets a key it sets
    (named by where it comes from), or the profiled steps reach the collect window."""
    style, profile = recipe.get("style") or "megatron-lm", campaign.profile
    if profile is None:
        return []
    flat = flatten(recipe.get("params") or {})
    problems = []
    for key, item in profile_spec.owned_in_argv(profile, style, recipe["argv"]):
        param = key if style == profile_spec.BRIDGE_STYLE else key.lstrip("-").replace("-", "_")
        where = f"trainer.params.{param}" if param in flat else "trainer.command"
        problems.append(f"{where}: {item!r} sets {key}, which the campaign's `profile:` sets itself for "
                        f"{style} (tool {profile.tool}): remove it, or drop `profile:`")  # fmt: skip
    window = profile_spec.command_window_problem(
        profile, style, recipe.get("steps"), campaign.collect.window, f"trainer.{steps_key}"
    )
    return [*problems, *([window] if window else [])]


@functools.lru_cache(maxsize=8)
def _bridge_base(path: str) -> dict[str, Any]:
    """A campaign's resolved Bridge config, read once per plan (points copy it before applying overrides)."""
    from orchestrator.spec import bridge_config

    return bridge_config.read(Path(path))


def log_follower(run_dir: Path, recipe: dict[str, Any]) -> LogFollower:
    """The follower of a command attempt's rank logs (<run dir>/logs/)."""
    from reports.parsers.follow import LogFollower

    return LogFollower(
        run_dir / rundir.LOGS,
        recipe.get("log_format") or "auto",
        seq_length=recipe.get("seq_length"),
        num_gpus=recipe.get("num_gpus"),
    )


@dataclass(frozen=True)
class _Facts:
    """What is known about an ended command attempt besides its logs."""

    launcher_status: dict[str, Any] | None  # status.json as the launcher side left it (not our own)
    exit_info: dict[str, Any] | None  # exit.json of the attempt wrapper
    hung: dict[str, Any] | None  # hung.json: the engine cancelled it after every planned step was logged
    planned: int | None
    last: int | None  # the last training iteration the logs show

    @property
    def exit_code(self) -> int | None:
        if self.exit_info is not None:
            return self.exit_info.get("exit_code")
        return (self.launcher_status or {}).get("exit_code")

    @property
    def launcher_failure(self) -> bool:
        """Someone other than the attempt wrapper recorded a failure that rank 0's exit code may not show
        (e.g. Slurm FAILED: another rank crashed); the wrapper's own fallback status is not news."""
        status = self.launcher_status
        return (
            status is not None
            and status.get("state") == "failed"
            and status.get("written_by") != rundir.WRAPPER
        )


def finalize_command_attempt(
    run_dir: Path,
    recipe: dict[str, Any],
    world_size: int | None,
    retry_on: list[str] | tuple[str, ...] = ("infra", "preempted"),
    follower: LogFollower | None = None,
) -> dict[str, Any]:
    """Parse an ended command attempt's logs into metrics.jsonl and derive its status.json (writer COLLECTOR).

    completed: the process exited 0 and iterations were logged; completed with class hung_after_finish:
    every planned step was logged but the engine had to cancel the process; timeout/cancelled/preempted:
    as `rundir.resolve_state` reads the launcher's status and exit.json; else failed with the class of
    reports.failures.classify_failure over every log in logs/. Collecting again gives the same status.
    """
    from reports.parsers.follow import logged_last_step

    run_dir = Path(run_dir)
    existing = rundir.read_status(run_dir)
    collected_before = existing is not None and existing.get("written_by") == rundir.COLLECTOR
    follower = follower or log_follower(run_dir, recipe)
    rows = follower.finish(world_size)
    add_mbx_tflops(run_dir, rows, world_size)
    rundir.write_metrics(run_dir, rows)
    facts = _Facts(
        launcher_status=existing.get("launcher_status") if collected_before else existing,  # type: ignore[union-attr]
        exit_info=rundir.read_exit(run_dir),
        hung=rundir.read_hung(run_dir),
        planned=recipe.get("steps") or follower.progress.planned,
        last=logged_last_step(rows),
    )
    state, reason, failure_class, retryable = _decide(run_dir, recipe, facts, retry_on)
    status = {
        "state": state,
        "reason": reason,
        "failure_class": failure_class,
        "retryable": retryable,
        "exit_code": facts.exit_code,
        "steps_completed": facts.last,
        "steps_planned": facts.planned,
        "steps_logged": len(rows),
        "log_files": [str(p) for p in follower.files],
        "launcher_status": facts.launcher_status,
    }
    return rundir.write_status(run_dir, status, rundir.COLLECTOR)


def add_mbx_tflops(run_dir: Path, rows: list[dict[str, Any]], world: int | None) -> None:
    """Each timed row gets mbx's own model TFLOP/s/GPU (trainer/flops.py over the run's resolved Bridge config,
    rundir.BRIDGE_CONFIG) beside the figure the trainer printed; nothing when the run wrote no config."""
    from orchestrator.spec import bridge_config

    path = run_dir / rundir.BRIDGE_CONFIG
    if not world or not path.is_file():
        return
    try:
        flops = bridge_config.step_flops(bridge_config.read(path), world)
    except (bridge_config.BridgeConfigError, ValueError, TypeError, KeyError):
        return  # an unreadable or shapeless config: the printed figure stands alone
    for row in rows:
        ms = row.get("step_time_ms")
        if isinstance(ms, int | float) and ms > 0:
            row.setdefault("extra", {})[rundir.MBX_TFLOPS] = flops / (ms / 1000.0) / world / 1e12


def _decide(
    run_dir: Path, recipe: dict[str, Any], facts: _Facts, retry_on: list[str] | tuple[str, ...]
) -> tuple[str, str | None, str | None, bool]:
    """(state, reason, failure class, retryable) of an ended command attempt."""
    if facts.hung is not None:
        reason = (
            f"hung_after_finish: all {facts.last}/{facts.planned} steps logged but the process did not exit "
            f"within {facts.hung.get('grace_s', 0):.0f} s; it was cancelled (its results are kept)"
        )
        return "completed", reason, "hung_after_finish", False
    said = facts.launcher_status or {}
    if said.get("failure_class") == rundir.INFEASIBLE:  # the GPU check refused it: the command never started
        return "failed", said.get("reason"), rundir.INFEASIBLE, False
    seen = rundir.resolve_state(facts.launcher_status, facts.exit_info)
    if seen.state in STOPPED:
        failure_class = seen.failure_class or _CLASS_OF_STOP.get(seen.state)
        return seen.state, seen.reason, failure_class, failure_class in retry_on
    if facts.exit_code == 0 and facts.last is not None and not facts.launcher_failure:
        return "completed", None, None, False
    return _failed(run_dir, recipe, facts, retry_on)


def _failed(
    run_dir: Path, recipe: dict[str, Any], facts: _Facts, retry_on: list[str] | tuple[str, ...]
) -> tuple[str, str | None, str | None, bool]:
    """A failed attempt, classified from its logs; the reason says what the logs and exit code do not."""
    from reports.failures import classify_failure

    logs = run_dir / rundir.LOGS
    planned, last = facts.planned, facts.last
    result = classify_failure(
        [logs] if logs.is_dir() else [],
        exit_codes=[facts.exit_code] if facts.exit_code is not None else None,
        all_steps_logged=(last >= planned) if planned and last is not None else None,
        planned_steps=planned,
        retryable_classes=retry_on,
    )
    reason = result.reason
    if facts.launcher_failure:  # the launcher saw a failure rank 0's exit code does not show
        said = (facts.launcher_status or {}).get("reason") or "the launcher reported a failure"
        reason = said if result.failure_class == "unknown" else f"{said}; {reason}"
    elif facts.exit_code == 0:
        reason = f"the command exited 0 but logged no training iteration; {reason}"
    elif facts.exit_code is None and facts.launcher_status is None and last is None:
        program = (recipe.get("argv") or ["?"])[0]
        reason = (
            f"the command left no exit code and no output: did it start at all (is {program!r} installed "
            f"and on PATH where it runs)? {reason}"
        )
    return "failed", reason, result.failure_class, result.retryable
