"""Campaign file schema (pydantic v2): trainer, sweep grammar, resources, gates, launcher profile, W&B."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from launchers.profile import Cluster, Container
from orchestrator.spec.parity import Parity
from orchestrator.spec.profile_spec import Profile
from orchestrator.spec.search import Search
from orchestrator.spec.software import Software
from reports.failure_classes import FAILURE_CLASSES
from reports.gates import GateSpec
from reports.wandb_settings import WandbSettings
from trainer.recipe import Recipe

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
SweepValue = Any
MAX_REPEATS = 1000  # repeats of one point; the sweep's cell limit (--max-cells) bounds the total


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BundledTrainer(_Strict):
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


class CommandTrainer(_Strict):
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


def _trainer_kind(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("kind", "bundled"))
    return str(getattr(value, "kind", "bundled"))


TRAINER_KINDS: dict[str, type[BaseModel]] = {"bundled": BundledTrainer, "command": CommandTrainer}
Trainer = Annotated[
    Annotated[BundledTrainer, Tag("bundled")] | Annotated[CommandTrainer, Tag("command")],
    Discriminator(
        _trainer_kind,
        custom_error_type="invalid_trainer_kind",
        custom_error_message="trainer.kind must be one of 'bundled', 'command'",
    ),
]


class Resources(_Strict):
    """Nodes and ranks per point (sweepable as resources.<key>)."""

    nodes: int = Field(1, ge=1, description="Nodes per point.")
    gpus_per_node: int = Field(
        1, ge=1, description="Ranks per node: one per GPU (on CPU-only machines, processes)."
    )
    time_limit_min: float | None = Field(None, gt=0, description="Wall-clock limit per attempt, minutes.")
    gpu: str | None = Field(
        None,
        description="Target GPU model (e.g. H200, H100-80GB, GB200) whose memory bounds each point's estimate; "
        "`mbx campaign run --gpu` wins.",
    )


class Sweep(_Strict):
    """Which points to run: product over axes × zip groups, plus explicit cells, minus excluded, × repeats."""

    axes: dict[str, list[SweepValue]] = Field(
        default_factory=dict,
        description="Dotted key → list of values; the product of all axes (and zip groups) is taken.",
    )
    zip: list[dict[str, list[SweepValue]]] = Field(
        default_factory=list,
        description="Groups of dotted keys whose equal-length value lists vary together (one product factor each).",
    )
    cells: list[dict[str, SweepValue]] = Field(
        default_factory=list, description="Explicit points (dotted key → value), added after the product."
    )
    exclude: list[dict[str, SweepValue | list[SweepValue]]] = Field(
        default_factory=list,
        description="Rules: a point matching every key of a rule is dropped; a list value matches any of its items.",
    )
    repeats: int = Field(
        1, ge=1, le=MAX_REPEATS, description=f"Run every point this many times (noise-aware verdicts; at most {MAX_REPEATS})."
    )
    search: Search | None = Field(
        None, description="Budgeted search over the points (grid | random | halving | optuna) instead of running all."
    )

    @field_validator("axes")
    @classmethod
    def _non_empty_axes(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in axes.items():
            if not values:
                raise ValueError(f"axis {key!r} has no values")
        return axes

    @field_validator("zip")
    @classmethod
    def _equal_lengths(cls, groups: list[dict[str, list[Any]]]) -> list[dict[str, list[Any]]]:
        for index, group in enumerate(groups):
            lengths = {key: len(values) for key, values in group.items()}
            if len(set(lengths.values())) > 1:
                raise ValueError(f"zip group {index}: value lists differ in length: {lengths}")
            if not group or 0 in lengths.values():
                raise ValueError(f"zip group {index}: needs at least one key with at least one value")
        return groups

    @model_validator(mode="after")
    def _no_key_twice(self) -> Sweep:
        seen: set[str] = set(self.axes)
        for index, group in enumerate(self.zip):
            for key in group:
                if key in seen:
                    raise ValueError(
                        f"key {key!r} is swept twice (zip group {index} and another axis or group)"
                    )
                seen.add(key)
        return self


class Env(_Strict):
    """Environment of the trainer processes."""

    values: dict[str, str] = Field(
        default_factory=dict,
        description="Non-secret variables set for the trainer (sweepable as env.NAME); names mbx sets or reads "
        "itself (MBX_*, SLURM_*, TORCHELASTIC_*, RANK and the other torch.distributed variables, the JIT cache "
        "variables: orchestrator/spec/reserved_env.py) are refused.",
    )
    pass_names: list[str] = Field(
        default_factory=list,
        alias="pass",
        description="Names passed through from the submitting environment (secrets go here: never their values); "
        "reserved names as for values are refused.",
    )

    allow_code_loading: list[str] = Field(
        default_factory=list,
        description="Names that change which code runs (PYTHONPATH, LD_PRELOAD, LD_LIBRARY_PATH, PYTHONSTARTUP, "
        "...: orchestrator/spec/reserved_env.py CODE_LOADING) that this campaign sets, sweeps or passes on purpose; "
        "any of them not listed here is refused.",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("allow_code_loading")
    @classmethod
    def _code_loading_names(cls, names: list[str]) -> list[str]:
        from orchestrator.spec.reserved_env import CODE_LOADING

        for name in names:
            if name not in CODE_LOADING:
                raise ValueError(f"{name!r} does not change which code runs, nothing to allow; the names that do: "
                                 f"{', '.join(CODE_LOADING)}")  # fmt: skip
        return names

    @field_validator("values", "pass_names")
    @classmethod
    def _names(cls, value: Any) -> Any:
        names = value if isinstance(value, list) else list(value)
        for name in names:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value


class Collect(_Strict):
    """How runs are summarized."""

    window: int = Field(
        10, ge=1, description="Summary window: the last N timed steps (the first step never counts)."
    )
    exit_grace_s: float | None = Field(
        60.0,
        gt=0,
        description=(
            "Command trainers: once every planned step is logged, the process must exit within this many "
            "seconds, else it is cancelled and recorded as hung_after_finish (its results are kept); null: wait."
        ),
    )


class Retry(_Strict):
    """Bounded retries of attempts that failed for a retryable reason (same cell, new attempt)."""

    max_attempts: int = Field(
        1, ge=1, le=20, description="Attempts per cell and campaign run, the first included (1: no retry)."
    )
    on: list[str] = Field(
        default_factory=lambda: ["infra", "preempted"],
        description=f"Failure classes worth another attempt; any of {', '.join(FAILURE_CLASSES)}.",
    )

    @model_validator(mode="before")
    @classmethod
    def _yaml_on_key(cls, data: Any) -> Any:
        """YAML 1.1 reads an unquoted `on:` key as the boolean true; take it back as `on`."""
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if key is True else key): value for key, value in data.items()}
        return data

    @field_validator("on")
    @classmethod
    def _known_classes(cls, names: list[str]) -> list[str]:
        for name in names:
            if name not in FAILURE_CLASSES:
                raise ValueError(f"{name!r} is not a failure class; allowed: {', '.join(FAILURE_CLASSES)}")
        return names


class Campaign(_Strict):
    """A benchmark campaign: a base training recipe plus sweeps of knobs, gates and where to run."""

    name: str = Field(..., pattern=NAME_PATTERN, description="Campaign name (letters, digits, . _ -).")
    description: str = Field("", description="What this campaign measures.")
    trainer: Trainer = Field(
        default_factory=BundledTrainer,
        description="What runs at every point: kind bundled (a recipe) or command (an argv template).",
    )
    resources: Resources = Field(default_factory=Resources, description="Nodes and ranks per point.")
    sweep: Sweep = Field(default_factory=Sweep, description="The points to run.")
    gates: GateSpec = Field(default_factory=GateSpec, description="Pass/fail limits for every cell.")
    collect: Collect = Field(default_factory=Collect, description="Summary and hang-detection settings.")
    retry: Retry = Field(default_factory=Retry, description="Bounded retries of failed attempts.")
    launcher: str = Field(
        "local",
        description=(
            "Backend: local | submitit | nemo-run | nemo-run-local (CLI --launcher wins; "
            "`mbx campaign run FILE --dry-run` shows what it would submit)."
        ),
    )
    launchers: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Per-backend settings, e.g. launchers.local.parallel (checked against the backend's settings).",
    )
    cluster: Cluster = Field(default_factory=Cluster, description="Slurm profile.")
    container: Container = Field(default_factory=Container, description="Container for the trainer.")
    env: Env = Field(default_factory=Env, description="Trainer environment.")
    wandb: WandbSettings = Field(default_factory=WandbSettings, description="Weights & Biases logging.")
    baseline: str | None = Field(None, description="Campaign name whose cells this one is compared with.")
    software: Software = Field(
        default_factory=Software, description="Software versions per point (git refs, pip pins) for sweeps and bisect."
    )
    parity: Parity | None = Field(None, description="Numerics parity: a toggle whose on/off pairs must train the same.")
    profile: Profile | None = Field(None, description="Profile a few steps of every cell; the report shows where GPU time goes.")

    def base_recipe(self, campaign_file: Path | None) -> dict[str, Any]:
        """The base recipe mapping (recipe_file, then `recipe` merged over it)."""
        from orchestrator.spec.keys import deep_merge
        from orchestrator.spec.yamlio import load_yaml_file

        base: dict[str, Any] = {}
        if not isinstance(self.trainer, BundledTrainer):
            return base
        if self.trainer.recipe_file:
            root = campaign_file.parent if campaign_file else Path.cwd()
            loaded = load_yaml_file(root / self.trainer.recipe_file)
            if not isinstance(loaded, dict):
                from orchestrator.errors import ConfigError

                raise ConfigError("trainer.recipe_file: must hold a mapping", file=str(campaign_file))
            base = loaded
        return deep_merge(base, self.trainer.recipe)


def recipe_schema() -> dict[str, Any]:
    """JSON Schema of the bundled-trainer recipe."""
    return Recipe.model_json_schema()
