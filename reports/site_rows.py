"""Rows of the report site's point table: a point's window figures (or its repeats' means), its memory (RSS on CPU
runs), its baseline and deltas, its memory estimate and headroom, and the link to each cell's page."""

from __future__ import annotations

from typing import Any

from reports.metrics import finite
from reports.site_data import SiteExtras, headroom, point_baseline, point_memory, relative
from reports.site_format import DASH, failed_messages, fmt_number, fmt_param, point_name, unchecked_messages
from reports.views import PointView


def value_attr(value: Any) -> str | None:
    """A sortable data-value attribute (None for a missing figure)."""
    return repr(float(value)) if finite(value) else None


def fmt_delta(change: float | None) -> str:
    return DASH if change is None else f"{change:+.1%}"


COUNTS = ("nan_iterations", "skipped_iterations")


def _getter(point: PointView) -> Any:
    several = len(point.repeats) > 1
    s = point.repeats[0].summary

    def get(name: str) -> Any:
        if several:
            values = [getattr(c.summary, name) for c in point.completed]
            return max(values, default=None) if name in COUNTS else point.mean(name)
        return getattr(s, name) if s is not None else None

    return get


def _memory_cell(point: PointView) -> tuple[str, str, str | None]:
    value, kind = point_memory(point)
    text = fmt_number(value, 2) + (" RSS" if kind == "rss" and value is not None else "")
    return "peak_alloc_gib", text, value_attr(value)


def _reserved(point: PointView, get: Any) -> tuple[str, str, str | None]:
    """Peak reserved GPU memory; a dash on a CPU run (the allocator reserved nothing, RSS is shown instead)."""
    if point_memory(point)[1] == "rss":
        return "peak_reserved_gib", DASH, None
    return "peak_reserved_gib", fmt_number(get("peak_reserved_gib"), 2), value_attr(get("peak_reserved_gib"))


def _baseline(point: PointView, get: Any, extras: SiteExtras) -> list[dict[str, Any]]:
    """Per baseline column: the baseline's figure and this point's relative change."""
    base = point_baseline(point, extras.baselines)
    out = []
    for name, digits in (("tflops_per_gpu", 1), ("step_time_ms", 1)):
        theirs = getattr(base, name) if base is not None else None
        change = relative(get(name), theirs)
        out.append({"name": name, "base": fmt_number(theirs, digits), "delta": fmt_delta(change),
                    "raw": value_attr(change)})  # fmt: skip
    return out


def _estimate(point: PointView, extras: SiteExtras, estimates: dict[str, dict[str, Any]]) -> dict[str, Any]:
    row = estimates.get(point.point_id)
    value, kind = point_memory(point)
    room = headroom(row, value, kind)
    est = row.get("estimate_gib") if row else None
    return {"estimate": fmt_number(est, 1), "estimate_raw": value_attr(est), "headroom": fmt_number(room, 1),
            "headroom_raw": value_attr(room), "infeasible": bool(row) and row.get("feasible") is False,  # type: ignore[union-attr]
            "reason": (row or {}).get("reason") or "", "gpu": (row or {}).get("gpu") or ""}  # fmt: skip


def point_row(point: PointView, axes: list[str], best: PointView | None, extras: SiteExtras,
              estimates: dict[str, dict[str, Any]], hrefs: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """A point's table row: its cell's figures (one repeat), or the means over its completed repeats (the
    worst for counts) with the repeats listed under its id."""
    several = len(point.repeats) > 1
    cell, get = point.repeats[0], _getter(point)
    s = cell.summary
    metrics = [
        ("step_time_ms", fmt_number(get("step_time_ms"), 1), value_attr(get("step_time_ms"))),
        ("tflops_per_gpu", fmt_number(get("tflops_per_gpu"), 1), value_attr(get("tflops_per_gpu"))),
        ("tokens_per_s_per_gpu", fmt_number(get("tokens_per_s_per_gpu"), 0), value_attr(get("tokens_per_s_per_gpu"))),
        _memory_cell(point),
        _reserved(point, get),
        ("first_loss", fmt_number(get("first_loss"), 4, thousands=False), value_attr(get("first_loss"))),
        ("last_loss", fmt_number(get("last_loss"), 4, thousands=False), value_attr(get("last_loss"))),
    ]  # fmt: skip
    metrics += [(n, DASH if get(n) is None else str(get(n)), value_attr(get(n))) for n in COUNTS]
    if several:
        window = f"mean of {len(point.completed)} completed repeat(s)"
    else:
        window = (f"steps {s.window_first_step}–{s.window_last_step} ({s.window_steps})"
                  if s is not None and s.window_steps else "no window")  # fmt: skip
    return {
        "point": point,
        "id": point_name(point),
        "cell": None if several else cell,
        "href": hrefs.get(cell.cell_id) if not several else None,
        "hrefs": hrefs,
        "state": point.state,
        "repeats": point.repeats if several else [],
        "repeat_count": point.repeat_count,
        "best": best is point,
        "params": [(axis, fmt_param(point.params[axis]) if axis in point.params else DASH) for axis in axes],
        "metrics": metrics,
        "text": {name: text for name, text, _ in metrics},
        "std": DASH if several else fmt_number(get("step_time_ms_std"), 1),
        "window": window,
        "verdict": point.verdict,
        "failed": failed_messages(point),
        "unchecked": unchecked_messages(point),
        "baseline": _baseline(point, get, extras) if extras.baselines else [],
        "estimate": _estimate(point, extras, estimates) if estimates else None,
    }
