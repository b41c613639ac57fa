"""Parity verdicts: each on/off pair of a `parity:` campaign judged per metric over its steps."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.judge.outcome import FAIL, PASS, combine
from orchestrator.judge.parity_noise import Noise, noise_floors, within_noise
from orchestrator.run.store import CellRow
from orchestrator.spec.parity import Pairing, Parity, ParityAxes, Tolerance, pairings, shown
from reports.numerics import MetricParity, metric_parity


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
    verdict.verdict = combine(m.verdict for m in decided)  # orchestrator/judge/outcome.py's one rule
    if verdict.verdict == PASS:
        verdict.reason = f"{len(decided)} metric(s) within tolerance"
    else:
        wanted = {FAIL} if verdict.verdict == FAIL else {m.verdict for m in decided} - {PASS}
        shown = [m for m in decided if m.verdict in wanted]
        verdict.reason = "; ".join(f"{m.metric}: {m.reason}" for m in shown) or "no metric was recorded"
    return verdict


def judge_parity(
    parity: Parity, cells: list[CellRow], rows_of: RowsOf, axes: ParityAxes | None = None
) -> list[PairVerdict]:
    """Every pair's verdict (pairs in cell order); each cell's rows are read once (the noise floors, every
    pairing and its pairs all look at them). `axes`: the trainer kind's keys of eval_check and checkpoint
    (`TrainerKind.parity_axes`; the eval side's interval is read from the cells)."""
    read: dict[str, tuple[list[dict[str, Any]] | None, str]] = {}

    def rows_once(cell: CellRow) -> tuple[list[dict[str, Any]] | None, str]:
        if cell.cell_id not in read:
            read[cell.cell_id] = rows_of(cell)
        return read[cell.cell_id]

    verdicts: list[PairVerdict] = []
    for pairing in pairings(parity, axes):
        if pairing.kind == "eval":
            pairing = _eval_pairing(pairing, cells)
        matched = match_cells(pairing, cells)
        floors = noise_floors(matched, pairing.metrics, rows_once)
        for label, repeat, off, on in matched:
            verdicts.append(judge_pair(parity, pairing, label, repeat, off, on, rows_once, floors.get(label)))
    return verdicts


def _eval_pairing(pairing: Pairing, cells: list[CellRow]) -> Pairing:
    """The eval pairing with the eval side's interval as the cells record it (the first non-null one)."""
    key = next(iter(pairing.off))
    for cell in cells:
        value = cell.params.get(key)
        if value is not None:
            return Pairing(pairing.kind, {key: value}, pairing.on, pairing.metrics)
    return pairing
