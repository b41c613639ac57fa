"""Rows of the report site's point table: a point's window figures (or its repeats' means), its memory (RSS on CPU
runs), its baseline and deltas, its memory estimate and headroom, and the link to each cell's page."""

from __future__ import annotations

from typing import Any

from reports.metrics import finite
from reports.site_data import SiteExtras, headroom, point_baseline, point_memory, relative, short_axis_names
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


# ---------------------------------------------------------------- the search's trials

OBJECTIVES = {"tflops_per_gpu": ("TFLOP/s/GPU", 1), "step_time_ms": ("step ms", 1),
              "tokens_per_s_per_gpu": ("tokens/s/GPU", 0)}  # fmt: skip
SHOWN_ELSEWHERE = {"key", "label", "params", "method", "objective_metric", "cell_ids", "best", "pareto", "decision",
                   "point_id", "objective", "peak_gib", "loss", "cost_steps", "gpu_hours", "verdict", "reason",
                   "trial", "rung", "steps", "state", "pareto_by", "search_outcome"}  # fmt: skip


def _cell(col: str, text: str, raw: Any = None, num: bool = False, **more: Any) -> dict[str, Any]:
    """One cell of the trials table: its text, and for a number (`num`: right-aligned) its sortable value."""
    return {"col": col, "text": text, "raw": value_attr(raw), "num": num, "href": None, "code": False,
            "badge": False, "marks": [], **more}  # fmt: skip


def _versus(decision: dict[str, Any] | None) -> str:
    """The trial against the leader of its rung: change, interval and verdict ('−12.7% [−13.0%, −12.3%] UNKNOWN')."""
    if not decision or not finite(decision.get("change")):
        return DASH
    low, high = decision.get("ci_low"), decision.get("ci_high")
    ci = f" [{low:+.1%}, {high:+.1%}]" if finite(low) and finite(high) else ""
    return f"{decision['change']:+.1%}{ci} {str(decision.get('decision') or '').upper()}".strip()


def trial_table(rows: list[dict[str, Any]], hrefs: dict[str, str]) -> dict[str, Any]:
    """The search's trials as a table: one column per swept knob (short names), numbers formatted and sortable,
    the trial against its rung's leader in words, the best and the Pareto trials flagged; `hrefs` maps point ids
    to their cell pages."""
    knobs = list(dict.fromkeys(k for r in rows for k in (r.get("params") or {})))
    metric = next((r.get("objective_metric") for r in rows if r.get("objective_metric")), "tflops_per_gpu")
    objective, digits = OBJECTIVES.get(metric, (metric, 2))
    extra = list(dict.fromkeys(k for r in rows for k in r if k not in SHOWN_ELSEWHERE))
    headers = (["trial", "rung", "steps"] + short_axis_names(knobs) + ["state", objective, "vs leader", "peak GiB",
               "last loss", "verdict", "point", "cost (steps)", "GPU-h", *extra, "why"])  # fmt: skip
    out = []
    for r in rows:
        params, point = r.get("params") or {}, r.get("point_id")
        front = ("Pareto (memory, shorter run)" if r.get("pareto_by") == "memory" else "Pareto") if r.get("pareto") else ""
        marks = (["★ best"] if r.get("best") else []) + ([front] if front else [])
        cells = [_cell("trial", str(r.get("trial", DASH)), r.get("trial"), num=True),
                 _cell("rung", str(r.get("rung", DASH)), r.get("rung"), num=True),
                 _cell("steps", str(r.get("steps", DASH)), r.get("steps"), num=True),
                 *[_cell("param", fmt_param(params[k]) if k in params else DASH) for k in knobs],
                 _cell("state", str(r.get("state") or DASH)),
                 _cell("objective", fmt_number(r.get("objective"), digits), r.get("objective"), num=True),
                 _cell("versus", _versus(r.get("decision")), (r.get("decision") or {}).get("change"), num=True),
                 _cell("peak_gib", fmt_number(r.get("peak_gib"), 2), r.get("peak_gib"), num=True),
                 _cell("loss", fmt_number(r.get("loss"), 4, thousands=False), r.get("loss"), num=True),
                 _cell("verdict", str(r.get("verdict") or "none"), badge=True),
                 _cell("point", point or DASH, href=hrefs.get(point or ""), code=bool(point), marks=marks),
                 _cell("cost_steps", fmt_number(r.get("cost_steps"), 0), r.get("cost_steps"), num=True),
                 _cell("gpu_hours", fmt_number(r.get("gpu_hours"), 2), r.get("gpu_hours"), num=True),
                 *[_cell(k, DASH if r.get(k) is None else fmt_param(r.get(k))) for k in extra],
                 _cell("reason", str(r.get("reason") or DASH))]  # fmt: skip
        out.append({"cells": cells, "best": bool(r.get("best")), "pareto": bool(r.get("pareto")),
                    "state": str(r.get("state") or "")})  # fmt: skip
    method = next((r.get("method") for r in rows if r.get("method")), "")
    keys = ["trial", "rung", "steps", *(["param"] * len(knobs)), "state", "objective", "versus", "peak_gib", "loss",
            "verdict", "point", "cost_steps", "gpu_hours", *extra, "reason"]  # fmt: skip
    return {"columns": list(zip(keys, headers, strict=True)), "rows": out, "method": method, "objective": objective}
