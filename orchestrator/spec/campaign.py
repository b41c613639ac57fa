"""Campaign file schema (pydantic v2): trainer, sweep grammar, resources, gates, launcher profile, W&B."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from launchers.profile import Cluster, Container
from orchestrator.rows import DEFAULT_KIND
from orchestrator.spec.profile_spec import Profile
from orchestrator.spec.search import Search
from orchestrator.spec.software import Software
from orchestrator.spec.trainer_section import ByKind, TrainerSection, default_section
from orchestrator.spec.verdict_section import campaign_fields
from reports.failure_classes import FAILURE_CLASSES
from reports.gates import GateSpec
from reports.wandb_settings import WandbSettings
from trainer.recipe import Recipe

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
SweepValue = Any
MAX_REPEATS = 1000  # repeats of one point; the sweep's cell limit (--max-cells) bounds the total


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
        description="Names that change which code runs (PATH, PYTHONPATH, LD_PRELOAD, LD_LIBRARY_PATH, CC, CXX, "
        "TRITON_*_PATH, ...: orchestrator/spec/reserved_env.py CODE_LOADING) that this campaign sets, sweeps or "
        "passes on purpose; any of them not listed here is refused.",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("allow_code_loading")
    @classmethod
    def _code_loading_names(cls, names: list[str]) -> list[str]:
        from orchestrator.spec.reserved_env import code_loading_names, code_loading_reason

        for name in names:
            if code_loading_reason(name) is None:
                raise ValueError(f"{name!r} does not change which code runs, nothing to allow; the names that do: "
                                 f"{code_loading_names()}")  # fmt: skip
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


class _CampaignCore(_Strict):
    """A campaign's keys up to `software`; then one key per verdict kind (`_WithVerdicts`), then `profile`."""

    name: str = Field(..., pattern=NAME_PATTERN, description="Campaign name (letters, digits, . _ -).")
    description: str = Field("", description="What this campaign measures.")
    trainer: Annotated[TrainerSection, ByKind()] = Field(
        default_factory=default_section,
        description=f"What runs at every point: `kind` (default {DEFAULT_KIND}) names a trainer kind, whose own keys "
        "follow (`mbx schema campaign` lists every kind's).",
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


# One optional section per verdict kind (orchestrator/spec/verdict_section.py: `parity:`), found by name.
_WithVerdicts = create_model("_WithVerdicts", __base__=_CampaignCore, __module__=__name__, **campaign_fields())


class Campaign(_WithVerdicts):  # type: ignore[misc,valid-type]
    """A benchmark campaign: a base training recipe plus sweeps of knobs, gates and where to run."""

    profile: Profile | None = Field(None, description="Profile a few steps of every cell; the report shows where GPU time goes.")


def recipe_schema() -> dict[str, Any]:
    """JSON Schema of the bundled-trainer recipe."""
    return Recipe.model_json_schema()
