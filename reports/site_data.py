"""Plain data of the report site beyond the CampaignView: what the orchestrator passes in (rejected points, baseline
summaries, estimates, trials, GPU-hours) and the per-cell figures derived from step rows (peak memory or RSS)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reports.metrics import finite
from reports.views import CellView, PointView
from reports.window import Summary
from trainer import rundir


@dataclass
class SiteExtras:
    """What the report site shows beside the view; every field optional (a page built from a view alone)."""

    rejected: list[dict[str, Any]] = field(
        default_factory=list
    )  # point_id, label, why, kind (orchestrator/freeze)
    winner: str | None = None  # point id picked by the verdicts (mbx freeze), when it could pick one
    how: str | None = None  # how the winner was picked, with its confidence
    freeze_note: str | None = None  # why no winner could be picked
    baselines: dict[str, Summary] = field(default_factory=dict)  # cell id → the matched baseline summary
    estimates: list[dict[str, Any]] = field(default_factory=list)  # Store.estimates rows
    trials: list[dict[str, Any]] = field(default_factory=list)  # Store.trials rows (search)
    search_steps: int | None = None  # a search's full length (orchestrator/flow/search_length.py); None: unknown
    gpu_hours: float | None = None
    gpu_hours_note: str = ""
    compare_href: str | None = None  # the comparison page, relative to the index
    # the campaign's outcome as the closing line says it (orchestrator/judge/outcome.py: verdict, closing, parts)
    outcome: dict[str, Any] | None = None


# ---------------------------------------------------------------- memory: GPU allocated, or RSS on CPU


def peak_rss(cell: CellView) -> float | None:
    """The cell's peak resident set size (GiB) from its step rows (`rss_gib`, a running peak)."""
    values = [r["rss_gib"] for r in cell.rows if finite(r.get("rss_gib"))]
    return max(values) if values else None


def cell_memory(cell: CellView) -> tuple[float | None, str]:
    """(peak GiB, kind): the GPU's peak allocated memory ('alloc'), or on a CPU run (allocated 0) its peak RSS
    ('rss'); (None, 'alloc') when neither was recorded."""
    alloc = cell.summary.peak_alloc_gib if cell.summary is not None else None
    if finite(alloc) and alloc > 0:  # type: ignore[operator]
        return float(alloc), "alloc"  # type: ignore[arg-type]
    rss = peak_rss(cell)
    if rss is not None:
        return rss, "rss"
    return (float(alloc), "alloc") if finite(alloc) else (None, "alloc")  # type: ignore[arg-type]


def point_memory(point: PointView) -> tuple[float | None, str]:
    """A point's peak memory: its one cell's, else the mean over its completed repeats (same kind as the first)."""
    cells = point.repeats if len(point.repeats) == 1 else point.completed
    figures = [cell_memory(c) for c in cells]
    values = [v for v, _ in figures if v is not None]
    kind = next((k for v, k in figures if v is not None), "alloc")
    return (sum(values) / len(values) if values else None), kind


# ---------------------------------------------------------------- a search: which points its figures show

NOT_CANDIDATES = ("short run", "reference")  # rejected kinds (orchestrator/judge/freeze.py) that are no trial result
LEFT_OUT = ("excluded", "failed", "infeasible")  # trial states that never enter the best or the Pareto front


@dataclass(frozen=True)
class SearchScope:
    """What a search's figures show. Its plots draw every trial with its run length (`lengths`); what is judged
    on one figure (the heatmap, the per-step curves) draws the completed full-length trials that could win
    (`shown`, as its best and its Pareto front are picked, orchestrator/judge/best.py); `front` is its recorded
    Pareto front (None: not recorded) and `memory_front` the points that stopped at a shorter run but are on it
    for memory (their objective is a shorter run's)."""

    shown: frozenset[str]
    front: frozenset[str] | None
    lengths: dict[str, int] = field(default_factory=dict)  # point id → run length, every trial that ran
    full: int = 0
    memory_front: frozenset[str] = frozenset()


def search_scope(extras: SiteExtras) -> SearchScope | None:
    """None when the campaign is not a search. Full length is the search's (`extras.search_steps`: a halving's
    last rung, else the recipe's length), which no trial may have reached when its budget ran out; without it,
    the longest run of its trials. Shorter rungs' runs, the base recipe run as the loss reference and trials a
    constraint excluded are left out of `shown`, as are the points the verdicts rejected as no trial result."""
    rows = [r for r in extras.trials if r.get("point_id")]
    longest = max((r["steps"] for r in extras.trials if isinstance(r.get("steps"), int)), default=None)
    if longest is None:
        return None
    full = extras.search_steps or longest
    off = {r["point_id"] for r in extras.rejected if r.get("kind") in NOT_CANDIDATES}
    shown = {r["point_id"] for r in rows if r.get("steps") == full and r.get("state") not in LEFT_OUT} - off
    front = {r["point_id"] for r in rows if r.get("pareto") and r.get("pareto_by") != "memory"} & shown
    reference = {r["point_id"] for r in extras.rejected if r.get("kind") == "reference"}
    lengths = {r["point_id"]: int(r["steps"]) for r in rows if r["point_id"] not in reference}
    low = frozenset(r["point_id"] for r in rows if r.get("pareto_by") == "memory")
    return SearchScope(frozenset(shown), frozenset(front) if front else None, lengths, full, low)


# ---------------------------------------------------------------- baseline deltas


def relative(value: Any, base: Any) -> float | None:
    """(value − base) / base, or None where either is missing or the base is 0."""
    if not finite(value) or not finite(base) or base == 0:
        return None
    return (float(value) - float(base)) / float(base)


def point_baseline(point: PointView, baselines: dict[str, Summary]) -> Summary | None:
    """The baseline summary matched to a point (its first repeat that has one)."""
    return next((baselines[c.cell_id] for c in point.repeats if c.cell_id in baselines), None)


# ---------------------------------------------------------------- estimates and headroom


def estimate_index(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Estimate rows by point id."""
    return {str(r.get("point_id")): r for r in rows if r.get("point_id") is not None}


def headroom(estimate: dict[str, Any] | None, measured: float | None, kind: str) -> float | None:
    """GPU memory less the measured peak allocated memory (GPU runs), else less the estimate."""
    if estimate is None or not finite(estimate.get("gpu_gib")):
        return None
    used = measured if measured is not None and kind == "alloc" else estimate.get("estimate_gib")
    return float(estimate["gpu_gib"]) - float(used) if finite(used) else None


# ---------------------------------------------------------------- GPU-hours


def attempt_gpu_hours(run_dir: str | None, gpus: int, submitted: float | None, ended: float | None) -> float:
    """GPU-hours of one attempt: its status.json's start/end × world size, else the store's submission/end times
    × the GPUs asked for; 0 when neither is known."""
    status = rundir.read_status(Path(run_dir)) if run_dir else None
    start, end = (status or {}).get("started_at"), (status or {}).get("ended_at")
    world = (status or {}).get("world_size")
    if not (finite(start) and finite(end)):
        start, end = submitted, ended
    if not (finite(start) and finite(end)) or end < start:  # type: ignore[operator]
        return 0.0
    ranks = int(world) if finite(world) and world > 0 else gpus  # type: ignore[operator]
    return (float(end) - float(start)) * ranks / 3600.0  # type: ignore[arg-type]


# ---------------------------------------------------------------- names


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def cell_file(cell_id: str) -> str:
    """The cell page's file name: a readable slug of the id plus a hash of it (ids may hold any character)."""
    slug = _UNSAFE.sub("_", cell_id).strip("._")[:60] or "cell"
    digest = hashlib.sha1(cell_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{slug}-{digest}.html"


def short_axis_names(axes: list[str]) -> list[str]:
    """Last dotted component of each axis where that is unambiguous, else the full key."""
    last = [a.rsplit(".", 1)[-1] for a in axes]
    return [short if last.count(short) == 1 else full for short, full in zip(last, axes, strict=True)]


def knob_label(cell: CellView, axes: list[str], text: Any) -> str:
    """A cell's legend entry by its knob values ('capacity_factor=1.25, dispatcher_sms=24'), its repeat
    appended when it is not the first; `text` formats a value."""
    shown = [f"{name}={text(cell.params[axis])}" for name, axis in zip(short_axis_names(axes), axes, strict=True)
             if axis in cell.params]  # fmt: skip
    base = ", ".join(shown) or cell.label or cell.cell_id
    return f"{base} (repeat {cell.repeat})" if cell.repeat else base
