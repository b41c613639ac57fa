"""The plots: the TFLOP/s heatmap of two swept axes, TFLOP/s against peak memory (the Pareto front), throughput
by swept axis and the per-step curves (a search's: its trials, each with its run length)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from reports import site_figures
from reports.index_data import IndexPage
from reports.index_sections import Section, register
from reports.metrics import finite
from reports.site_data import knob_label, short_axis_names
from reports.site_figures import axis_kind, figure, grad_norm_figure, layout, spike_marks, t
from reports.site_format import fmt_param
from reports.views import CampaignView, CellView, PointView

AXIS_MARKERS_MAX = 300  # cells drawn one marker each in the TFLOP/s-by-axis figures; more: a box per value
CURVE_CELLS_MAX = 20  # cells drawn in the index's per-step figures (every cell's curves are on its own page)

_VERDICT_COLOURS = {"pass": "#2ca02c", "fail": "#d62728", "inconclusive": "#ff7f0e", "none": "#7f7f7f"}


def _axis_figures(view: CampaignView, best: PointView | None, lengths: dict[str, int] | None = None,
                  full: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """TFLOP/s/GPU against each swept axis (discrete knobs as categories); one marker per cell (repeats
    separate), grouped by their point's verdict; a search's trials (`lengths`: point id → run length) each say
    their run length, runs shorter than its full length (`full`) as open markers."""
    verdicts = {c.cell_id: p.verdict for p in view.points for c in p.repeats}

    def steps(cell: CellView) -> str:
        n = (lengths or {}).get(cell.point_id)
        return "" if n is None else f" · {n} steps" + (" (full length)" if n == full else "")

    def symbol(cell: CellView) -> str:
        n = (lengths or {}).get(cell.point_id)
        return "circle" if n is None or n == full else "circle-open"

    measured = [c for c in view.cells if c.summary is not None and finite(c.summary.tflops_per_gpu)]
    if not measured:
        return []
    axes = view.axes or []
    figures = []
    for index, axis in enumerate(axes or ["cell"]):
        raw = [c.label or c.cell_id for c in measured] if not axes else [c.params.get(axis) for c in measured]
        categorical, order = axis_kind(raw)
        xs = [t(fmt_param(x)) for x in raw] if categorical else raw
        data: list[dict[str, Any]] = []
        for verdict in ("pass", "inconclusive", "fail", "none"):
            members = [i for i, c in enumerate(measured) if verdicts.get(c.cell_id, "none") == verdict]
            if members and len(measured) > AXIS_MARKERS_MAX:  # a box per axis value: a few shapes, not 1000s
                data.append({"type": "box", "name": verdict, "x": [xs[i] for i in members], "boxpoints": False,
                             "y": [measured[i].summary.tflops_per_gpu for i in members],  # type: ignore[union-attr]
                             "marker": {"color": _VERDICT_COLOURS[verdict]}})  # fmt: skip
            elif members:
                data.append({"type": "scatter", "mode": "markers", "name": verdict, "x": [xs[i] for i in members],
                             "y": [measured[i].summary.tflops_per_gpu for i in members],  # type: ignore[union-attr]
                             "marker": {"size": 11, "color": _VERDICT_COLOURS[verdict], "opacity": 0.85,
                                        "symbol": [symbol(measured[i]) for i in members]},
                             "text": [f"{t(measured[i].cell_id)} (repeat {measured[i].repeat}{steps(measured[i])})<br>"
                                      f"{t(measured[i].label)}" for i in members],
                             "hovertemplate": "%{text}<br>%{y:.1f} TFLOP/s/GPU<extra>%{fullData.name}</extra>"})  # fmt: skip
        stars = [i for i, c in enumerate(measured) if best is not None and c in best.repeats]
        if stars:
            data.append({"type": "scatter", "mode": "markers", "name": "best", "x": [xs[i] for i in stars],
                         "y": [measured[i].summary.tflops_per_gpu for i in stars],  # type: ignore[union-attr]
                         "marker": {"size": 20, "symbol": "star-open", "color": "#111", "line": {"width": 2}},
                         "hoverinfo": "skip"})  # fmt: skip
        xaxis: dict[str, Any] = {"type": "linear"}
        if categorical:
            xaxis = {
                "type": "category",
                "categoryorder": "array",
                "categoryarray": [t(fmt_param(x)) for x in order],
            }
        title = "TFLOP/s/GPU by cell" if not axes else f"TFLOP/s/GPU vs {axis}"
        fig_layout = layout(t(title), t(axis) if axes else "cell", "TFLOP/s/GPU", xaxis=xaxis)
        figures.append(figure(f"fig-axis-{index}", title, data, fig_layout, axis=axis))
    return figures


def index_cells(view: CampaignView, best: PointView | None) -> list[CellView]:
    """The cells drawn in the index's per-step figures: all of them, or the best point's and the fastest up to
    CURVE_CELLS_MAX (each cell's page draws its own)."""
    with_rows = [c for c in view.cells if c.rows]
    if len(with_rows) <= CURVE_CELLS_MAX:
        return with_rows
    first = [c for c in with_rows if best is not None and c in best.repeats]
    speed = sorted(
        with_rows,
        key=lambda c: (
            -(c.summary.tflops_per_gpu or 0.0) if c.summary and finite(c.summary.tflops_per_gpu) else 0.0
        ),
    )
    chosen = set(list(dict.fromkeys(c.cell_id for c in first + speed))[:CURVE_CELLS_MAX])
    return [c for c in with_rows if c.cell_id in chosen]


def searched(view: CampaignView, shown: frozenset[str]) -> CampaignView:
    """The view with only the points (and their cells) a search's figures show."""
    points = [p for p in view.points if p.point_id in shown]
    cells = [c for c in view.cells if c.point_id in shown]
    return replace(view, cells=cells, points=points)


def curve_note(view: CampaignView, figured: CampaignView, shown: list[CellView]) -> str:
    """What the index's per-step figures leave out (every cell's curves are on its own page)."""
    if figured is not view:
        return (f"{len(shown)} of {len(view.cells)} cells drawn: the search's full-length trials (its shorter rungs "
                "are in the trials table); every cell's curves are on its page")  # fmt: skip
    if len(shown) < len([c for c in view.cells if c.rows]):
        return f"{len(shown)} of {len(view.cells)} cells drawn (the best and the fastest); every cell's curves are on its page"
    return ""


@register
class Plots(Section):
    name = "plots"
    order = 70
    nav = "Plots"

    def context(self, page: IndexPage) -> dict[str, Any]:
        view, best, scope = page.view, page.best, page.scope
        names = {c.cell_id: knob_label(c, view.axes, fmt_param) for c in view.cells}
        point_names = {p.point_id: names[p.repeats[0].cell_id].split(" (repeat")[0] for p in view.points}
        # judged on one figure (heatmap, curves): full length only; the search's plots: every trial
        figured = view if scope is None else searched(view, scope.shown)
        every = view if scope is None else searched(view, frozenset(scope.lengths))
        shown = index_cells(figured, best)
        grad = grad_norm_figure(shown, names, spike_marks(view))
        curves = site_figures.curves(shown, names)
        curves[2:2] = [grad] if grad is not None else []
        pareto = site_figures.pareto(every.points, point_names, best, None if scope is None else scope.front,
                                     None if scope is None else scope.lengths,
                                     frozenset() if scope is None else scope.memory_front,
                                     None if scope is None else scope.full)  # fmt: skip
        heat = site_figures.heatmap_data(figured.points, view.axes, fmt_param)
        return {
            "view": view, "heatmap": heat, "heatmap_json": site_figures.safe_json(heat) if heat else "",
            "pareto": pareto, "short_axes": short_axis_names(view.axes),
            "axis_figures": _axis_figures(every, best, *((scope.lengths, scope.full) if scope else (None, 0))),
            "curve_figures": curves, "curve_note": curve_note(view, figured, shown),
        }  # fmt: skip
