"""Static, offline HTML report page for a campaign: summary table, plotly figures and environment fingerprints."""

from __future__ import annotations

import html
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reports.gates import CONFIDENCE
from reports.metrics import finite
from reports.views import CampaignView, CellView, PointView
from trainer import rundir

TEMPLATE_DIR = Path(__file__).parent / "templates"
PLOTLY_ASSET = "assets/plotly.min.js"

# Environment facts that must agree across cells for their numbers to compare: the run directory's one
# fingerprint key list, less the per-host and per-cell facts (hostname, GPU count), left out on purpose.
FINGERPRINT_KEYS: tuple[str, ...] = tuple(
    k for k in rundir.FINGERPRINT_KEYS if k not in ("hostname", "gpu_count")
)

# Trace colours, one per cell, the same in every figure.
_PALETTE = (
    "#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd #8c564b #e377c2 #7f7f7f #bcbd22 #17becf "
    "#393b79 #637939 #8c6d31 #843c39 #7b4173 #3182bd #e6550d #31a354 #756bb1 #636363"
).split()
_VERDICT_COLOURS = {"pass": "#2ca02c", "fail": "#d62728", "inconclusive": "#ff7f0e", "none": "#7f7f7f"}


# ---------------------------------------------------------------- formatting shared with markdown.py

DASH = "—"


def fmt_number(value: Any, digits: int = 1, thousands: bool = True) -> str:
    """A finite number with fixed decimals ('—' for None, NaN, inf or a non-number).

    Values too small to show at that precision (CPU-sized TFLOP/s) get 3 significant digits instead of 0.0.
    """
    if not finite(value):
        return DASH
    if value != 0 and abs(value) < 0.5 * 10**-digits:
        return f"{value:.3g}"
    return f"{value:,.{digits}f}" if thousands else f"{value:.{digits}f}"


def fmt_param(value: Any) -> str:
    """A swept value as the user wrote it: strings bare, everything else as JSON (true, null, 1.25)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):  # e.g. a circular structure
        return str(value)


def failed_messages(point: PointView) -> list[str]:
    """Messages of the checks the point failed (over all its repeats)."""
    return [c.message for c in point.gate.failed] if point.gate is not None else []


def unchecked_messages(point: PointView) -> list[str]:
    """Messages of the checks that could not decide (why a point's verdict is inconclusive)."""
    return [c.message for c in point.gate.unchecked] if point.gate is not None else []


def point_name(point: PointView) -> str:
    """A point of one repeat by its cell id, else by its point id."""
    return point.repeats[0].cell_id if len(point.repeats) == 1 else point.point_id


@dataclass
class FingerprintGroup:
    """Cells that ran under the same environment, compared on FINGERPRINT_KEYS."""

    values: dict[str, str]  # key → value as text ('—' where the cell did not record the key)
    cells: list[str] = field(default_factory=list)


def fingerprint_groups(
    cells: list[CellView], keys: tuple[str, ...] = FINGERPRINT_KEYS
) -> tuple[list[FingerprintGroup], list[str]]:
    """Distinct environments among cells that recorded one (first-seen order), and the compared keys.

    Only keys that at least one cell recorded are compared; a cell missing a key another cell has
    counts as a different environment.
    """
    recorded = [c for c in cells if c.fingerprint]
    present = [k for k in keys if any(k in (c.fingerprint or {}) for c in recorded)]
    groups: dict[tuple[str, ...], FingerprintGroup] = {}
    for cell in recorded:
        fp = cell.fingerprint or {}
        values = {k: (DASH if fp.get(k) is None else fmt_param(fp[k])) for k in present}
        signature = tuple(values[k] for k in present)
        groups.setdefault(signature, FingerprintGroup(values)).cells.append(cell.cell_id)
    return list(groups.values()), present


def differing_keys(groups: list[FingerprintGroup], keys: list[str]) -> list[str]:
    """Keys whose value is not the same in every group."""
    return [k for k in keys if len({g.values[k] for g in groups}) > 1]


# ---------------------------------------------------------------- figures


def _t(text: Any) -> str:
    """User text for a plotly label: plotly renders a few HTML tags in labels, so show them literally."""
    return html.escape(str(text), quote=False)


def _num(value: Any) -> float | None:
    return float(value) if finite(value) else None


def _is_numeric_axis(values: list[Any]) -> bool:
    return bool(values) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
    )


def _figure_json(fig: Any) -> str:
    """Figure JSON that is safe inside a <script> element (no '<', '>' or '&' left unescaped)."""
    text = fig.to_json()
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _layout(title: str, xtitle: str, ytitle: str, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title},
        "xaxis": {"title": {"text": xtitle}, **extra.pop("xaxis", {})},
        "yaxis": {"title": {"text": ytitle}, **extra.pop("yaxis", {})},
        "template": "plotly_white",
        "height": 420,
        "margin": {"l": 70, "r": 20, "t": 50, "b": 60},
        "legend": {"font": {"size": 11}},
        **extra,
    }


def _axis_figures(view: CampaignView, best: PointView | None) -> list[dict[str, Any]]:
    """TFLOP/s/GPU against each swept axis; one marker per cell (repeats separate), grouped by their point's
    verdict."""
    import plotly.graph_objects as go

    verdicts = {c.cell_id: p.verdict for p in view.points for c in p.repeats}

    def verdict_of(cell: CellView) -> str:
        return verdicts.get(cell.cell_id, "none")

    measured = [c for c in view.cells if c.summary is not None and finite(c.summary.tflops_per_gpu)]
    if not measured:
        return []
    axes = view.axes or []
    figures = []
    for index, axis in enumerate(axes or ["cell"]):
        if axis == "cell" and not axes:
            xs_all: list[Any] = [c.label or c.cell_id for c in measured]
        else:
            xs_all = [c.params.get(axis) for c in measured]
        numeric = _is_numeric_axis(xs_all)
        xs = xs_all if numeric else [_t(fmt_param(x)) for x in xs_all]
        order = list(dict.fromkeys(xs)) if not numeric else None
        fig = go.Figure()
        for verdict in ("pass", "inconclusive", "fail", "none"):
            members = [i for i, c in enumerate(measured) if verdict_of(c) == verdict]
            if not members:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[xs[i] for i in members],
                    y=[measured[i].summary.tflops_per_gpu for i in members],  # type: ignore[union-attr]
                    mode="markers",
                    name=verdict,
                    marker={"size": 11, "color": _VERDICT_COLOURS[verdict], "opacity": 0.85},
                    text=[
                        f"{_t(measured[i].cell_id)} (repeat {measured[i].repeat})<br>{_t(measured[i].label)}"
                        for i in members
                    ],
                    hovertemplate="%{text}<br>%{y:.1f} TFLOP/s/GPU<extra>%{fullData.name}</extra>",
                )
            )
        stars = [i for i, c in enumerate(measured) if best is not None and c in best.repeats]
        if stars:
            fig.add_trace(
                go.Scatter(
                    x=[xs[i] for i in stars],
                    y=[measured[i].summary.tflops_per_gpu for i in stars],  # type: ignore[union-attr]
                    mode="markers",
                    name="best",
                    marker={"size": 20, "symbol": "star-open", "color": "#111", "line": {"width": 2}},
                    hoverinfo="skip",
                )
            )
        xaxis: dict[str, Any] = (
            {"type": "linear"}
            if numeric
            else {
                "type": "category",
                "categoryorder": "array",
                "categoryarray": order,
            }
        )
        title = "TFLOP/s/GPU by cell" if not axes else f"TFLOP/s/GPU vs {axis}"
        fig.update_layout(_layout(_t(title), _t(axis) if axes else "cell", "TFLOP/s/GPU", xaxis=xaxis))
        figures.append({"id": f"fig-axis-{index}", "axis": axis, "title": title, "json": _figure_json(fig)})
    return figures


def _curve_figure(
    view: CampaignView, key: str, fig_id: str, title: str, ytitle: str, clip_first: bool = False
) -> dict[str, Any] | None:
    """One line per cell of `key` against the step; non-finite values leave gaps."""
    import plotly.graph_objects as go

    fig = go.Figure()
    tail: list[float] = []  # values after each cell's first step
    heads: list[float] = []  # each cell's first step
    for index, cell in enumerate(view.cells):
        by_step: dict[int, dict[str, Any]] = {}
        for row in cell.rows:
            if isinstance(row.get("step"), int) and not isinstance(row.get("step"), bool):
                by_step[row["step"]] = row
        steps = sorted(by_step)
        ys = [_num(by_step[s].get(key)) for s in steps]
        if not any(y is not None for y in ys):
            continue
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=ys,
                mode="lines+markers",
                name=_t(cell.cell_id),
                line={"color": _PALETTE[index % len(_PALETTE)], "width": 1.5},
                marker={"size": 4},
                meta=_t(cell.label),  # once per trace, not once per point
                hovertemplate="%{meta}<br>step %{x}: %{y:.4g}<extra>%{fullData.name}</extra>",
            )
        )
        tail.extend(y for y in ys[1:] if y is not None)
        heads.extend(y for y in ys[:1] if y is not None)
    if not fig.data:
        return None
    yaxis: dict[str, Any] = {}
    if clip_first and tail:
        # Each cell's first step (compile, warm-up) is often several times slower; scale to the rest.
        low, high = min(tail), max(tail)
        pad = max((high - low) * 0.15, abs(high) * 0.05)
        yaxis = {"range": [max(0.0, low - pad), high + pad]}
        if any(h > high + pad or h < low - pad for h in heads):
            title += " (first steps off scale)"
    fig.update_layout(_layout(title, "step", ytitle, yaxis=yaxis))
    return {"id": fig_id, "title": title, "json": _figure_json(fig)}


def _by_step(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float | None]]:
    """Steps and values of `key` (the last row of a step wins; non-finite values as None)."""
    by_step: dict[int, Any] = {}
    for row in rows:
        if isinstance(row.get("step"), int) and not isinstance(row.get("step"), bool):
            by_step[row["step"]] = row.get(key)
    steps = sorted(by_step)
    return steps, [_num(by_step[s]) for s in steps]


def _grad_norm_figure(view: CampaignView) -> dict[str, Any] | None:
    """Grad norm per step, one line per cell, each spike (reports/numerics.py) marked with what preceded it."""
    import plotly.graph_objects as go

    from reports.numerics import grad_norm_spikes

    fig = go.Figure()
    marks: list[tuple[int, float, str]] = []
    for index, cell in enumerate(view.cells):
        steps, ys = _by_step(cell.rows, "grad_norm")
        if not any(y is not None for y in ys):
            continue
        colour = _PALETTE[index % len(_PALETTE)]
        fig.add_trace(go.Scatter(x=steps, y=ys, mode="lines", name=_t(cell.cell_id), line={"color": colour, "width": 1.5},
                                 meta=_t(cell.label), hovertemplate="%{meta}<br>step %{x}: %{y:.4g}<extra>%{fullData.name}</extra>"))  # fmt: skip
        for spike in grad_norm_spikes(cell.rows):
            after = f", after {'; '.join(spike.preceded_by)}" if spike.preceded_by else ""
            marks.append(
                (
                    spike.step,
                    spike.value,
                    _t(f"{cell.cell_id}: spike at step {spike.step} (z {spike.score:.3g}{after})"),
                )
            )
    if not fig.data:
        return None
    if marks:
        fig.add_trace(go.Scatter(x=[m[0] for m in marks], y=[m[1] for m in marks], mode="markers", name="spike",
                                 marker={"symbol": "x", "size": 12, "color": "#d62728"}, text=[m[2] for m in marks],
                                 hovertemplate="%{text}<extra></extra>"))  # fmt: skip
    title = f"Grad norm per step ({len(marks)} spike(s) marked)"
    fig.update_layout(_layout(title, "step", "grad norm"))
    return {"id": "fig-grad-norm", "title": title, "json": _figure_json(fig), "spikes": len(marks)}


PARITY_FIGURES_MAX = 12  # overlaid-curve figures of parity pairs (failed pairs first)


def _parity_figures(view: CampaignView) -> list[dict[str, Any]]:
    """Per pair: the off and on loss curves overlaid, and their differences (loss, grad norm) on a second axis."""
    import plotly.graph_objects as go

    rows = {c.cell_id: c.rows for c in view.cells}
    order = {"fail": 0, "inconclusive": 1, "pass": 2}
    pairs = sorted(view.parity, key=lambda p: order.get(p["verdict"], 3))[:PARITY_FIGURES_MAX]
    figures = []
    for index, pair in enumerate(pairs):
        off, on = rows.get(pair.get("off_cell") or "", []), rows.get(pair.get("on_cell") or "", [])
        if not off or not on:
            continue
        fig = go.Figure()
        for side, side_rows, dash in (("off", off, "solid"), ("on", on, "dot")):
            steps, ys = _by_step(side_rows, "loss")
            fig.add_trace(
                go.Scatter(
                    x=steps, y=ys, mode="lines", name=f"loss {side}", line={"dash": dash, "width": 1.5}
                )
            )
        for metric, colour in (("loss", "#d62728"), ("grad_norm", "#9467bd")):
            a, b = (
                dict(zip(*_by_step(off, metric), strict=True)),
                dict(zip(*_by_step(on, metric), strict=True)),
            )
            common = [s for s in sorted(set(a) & set(b)) if a[s] is not None and b[s] is not None]
            fig.add_trace(go.Scatter(x=common, y=[b[s] - a[s] for s in common], mode="lines", yaxis="y2",  # type: ignore[operator]
                                     name=f"Δ {metric} (on − off)", line={"color": colour, "width": 1}))  # fmt: skip
        title = f"{pair['verdict']}: {pair['title']} [{pair['label']}]"
        fig.update_layout(
            _layout(
                _t(title),
                "step",
                "loss",
                yaxis2={"title": {"text": "on − off"}, "overlaying": "y", "side": "right"},
            )
        )
        figures.append(
            {
                "id": f"fig-parity-{index}",
                "title": title,
                "verdict": pair["verdict"],
                "json": _figure_json(fig),
            }
        )
    return figures


def _tolerance_text(tol: dict[str, Any] | None) -> str:
    """A metric's tolerance in words: bitwise, or its bands and whether growth fails it."""
    if not tol:
        return ""
    if tol.get("exact"):
        return "bitwise"
    parts = [f"{k} {tol[k]:g}" for k in ("max_abs", "max_rel") if tol.get(k) is not None]
    return " or ".join(parts) + (", no growth" if tol.get("trend") else "")


def parity_rows(view: CampaignView) -> tuple[list[str], list[dict[str, Any]]]:
    """The toggle matrix: metric columns and one row per pair, each cell a verdict with its max difference, the
    first step the tolerance was exceeded and the tolerance (also used by markdown.py)."""
    columns = list(dict.fromkeys(m["metric"] for p in view.parity for m in p.get("metrics", [])))
    table = []
    for pair in view.parity:
        by_metric = {m["metric"]: m for m in pair.get("metrics", [])}
        cells = []
        for metric in columns:
            m = by_metric.get(metric)
            if m is None:
                cells.append(
                    {
                        "metric": metric,
                        "verdict": "none",
                        "text": DASH,
                        "title": "not compared",
                        "tolerance": "",
                    }
                )
                continue
            parts = [] if m["max_abs"] is None else [f"max |Δ| {m['max_abs']:.3g}"]
            if m.get("first_exceeded") is not None:
                parts.append(f"from step {m['first_exceeded']}")
            tolerance = _tolerance_text((pair.get("tolerances") or {}).get(metric))
            cells.append({"metric": metric, "verdict": m["verdict"], "text": ", ".join(parts) or DASH,
                          "title": m["reason"], "tolerance": tolerance})  # fmt: skip
        table.append({"pair": pair, "cells": cells})
    return columns, table


# ---------------------------------------------------------------- table rows


def _value_attr(value: Any) -> str | None:
    return repr(float(value)) if finite(value) else None


_COUNTS = ("nan_iterations", "skipped_iterations")


def _row(point: PointView, axes: list[str], best: PointView | None) -> dict[str, Any]:
    """A point's table row: its cell's figures (one repeat), or the means over its completed repeats (the
    worst for counts) with the repeats listed under its id."""
    several = len(point.repeats) > 1
    cell = point.repeats[0]
    s = cell.summary

    def get(name: str) -> Any:
        if several:
            values = [getattr(c.summary, name) for c in point.completed]
            return max(values, default=None) if name in _COUNTS else point.mean(name)
        return getattr(s, name) if s is not None else None

    metrics = [
        ("step_time_ms", fmt_number(get("step_time_ms"), 1)),
        ("tflops_per_gpu", fmt_number(get("tflops_per_gpu"), 1)),
        ("tokens_per_s_per_gpu", fmt_number(get("tokens_per_s_per_gpu"), 0)),
        ("peak_alloc_gib", fmt_number(get("peak_alloc_gib"), 2)),
        ("peak_reserved_gib", fmt_number(get("peak_reserved_gib"), 2)),
        ("first_loss", fmt_number(get("first_loss"), 4, thousands=False)),
        ("last_loss", fmt_number(get("last_loss"), 4, thousands=False)),
        ("nan_iterations", DASH if get("nan_iterations") is None else str(get("nan_iterations"))),
        ("skipped_iterations", DASH if get("skipped_iterations") is None else str(get("skipped_iterations"))),
    ]
    if several:
        window = f"mean of {len(point.completed)} completed repeat(s)"
    else:
        window = (f"steps {s.window_first_step}–{s.window_last_step} ({s.window_steps})"
                  if s is not None and s.window_steps else "no window")  # fmt: skip
    return {
        "point": point,
        "id": point_name(point),
        "cell": None if several else cell,
        "state": point.state,
        "repeats": point.repeats if several else [],
        "repeat_count": point.repeat_count,
        "best": best is point,
        "params": [(axis, fmt_param(point.params[axis]) if axis in point.params else DASH) for axis in axes],
        "metrics": [(name, text, _value_attr(get(name))) for name, text in metrics],
        "text": dict(metrics),
        "std": DASH if several else fmt_number(get("step_time_ms_std"), 1),
        "window": window,
        "verdict": point.verdict,
        "failed": failed_messages(point),
        "unchecked": unchecked_messages(point),
    }


# ---------------------------------------------------------------- page


def _environment() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_report(view: CampaignView, plotly_src: str = PLOTLY_ASSET) -> str:
    """The report page as HTML text; `plotly_src` is where the page loads plotly.js from (relative path)."""
    best = view.best_point()
    groups, fp_keys = fingerprint_groups(view.cells)
    states: dict[str, int] = {}
    verdicts: dict[str, int] = {}
    for cell in view.cells:
        states[cell.state] = states.get(cell.state, 0) + 1
    for point in view.points:
        verdicts[point.verdict] = verdicts.get(point.verdict, 0) + 1
    figures_axes = _axis_figures(view, best)
    parity_columns, parity_table = parity_rows(view)
    curves = [
        f
        for f in (
            _curve_figure(
                view, "step_time_ms", "fig-step-time", "Step time per step", "step time (ms)", True
            ),
            _curve_figure(view, "loss", "fig-loss", "Training loss per step", "loss"),
            _grad_norm_figure(view) if "grad_norm_spikes_max" in view.gates or view.parity else None,
        )
        if f is not None
    ]
    context = {
        "view": view,
        "generated_at": view.generated_at or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gates": [(k, fmt_param(v)) for k, v in view.gates.items()],
        "rows": [_row(p, view.axes, best) for p in view.points],
        "best": _row(best, view.axes, best) if best is not None else None,
        "completed": states.get("completed", 0),
        "states": sorted(states.items()),
        "verdicts": sorted(verdicts.items()),
        "axis_figures": figures_axes,
        "curve_figures": curves,
        "fp_groups": groups,
        "fp_keys": fp_keys,
        "fp_differs": differing_keys(groups, fp_keys),
        "fp_missing": [c.cell_id for c in view.cells if not c.fingerprint and c.state != "pending"],
        "plotly_src": plotly_src,
        "fmt_number": fmt_number,
        "confidence": f"{CONFIDENCE:.0%}",
        "damaged": [c for c in view.cells if c.damaged],
        "parity_columns": parity_columns,
        "parity_rows": parity_table,
        "parity_figures": _parity_figures(view) if view.parity else [],
    }
    return _environment().get_template("report.html.j2").render(**context)


def _plotly_js_source() -> Path | None:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


def write_plotly_asset(out_dir: Path) -> Path:
    """Copy the installed plotly package's plotly.min.js to out_dir/assets/ so the page works offline."""
    target = Path(out_dir) / PLOTLY_ASSET
    target.parent.mkdir(parents=True, exist_ok=True)
    source = _plotly_js_source()
    if source is not None:
        src, dst = source.stat(), target.stat() if target.is_file() else None
        if dst is None or (dst.st_size, dst.st_mtime_ns) != (src.st_size, src.st_mtime_ns):
            _atomic_copy(source, target)  # keeps the mtime: an unchanged asset is not copied again
    else:
        from plotly.offline import get_plotlyjs

        _atomic_write(target, get_plotlyjs())
    return target


def _atomic_copy(source: Path, target: Path) -> None:
    """copy2 through a temporary file: a full disk leaves the old asset (or none), never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        shutil.copy2(source, tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as handle:  # lone surrogates
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(view: CampaignView, out_dir: Path, extra: dict[str, str] | None = None) -> Path:
    """Write out_dir/index.html, out_dir/assets/plotly.min.js and the `extra` files (name → text), each whole
    or not at all; returns the page's path. OSError (full disk, a path of the wrong kind) goes to the caller."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_plotly_asset(out_dir)
    page = out_dir / "index.html"
    _atomic_write(page, render_report(view))
    for name, text in (extra or {}).items():
        _atomic_write(out_dir / name, text)
    return page
