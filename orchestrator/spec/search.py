"""Budgeted search over a sweep's points (`sweep.search`): grid, random, successive halving, Optuna TPE.

The schema and the budget arithmetic (pure: no store, no runs). orchestrator/flow/search_run.py drives a search.

```yaml
sweep:
  axes: {training.micro_batch_size: [1, 2, 4, 8], recompute: [none, full]}
  search:
    method: halving               # grid | random | halving | optuna
    seed: 0
    budget: {steps: 2000}         # and/or points, gpu_hours: the search stops at the first one reached
    objective: tflops_per_gpu     # maximize; or step_time_ms (minimize)
    constraints: {peak_memory_gib_max: 120, loss_tolerance: 0.02}
    halving: {steps: [10, 30, 100], keep: 0.3333}
    optuna: {warmup_trials: 5, prune: true, prune_at: 10, keep: 0.3333}
```
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

METHODS = ("grid", "random", "halving", "optuna")
OBJECTIVES = {
    "tflops_per_gpu": "tflops",
    "step_time_ms": "step_time",
}  # objective → orchestrator.judge.compare metric


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Budget(_Strict):
    """What the search may spend; it stops before the first limit it would pass (none given: no limit)."""

    points: int | None = Field(
        None, ge=1, description="Distinct points run (a point run at several lengths counts once)."
    )
    steps: int | None = Field(
        None,
        ge=1,
        description="Training steps summed over every run (run length × repeats), every rung included.",
    )
    gpu_hours: float | None = Field(
        None,
        gt=0,
        description="GPU-hours: each attempt's wall time × its world size; checked after every run.",
    )


class Constraints(_Strict):
    """What a point must satisfy to be the best: measured peak memory, loss parity with the base recipe."""

    peak_memory_gib_max: float | None = Field(
        None,
        gt=0,
        description="Peak allocated GiB per GPU at most this; bundled points whose memory estimate exceeds it "
        "are recorded infeasible and never run.",
    )
    loss_tolerance: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="The point's final loss at most (1 + this) × the base recipe's at the same run length (the "
        "base recipe, the campaign without its sweep, is run at each length and counts in the budget).",
    )


class Halving(_Strict):
    """Successive halving over run length: every candidate at steps[0], the best `keep` go on to steps[1], ..."""

    steps: list[int] = Field(
        default_factory=lambda: [10, 30, 50], description="Run length of each rung, increasing."
    )
    keep: float = Field(
        1 / 3, gt=0, lt=1, description="Fraction of a rung's ranked points promoted (at least one)."
    )

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[int]) -> list[int]:
        if (
            len(steps) < 2
            or any(s < 2 for s in steps)
            or any(b <= a for a, b in zip(steps, steps[1:], strict=False))
        ):
            raise ValueError(
                f"{steps}: at least two run lengths (steps ≥ 2), strictly increasing, e.g. [10, 30, 50]"
            )
        return steps


class OptunaSettings(_Strict):
    """Optuna TPE (seeded) over the sweep's axes; a trial is a short run, then the full run unless pruned."""

    warmup_trials: int = Field(
        5,
        ge=1,
        description="Trials run to full length before TPE models the space and before pruning starts.",
    )
    prune: bool = Field(True, description="Stop clearly worse trials after their short run.")
    prune_at: int | None = Field(
        None, ge=2, description="Steps of the short run (default: a tenth of the full run, at least 5)."
    )
    keep: float = Field(
        1 / 3,
        gt=0,
        lt=1,
        description="Pruning keeps this top fraction of the short runs: optuna's percentile pruner (by means), "
        "and the rank of a halving rung (verdicts first: a point DIFFERENT (worse) than the leader after every "
        "point they cannot separate from it); a trial is pruned when both put it outside.",
    )
    max_trials: int | None = Field(
        None,
        ge=1,
        description="Trials asked of the sampler, repeats of evaluated points included (default 10 × points).",
    )


class Search(BaseModel):
    """How many of the sweep's points to run, in which order, and how the best is decided."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["grid", "random", "halving", "optuna"] = Field("grid", description="Search method.")
    seed: int = Field(0, description="Seed of the random order, the halving sample and Optuna's sampler.")
    budget: Budget = Field(default_factory=Budget, description="Limits on points, steps and GPU-hours.")
    objective: Literal["tflops_per_gpu", "step_time_ms"] = Field(
        "tflops_per_gpu", description="tflops_per_gpu (maximized) or step_time_ms (minimized)."
    )
    min_effect: float = Field(
        0.01,
        ge=0,
        lt=1,
        description="Practical threshold of the verdicts between points (a fraction: 0.01 = 1%).",
    )
    constraints: Constraints = Field(
        default_factory=Constraints, description="What the best point must satisfy."
    )
    steps_key: str = Field(
        "training.steps",
        description="The dotted sweep key that sets a run's length for a halving's rungs and Optuna's short runs; "
        "unset: the trainer kind's (training.steps for the bundled trainer, params.train_iters for a Megatron-LM "
        "command, params.train.train_iters for Bridge).",
    )
    halving: Halving = Field(default_factory=Halving, description="Rungs of successive halving.")
    optuna: OptunaSettings = Field(default_factory=OptunaSettings, description="Optuna TPE settings.")

    @model_validator(mode="after")
    def _halving_budget(self) -> Search:
        if self.method == "halving" and self.budget.steps is not None:
            rungs = self.halving.steps
            if rungs[0] > self.budget.steps:
                raise ValueError(
                    f"budget.steps {self.budget.steps} is below one run of the first rung ({rungs[0]} steps)"
                )
        return self

    @property
    def metric(self) -> str:
        """The orchestrator.judge.compare metric name of the objective."""
        return OBJECTIVES[self.objective]


def survivors(count: int, keep: float) -> int:
    """Points promoted out of a rung of `count` ranked points: ceil(count × keep), at least 1."""
    return max(1, math.ceil(count * keep - 1e-9)) if count else 0


def halving_sizes(first: int, rungs: int, keep: float) -> list[int]:
    """Points run at each rung when `first` start: [first, survivors(first), survivors(that), ...]."""
    sizes = [first]
    for _ in range(rungs - 1):
        sizes.append(survivors(sizes[-1], keep))
    return sizes


def halving_cost(first: int, steps: list[int], keep: float, repeats: int = 1) -> int:
    """Training steps a halving of `first` candidates spends over the rungs `steps` (× repeats)."""
    return repeats * sum(n * s for n, s in zip(halving_sizes(first, len(steps), keep), steps, strict=True))


def halving_start(candidates: int, steps: list[int], keep: float, repeats: int, budget_steps: int | None,
                  budget_points: int | None = None) -> int:  # fmt: skip
    """How many candidates a halving can start with inside the budget (all of them without a budget)."""
    best = min(candidates, budget_points or candidates)
    if budget_steps is None:
        return best
    while best > 1 and halving_cost(best, steps, keep, repeats) > budget_steps:
        best -= 1
    return best
