"""Numerics parity in a campaign file: the `parity:` section, its pairings and the sweep factors they add
(the verdicts: orchestrator/judge/parity_verdicts.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.errors import ConfigError

METRICS = ("loss", "grad_norm", "eval_loss", "tokens_dropped_frac")  # metrics.jsonl keys compared per step
EVAL_METRICS = ("loss", "grad_norm", "tokens_dropped_frac")  # eval_loss exists on one side only, by design
Metric = Literal["loss", "grad_norm", "eval_loss", "tokens_dropped_frac"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Tolerance(_Strict):
    """How close a metric of the two sides must be, per step over the whole run."""

    exact: bool = Field(
        False, description="Bitwise equal at every step (the default when nothing else is set)."
    )
    max_abs: float | None = Field(
        None, ge=0, description="|on − off| ≤ this at every step (or within max_rel)."
    )
    max_rel: float | None = Field(
        None, ge=0, description="|on − off| ≤ this × |off| at every step (or within max_abs)."
    )
    trend: bool = Field(
        True, description="Also fail when |on − off| grows over the run (linregress, p < 0.05)."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Tolerance:
        if self.exact and (self.max_abs is not None or self.max_rel is not None):
            raise ValueError("exact: true and max_abs/max_rel exclude each other")
        if self.max_abs is None and self.max_rel is None:
            self.exact = True
        return self


class Pair(_Strict):
    """One explicit pair: the keys and values of its off side and of its on side (the same keys)."""

    off: dict[str, Any] = Field(..., min_length=1, description="Dotted key → value of the reference side.")
    on: dict[str, Any] = Field(..., min_length=1, description="Dotted key → value of the side under test.")

    @model_validator(mode="after")
    def _same_keys(self) -> Pair:
        if set(self.off) != set(self.on):
            raise ValueError(
                f"off and on must name the same keys (off: {sorted(self.off)}, on: {sorted(self.on)})"
            )
        if self.off == self.on:
            raise ValueError("off and on are the same point")
        return self


class CheckpointCheck(_Strict):
    """Save with one setting, load with another, continue: must train as the straight run does."""

    save_at: int = Field(..., ge=1, description="Step after which both sides save their state (before the last).")
    load_with: dict[str, Any] = Field(
        default_factory=dict,
        description="Dotted keys → values the loading side continues with, e.g. {model.moe.expert_weights: "
        "discrete}; {} reloads unchanged. The other side trains straight through (saving, not reloading).",
    )


class Parity(BaseModel):
    """The `parity:` section: pairs of points that must train the same, judged per step and per metric."""

    model_config = ConfigDict(extra="forbid")

    toggle: dict[str, list[Any]] | None = Field(
        None,
        description="One dotted key → [off, on], e.g. model.moe.expert_weights: [single, discrete]; every "
        "combination of the other sweep axes gives an off/on pair (same seed and data).",
    )
    pairs: list[Pair] = Field(
        default_factory=list,
        description="Explicit off/on pairs (all with the same keys), instead of a toggle.",
    )
    metrics: dict[Metric, Tolerance] = Field(
        default_factory=dict,
        description=f"Tolerance per metric ({', '.join(METRICS)}); a metric not named must be bitwise equal.",
    )
    eval_check: bool = Field(
        False,
        description="Train-eval-train vs train-only: add each point's twin with training.eval_interval null and "
        "require training loss, grad norm and dropped fraction bitwise equal (the bundled trainer; a command "
        "trainer through trainer.eval_interval_param).",
    )
    checkpoint: CheckpointCheck | None = Field(
        None,
        description="Save at save_at, then continue in a fresh trainer loading that checkpoint with load_with "
        "applied (the on side) vs train straight through (the off side); compared per step with `metrics`' "
        "tolerances (steps up to save_at are the same run by construction). Bundled trainer.",
    )

    @field_validator("toggle")
    @classmethod
    def _one_toggle(cls, toggle: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        if toggle is None:
            return None
        if len(toggle) != 1:
            raise ValueError(f"names exactly one key (got {len(toggle)}); use pairs for several keys")
        key, values = next(iter(toggle.items()))
        if len(values) != 2 or values[0] == values[1]:
            raise ValueError(f"{key}: needs exactly two different values [off, on] (got {values!r})")
        return toggle

    @model_validator(mode="after")
    def _something(self) -> Parity:
        if self.toggle and self.pairs:
            raise ValueError("give a toggle or pairs, not both")
        if not self.toggle and not self.pairs and not self.eval_check and self.checkpoint is None:
            raise ValueError("names nothing to compare: give a toggle, pairs, eval_check: true or checkpoint")
        keys = {frozenset(p.off) for p in self.pairs}
        if len(keys) > 1:
            raise ValueError("pairs: every pair must name the same keys (they form one sweep factor)")
        return self

    def tolerance(self, metric: str) -> Tolerance:
        return self.metrics.get(metric, Tolerance())  # type: ignore[call-overload]


def shown(value: Any) -> str:
    """A swept value as the user wrote it: strings bare, everything else as JSON (null, true, 1.25)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True)
class ParityAxes:
    """The sweep keys the trainer kind gives the checks that depend on it (`TrainerKind.parity_axes`,
    orchestrator/trainers/base.py): eval_check's interval (and its base value), checkpoint's two keys."""

    eval_key: str | None = None
    eval_value: Any = None
    save_key: str | None = None
    reload_key: str | None = None


@dataclass(frozen=True)
class Pairing:
    """One kind of off/on comparison: the keys it sets on each side and the metrics it compares."""

    kind: str  # "toggle" | "pair" | "eval"
    off: dict[str, Any]
    on: dict[str, Any]
    metrics: tuple[str, ...]

    @property
    def title(self) -> str:
        sides = ", ".join(f"{k}: {shown(self.off[k])} → {shown(self.on[k])}" for k in self.off)
        if self.kind == "checkpoint":
            save, reload = self.on.items()
            return f"save at step {shown(save[1])}, reload with {shown(reload[1])} vs straight through"
        return "train-eval-train vs train-only" if self.kind == "eval" else sides


def pairings(parity: Parity, axes: ParityAxes | None = None) -> list[Pairing]:
    """Every comparison the section asks for; `axes`: the trainer kind's keys of eval_check and checkpoint."""
    found: list[Pairing] = []
    if parity.toggle:
        key, (off, on) = next(iter(parity.toggle.items()))
        found.append(Pairing("toggle", {key: off}, {key: on}, METRICS))
    found += [Pairing("pair", dict(p.off), dict(p.on), METRICS) for p in parity.pairs]
    for factor in _kind_factors(parity, axes):
        off, on = ({k: values[i] for k, values in factor.items()} for i in (0, 1))
        kind = "eval" if axes and axes.eval_key in factor else "checkpoint"
        found.append(Pairing(kind, off, on, EVAL_METRICS if kind == "eval" else METRICS))
    return found


def _kind_factors(parity: Parity, axes: ParityAxes | None) -> list[dict[str, list[Any]]]:
    """The sweep factors of eval_check ({key: [interval, null]}) and checkpoint ({save: [N, N], reload: [null,
    load_with]}), on the trainer kind's keys."""
    axes = axes or ParityAxes()
    factors = []
    if parity.eval_check:
        if axes.eval_key is None:
            raise ValueError("parity.eval_check: the trainer kind's evaluation-interval key is needed")
        factors.append({axes.eval_key: [axes.eval_value, None]})
    if parity.checkpoint is not None:
        if axes.save_key is None or axes.reload_key is None:
            raise ValueError("parity.checkpoint: the trainer kind's checkpoint keys are needed")
        check = parity.checkpoint
        factors.append({axes.save_key: [check.save_at, check.save_at], axes.reload_key: [None, check.load_with]})
    return factors


def _swept(campaign: Any) -> set[str]:
    sweep = campaign.sweep
    keys = (
        set(sweep.axes)
        | {k for group in sweep.zip for k in group}
        | {k for cell in sweep.cells for k in cell}
    )
    return keys


def with_parity_axes(campaign: Any, campaign_file: Path | None = None, kind_axes: ParityAxes | None = None
                     ) -> Any:
    """The campaign with its parity sides as sweep factors: a toggle as an axis, explicit pairs as one zip
    group, eval_check as the axis <the kind's eval-interval key>: [base value, null], checkpoint as one zip
    group (`kind_axes`: the trainer kind's keys; orchestrator.trainers.with_parity_axes gives them). Idempotent (a
    campaign whose sweep already holds exactly these factors, as stored, is returned as it is). A key both
    swept and toggled is a ConfigError naming both places."""
    parity: Parity | None = campaign.parity
    if parity is None:
        return campaign
    file = str(campaign_file) if campaign_file else None
    axes = dict(campaign.sweep.axes)
    groups = [dict(g) for g in campaign.sweep.zip]
    swept = _swept(campaign)
    wanted: list[tuple[str, dict[str, list[Any]]]] = []
    if parity.toggle:
        wanted.append(("parity.toggle", dict(parity.toggle)))
    if parity.pairs:
        keys = list(parity.pairs[0].off)
        wanted.append(
            ("parity.pairs", {k: [v for p in parity.pairs for v in (p.off[k], p.on[k])] for k in keys})
        )
    try:
        kind_factors = _kind_factors(parity, kind_axes)
    except ValueError as err:
        raise ConfigError(str(err), file=file) from None
    where = ["parity.eval_check"] * parity.eval_check + ["parity.checkpoint"] * (parity.checkpoint is not None)
    wanted += list(zip(where, kind_factors, strict=True))
    cells = _crossed_cells(campaign.sweep.cells, [factor for _, factor in wanted])
    for where, factor in wanted:
        if (
            len(factor) == 1 and axes.get(next(iter(factor))) == next(iter(factor.values()))
        ) or factor in groups:
            continue  # already there (a stored campaign)
        clash = sorted(set(factor) & swept)
        if clash:
            raise ConfigError(f"{where}: {clash[0]} is also swept in sweep: the parity section makes its own "
                              "sweep factor of it; remove it from sweep", file=file)  # fmt: skip
        if len(factor) == 1:
            axes.update(factor)
        else:
            groups.append(factor)
    sweep = campaign.sweep.model_copy(update={"axes": axes, "zip": groups, "cells": cells})
    return campaign.model_copy(update={"sweep": sweep})


def _crossed_cells(cells: list[dict[str, Any]], factors: list[dict[str, list[Any]]]) -> list[dict[str, Any]]:
    """Explicit sweep cells crossed with every parity side (a cell that already sets a factor's keys, as a
    stored campaign's do, keeps its value for that factor)."""
    for factor in factors:
        sides = [
            {k: values[i] for k, values in factor.items()} for i in range(len(next(iter(factor.values()))))
        ]
        crossed = []
        for cell in cells:
            if set(factor) <= set(cell):
                crossed.append(cell)
            else:
                crossed += [{**cell, **side} for side in sides]
        cells = crossed
    return cells
