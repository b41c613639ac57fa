"""The figure of a parity pair: the off and on loss curves, then one row per compared metric with its gap (on − off)
inside the tolerance band it is judged against, the first step outside it and the eval steps marked; and the rows
of the toggle matrix (the page's and the Markdown summary's)."""

from __future__ import annotations

from typing import Any

from reports.site_figures import eval_marks, eval_steps, figure, layout, series, t
from reports.site_format import DASH
from reports.views import CampaignView

PARITY_FIGURES_MAX = 12  # figures of parity pairs (failed pairs first)
ROW_PX = 150  # the plot height of each row (the loss curves, then a gap per metric)
GAP = 0.08  # between rows, as a fraction of the plot area
BAND = "rgba(44, 160, 44, 0.18)"
GAP_COLOURS = ("#6f42c1", "#0a7d74", "#8c564b", "#e377c2")


def band(tol: dict[str, Any] | None, off: dict[int, float | None], steps: list[int]) -> list[float] | None:
    """The half-width of the tolerance band at each step: max_abs, or max_rel × |off| (either suffices, as
    reports.numerics.curve_gap judges); None when the metric is judged bitwise (no band) or has no tolerance."""
    if not tol or tol.get("exact"):
        return None
    absolute, relative = float(tol.get("max_abs") or 0.0), float(tol.get("max_rel") or 0.0)
    return [max(absolute, relative * abs(off[s] or 0.0)) for s in steps]


def _gap_row(metric: str, tol: dict[str, Any] | None, off_rows: list[dict[str, Any]], on_rows: list[dict[str, Any]],
             axis: str, colour: str) -> tuple[list[dict[str, Any]], int]:  # fmt: skip
    """The traces of one metric's row: the band (a filled shape between −tol and +tol) and the gap."""
    a, b = dict(zip(*series(off_rows, metric), strict=True)), dict(zip(*series(on_rows, metric), strict=True))
    common = [s for s in sorted(set(a) & set(b)) if a[s] is not None and b[s] is not None]
    if not common:
        return [], 0
    traces: list[dict[str, Any]] = []
    half = band(tol, a, common)
    if half is not None:
        traces += [
            {"type": "scatter", "x": common, "y": half, "yaxis": axis, "mode": "lines", "line": {"width": 0},
             "legendgroup": "band", "showlegend": False, "hoverinfo": "skip"},
            {"type": "scatter", "x": common, "y": [-h for h in half], "yaxis": axis, "mode": "lines",
             "line": {"width": 0}, "fill": "tonexty", "fillcolor": BAND, "name": "tolerance band",
             "legendgroup": "band", "showlegend": False, "meta": metric,
             "hovertemplate": "step %{x}: ±%{customdata:.3g}<extra>tolerance</extra>", "customdata": half},
        ]  # fmt: skip
    sparse = len(common) < 12
    traces.append({"type": "scatter", "x": common, "y": [b[s] - a[s] for s in common], "yaxis": axis,  # type: ignore[operator]
                   "mode": "lines+markers" if sparse else "lines", "name": f"Δ {metric}", "showlegend": False,
                   "line": {"color": colour, "width": 1.5}, "marker": {"size": 5}, "meta": metric,
                   "hovertemplate": "step %{x}: Δ %{y:.3g}<extra>" + t(metric) + "</extra>"})  # fmt: skip
    return traces, len(common)


def pair_figure(pair: dict[str, Any], off: list[dict[str, Any]], on: list[dict[str, Any]], fig_id: str) -> dict[str, Any]:
    """One pair: row 1 the loss of each side; then per compared metric its gap in its band, one axis each."""
    data: list[dict[str, Any]] = []
    for side, side_rows, dash in (("off", off, "solid"), ("on", on, "dot")):
        steps, ys = series(side_rows, "loss")
        data.append({"type": "scatter", "x": steps, "y": ys, "mode": "lines", "name": f"loss {side}",
                     "line": {"dash": dash, "width": 1.5}, "meta": "loss"})  # fmt: skip
    tolerances = pair.get("tolerances") or {}
    firsts: list[dict[str, Any]] = []
    titles: list[str] = []
    for m in pair.get("metrics", []):
        axis = f"y{len(titles) + 2}"
        traces, steps = _gap_row(m["metric"], tolerances.get(m["metric"]), off, on, axis, GAP_COLOURS[len(titles) % 4])
        if not steps or len(titles) == len(GAP_COLOURS):
            continue
        data += traces
        exact = (tolerances.get(m["metric"]) or {}).get("exact")
        titles.append(f"Δ {m['metric']}" + (" (bitwise)" if exact else ""))
        if m.get("first_exceeded") is not None:
            firsts.append({"type": "line", "xref": "x", "yref": f"{axis} domain", "x0": m["first_exceeded"],
                           "x1": m["first_exceeded"], "y0": 0, "y1": 1, "line": {"color": "#cf222e", "width": 2}, "layer": "above",
                           "name": "first step outside", "legendgroup": "first", "showlegend": not firsts})  # fmt: skip
    shown = next((d for d in data if d.get("name") == "tolerance band"), None)
    if shown is not None:
        shown["showlegend"] = True  # one legend entry for the bands of every row
    rows = 1 + len(titles)
    height = (1.0 - GAP * (rows - 1)) / rows
    domains = [(1.0 - (i + 1) * height - i * GAP, 1.0 - i * height - i * GAP) for i in range(rows)]
    axes: dict[str, Any] = {f"yaxis{i + 2}": {"title": {"text": t(title), "font": {"size": 12}}, "anchor": "x",
                                              "domain": [max(0.0, domains[i + 1][0]), domains[i + 1][1]],
                                              "zeroline": True, "automargin": True}
                            for i, title in enumerate(titles)}  # fmt: skip
    title = f"{pair['verdict']}: {pair['title']} [{pair['label']}]"
    fig_layout = layout(t(title), "step", "loss", plot_px=ROW_PX * rows, xaxis={"anchor": f"y{rows}" if rows > 1 else "y"},
                        yaxis={"domain": [domains[0][0], 1.0], "title": {"text": "loss", "font": {"size": 12}}},
                        shapes=eval_marks(eval_steps(off, on), rows) + firsts, **axes)  # fmt: skip
    return figure(fig_id, title, data, fig_layout, verdict=pair["verdict"], rows=rows)


def parity_figures(view: CampaignView) -> list[dict[str, Any]]:
    """A figure per pair with both sides' rows, failed pairs first."""
    rows = {c.cell_id: c.rows for c in view.cells}
    order = {"fail": 0, "inconclusive": 1, "pass": 2}
    pairs = sorted(view.parity, key=lambda p: order.get(p["verdict"], 3))[:PARITY_FIGURES_MAX]
    figures = []
    for index, pair in enumerate(pairs):
        off, on = rows.get(pair.get("off_cell") or "", []), rows.get(pair.get("on_cell") or "", [])
        if off and on:
            figures.append(pair_figure(pair, off, on, f"fig-parity-{index}"))
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
