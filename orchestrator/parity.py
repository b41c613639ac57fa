"""Numerics parity in a campaign: the `parity:` section, its sweep factors, and on/off pair verdicts per metric."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.errors import ConfigError
from orchestrator.parity_noise import Noise, noise_floors, within_noise
from orchestrator.store import CellRow
from reports.numerics import MetricParity, metric_parity

METRICS = ("loss", "grad_norm", "eval_loss", "tokens_dropped_frac")  # metrics.jsonl keys compared per step
EVAL_KEY = "training.eval_interval"
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
        "require training loss, grad norm and dropped fraction bitwise equal (bundled trainer).",
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
        if not self.toggle and not self.pairs and not self.eval_check:
            raise ValueError("names nothing to compare: give a toggle, pairs or eval_check: true")
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
class Pairing:
    """One kind of off/on comparison: the keys it sets on each side and the metrics it compares."""

    kind: str  # "toggle" | "pair" | "eval"
    off: dict[str, Any]
    on: dict[str, Any]
    metrics: tuple[str, ...]

    @property
    def title(self) -> str:
        sides = ", ".join(f"{k}: {shown(self.off[k])} → {shown(self.on[k])}" for k in self.off)
        return "train-eval-train vs train-only" if self.kind == "eval" else sides


def pairings(parity: Parity, eval_interval: Any = None) -> list[Pairing]:
    """Every comparison the section asks for (`eval_interval`: the recipe's, for the train-only twin)."""
    found: list[Pairing] = []
    if parity.toggle:
        key, (off, on) = next(iter(parity.toggle.items()))
        found.append(Pairing("toggle", {key: off}, {key: on}, METRICS))
    found += [Pairing("pair", dict(p.off), dict(p.on), METRICS) for p in parity.pairs]
    if parity.eval_check:
        found.append(Pairing("eval", {EVAL_KEY: eval_interval}, {EVAL_KEY: None}, EVAL_METRICS))
    return found


def _swept(campaign: Any) -> set[str]:
    sweep = campaign.sweep
    keys = (
        set(sweep.axes)
        | {k for group in sweep.zip for k in group}
        | {k for cell in sweep.cells for k in cell}
    )
    return keys


def _eval_interval(campaign: Any, campaign_file: Path | None, file: str | None) -> Any:
    """The base recipe's training.eval_interval (the eval side of the train-only twin)."""
    if campaign.trainer.kind != "bundled":
        raise ConfigError("parity.eval_check: needs the bundled trainer (trainer.kind: bundled)", file=file)
    training = campaign.base_recipe(campaign_file).get("training")
    if training is not None and not isinstance(training, dict):
        raise ConfigError(f"trainer.recipe.training: must be a mapping of training settings, not "
                          f"{type(training).__name__} (parity.eval_check reads training.eval_interval)", file=file)
    value = (training or {}).get("eval_interval")
    if value is None:
        raise ConfigError(
            "parity.eval_check: the recipe does not evaluate (training.eval_interval is not set): set it, or "
            "drop eval_check",
            file=file,
        )
    return value


def with_parity_axes(campaign: Any, campaign_file: Path | None = None) -> Any:
    """The campaign with its parity sides as sweep factors: a toggle as an axis, explicit pairs as one zip
    group, eval_check as the axis training.eval_interval: [recipe's, null]. Idempotent (a campaign whose sweep
    already holds exactly these factors, as stored, is returned as it is). A key both swept and toggled is a
    ConfigError naming both places."""
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
    if parity.eval_check:
        wanted.append(
            ("parity.eval_check", {EVAL_KEY: [_eval_interval(campaign, campaign_file, file), None]})
        )
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


@dataclass
class PairVerdict:
    """One off/on pair of cells and its verdict: fail if a metric failed, pass only if every compared metric
    passed, otherwise inconclusive (a side missing or not completed, steps that differ)."""

    pair_id: str
    kind: str
    title: str  # what differs, e.g. "model.moe.expert_weights: single → discrete"
    label: str  # the combination of the other axes, e.g. "precision=bf16" ("base" when none)
    repeat: int
    off_cell: str | None
    on_cell: str | None
    verdict: str = "inconclusive"
    reason: str = ""
    metrics: list[MetricParity] = field(default_factory=list)
    tolerances: dict[str, dict[str, Any]] = field(default_factory=dict)
    noise: dict[str, float] = field(default_factory=dict)  # metric → A/A |Δ| between repeats (with repeats)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PairVerdict:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["metrics"] = [MetricParity(**m) for m in data.get("metrics", [])]
        return cls(**fields)


def _label(params: Mapping[str, Any], skip: set[str]) -> str:
    parts = [f"{k}={shown(v)}" for k, v in params.items() if k not in skip]
    return ", ".join(parts) or "base"


def match_cells(
    pairing: Pairing, cells: list[CellRow]
) -> list[tuple[str, int, CellRow | None, CellRow | None]]:
    """(label, repeat, off cell, on cell) for every combination of the other swept keys that has either side."""
    keys = set(pairing.off)

    def side_of(cell: CellRow) -> str | None:
        values = {k: cell.params.get(k) for k in keys}
        return "off" if values == pairing.off else "on" if values == pairing.on else None

    found: dict[tuple[str, int], dict[str, CellRow]] = {}
    for cell in cells:
        side = side_of(cell)
        if side is None or not keys <= set(cell.params):
            continue
        rest = {k: v for k, v in cell.params.items() if k not in keys}
        entry = found.setdefault((_label(rest, set()), cell.repeat), {})
        entry.setdefault(side, cell)
    return [(label, repeat, sides.get("off"), sides.get("on")) for (label, repeat), sides in found.items()]


RowsOf = Callable[[CellRow], "tuple[list[dict[str, Any]] | None, str]"]


def judge_pair(
    parity: Parity,
    pairing: Pairing,
    label: str,
    repeat: int,
    off: CellRow | None,
    on: CellRow | None,
    rows_of: RowsOf,
    noise: Mapping[str, Noise] | None = None,
) -> PairVerdict:
    """The verdict of one pair; `rows_of(cell)` gives (its completed attempt's metrics rows, or None, and why);
    `noise`: the run-to-run A/A gaps per metric (a failure they explain is inconclusive)."""
    noise = noise or {}
    tolerances = {m: parity.tolerance(m).model_dump() if pairing.kind != "eval" else Tolerance().model_dump()
                  for m in pairing.metrics}  # fmt: skip
    verdict = PairVerdict(f"{pairing.kind}:{off.cell_id if off else '-'}:{on.cell_id if on else '-'}", pairing.kind,
                          pairing.title, label, repeat, off.cell_id if off else None, on.cell_id if on else None,
                          tolerances=tolerances, noise={m: n.max_abs for m, n in noise.items()})  # fmt: skip
    sides: list[list[dict[str, Any]]] = []
    for name, cell in (("off", off), ("on", on)):
        rows, why = rows_of(cell) if cell is not None else (None, "is not in the campaign")
        if rows is None:
            verdict.reason = f"the {name} side {why}"
            return verdict
        sides.append(rows)
    for metric in pairing.metrics:
        tol = tolerances[metric]
        judged = metric_parity(metric, sides[0], sides[1], exact=tol["exact"], max_abs=tol["max_abs"] or 0.0,
                               max_rel=tol["max_rel"] or 0.0, trend=tol["trend"])  # fmt: skip
        verdict.metrics.append(within_noise(judged, noise.get(metric), sides[0], sides[1]))
    decided = [m for m in verdict.metrics if m.verdict != "n/a"]
    failed = [m for m in decided if m.verdict == "fail"]
    undecided = [m for m in decided if m.verdict == "inconclusive"]
    if failed:
        verdict.verdict, verdict.reason = "fail", "; ".join(f"{m.metric}: {m.reason}" for m in failed)
    elif undecided or not decided:
        verdict.reason = "; ".join(f"{m.metric}: {m.reason}" for m in undecided) or "no metric was recorded"
    else:
        verdict.verdict, verdict.reason = "pass", f"{len(decided)} metric(s) within tolerance"
    return verdict


def judge_parity(
    parity: Parity, cells: list[CellRow], rows_of: RowsOf, eval_interval: Any = None
) -> list[PairVerdict]:
    """Every pair's verdict (pairs in cell order); each cell's rows are read once (the noise floors, every
    pairing and its pairs all look at them)."""
    read: dict[str, tuple[list[dict[str, Any]] | None, str]] = {}

    def rows_once(cell: CellRow) -> tuple[list[dict[str, Any]] | None, str]:
        if cell.cell_id not in read:
            read[cell.cell_id] = rows_of(cell)
        return read[cell.cell_id]

    verdicts: list[PairVerdict] = []
    for pairing in pairings(parity, eval_interval):
        if pairing.kind == "eval":
            pairing = _eval_pairing(pairing, cells)
        matched = match_cells(pairing, cells)
        floors = noise_floors(matched, pairing.metrics, rows_once)
        for label, repeat, off, on in matched:
            verdicts.append(judge_pair(parity, pairing, label, repeat, off, on, rows_once, floors.get(label)))
    return verdicts


def _eval_pairing(pairing: Pairing, cells: list[CellRow]) -> Pairing:
    """The eval pairing with the eval side's interval as the cells record it (the first non-null one)."""
    for cell in cells:
        value = cell.params.get(EVAL_KEY)
        if value is not None:
            return Pairing(pairing.kind, {EVAL_KEY: value}, pairing.on, pairing.metrics)
    return pairing
