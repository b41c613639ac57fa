"""Static, offline HTML report page for a campaign: summary table, plotly figures and environment fingerprints."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reports import site_figures
from reports.gates import CONFIDENCE
from reports.metrics import finite
from reports.parity_figures import parity_figures
from reports.site_data import SiteExtras, estimate_index, knob_label, search_scope, short_axis_names
from reports.site_figures import PALETTE, axis_kind, figure, layout, series, t
from reports.site_format import (
    DASH,
    TEMPLATE_DIR,
    atomic_copy,
    atomic_write,
    code_spans,
    environment,
    failed_messages,
    fmt_number,
    fmt_param,
    point_name,
    unchecked_messages,
)
from reports.site_rows import point_row, trial_table
from reports.views import CampaignView, CellView, PointView
from trainer import rundir

__all__ = ["DASH", "failed_messages", "fmt_number", "fmt_param", "point_name", "unchecked_messages"]
PLOTLY_ASSET = "assets/plotly.min.js"

# Environment facts that must agree across cells for their numbers to compare: the run directory's one
# fingerprint key list, less the per-host and per-cell facts (hostname, GPU count), left out on purpose.
FINGERPRINT_KEYS: tuple[str, ...] = tuple(
    k for k in rundir.FINGERPRINT_KEYS if k not in ("hostname", "gpu_count")
)

_VERDICT_COLOURS = {"pass": "#2ca02c", "fail": "#d62728", "inconclusive": "#ff7f0e", "none": "#7f7f7f"}


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

AXIS_MARKERS_MAX = 300  # cells drawn one marker each in the TFLOP/s-by-axis figures; more: a box per value
EAGER_ROWS = 100  # table rows laid out with the page; the rest join it from a <template> once it has loaded
CURVE_CELLS_MAX = 20  # cells drawn in the index's per-step figures (every cell's curves are on its own page)


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


def grad_norm_figure(
    cells: list[CellView], names: dict[str, str], spikes: bool = True, fig_id: str = "fig-grad-norm"
) -> dict[str, Any] | None:
    """Grad norm per step, one line per cell; with `spikes`, each spike (reports/numerics.py) marked with what
    preceded it (the search costs ~0.2 s per 100 steps: done where the campaign gates on spikes or has parity)."""
    from reports.numerics import grad_norm_spikes

    data: list[dict[str, Any]] = []
    marks: list[tuple[int, float, str]] = []
    for index, cell in enumerate(cells):
        steps, ys = series(cell.rows, "grad_norm")
        if not any(y is not None for y in ys):
            continue
        data.append({"type": "scatter", "x": steps, "y": ys, "mode": "lines", "name": t(names.get(cell.cell_id, cell.cell_id)),
                     "line": {"color": PALETTE[index % len(PALETTE)], "width": 1.5}, "meta": t(cell.cell_id),
                     "hovertemplate": "%{meta}<br>step %{x}: %{y:.4g}<extra>%{fullData.name}</extra>"})  # fmt: skip
        for spike in grad_norm_spikes(cell.rows) if spikes else []:
            after = f", after {'; '.join(spike.preceded_by)}" if spike.preceded_by else ""
            marks.append(
                (
                    spike.step,
                    spike.value,
                    t(f"{cell.cell_id}: spike at step {spike.step} (z {spike.score:.3g}{after})"),
                )
            )
    if not data:
        return None
    if marks:
        data.append({"type": "scatter", "x": [m[0] for m in marks], "y": [m[1] for m in marks], "mode": "markers",
                     "name": "spike", "marker": {"symbol": "x", "size": 12, "color": "#d62728"},
                     "text": [m[2] for m in marks], "hovertemplate": "%{text}<extra></extra>"})  # fmt: skip
    title = f"Grad norm per step ({len(marks)} spike(s) marked)" if spikes else "Grad norm per step"
    return figure(fig_id, title, data, layout(title, "step", "grad norm"), spikes=len(marks))


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


# ---------------------------------------------------------------- page

SITE_ASSETS = ("site.js", "site.css")  # copied from templates/ to assets/ beside plotly


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


def pick_best(view: CampaignView, extras: SiteExtras) -> tuple[PointView | None, str]:
    """The best point and how it was picked: the verdicts' winner (orchestrator/judge/best.py, as mbx freeze and the
    search pick it) when given; none when the orchestrator said why there is none (a tie no figure separates,
    nothing eligible); the highest mean only for a page rendered without the orchestrator's pick."""
    if extras.winner is not None:
        chosen = next((p for p in view.points if p.point_id == extras.winner), None)
        if chosen is not None:
            return chosen, extras.how or "picked by the verdicts"
    if extras.freeze_note:
        return None, extras.freeze_note
    return view.best_point(), (
        "highest mean TFLOP/s/GPU among completed points that did not fail; not compared with confidence "
        "(mbx freeze compares)"
    )  # fmt: skip


def _counts(items: list[str]) -> list[tuple[str, int]]:
    counted: dict[str, int] = {}
    for item in items:
        counted[item] = counted.get(item, 0) + 1
    return sorted(counted.items())


def spike_marks(view: CampaignView) -> bool:
    """Whether the grad-norm figures mark spikes: when the campaign gates on them or compares parity pairs."""
    return "grad_norm_spikes_max" in view.gates or bool(view.parity)


def index_context(view: CampaignView, extras: SiteExtras, hrefs: dict[str, str]) -> dict[str, Any]:
    """What report.html.j2 shows: the table, figures, rejected list, estimates, trials and environment."""
    best, how = pick_best(view, extras)
    groups, fp_keys = fingerprint_groups(view.cells)
    estimates = estimate_index(extras.estimates)
    names = {c.cell_id: knob_label(c, view.axes, fmt_param) for c in view.cells}
    point_names = {
        p.point_id: knob_label(p.repeats[0], view.axes, fmt_param).split(" (repeat")[0] for p in view.points
    }
    scope = search_scope(extras)
    figured = view if scope is None else searched(view, scope.shown)  # judged on one figure: full length only
    every = view if scope is None else searched(view, frozenset(scope.lengths))  # the search's plots: every trial
    shown = index_cells(figured, best)
    grad = grad_norm_figure(shown, names, spike_marks(view))
    curves = site_figures.curves(shown, names)
    curves[2:2] = [grad] if grad is not None else []
    pareto = site_figures.pareto(every.points, point_names, best, None if scope is None else scope.front,
                                 None if scope is None else scope.lengths,
                                 frozenset() if scope is None else scope.memory_front,
                                 None if scope is None else scope.full)  # fmt: skip
    heat = site_figures.heatmap_data(figured.points, view.axes, fmt_param)
    point_hrefs = {p.point_id: hrefs[p.repeats[0].cell_id] for p in view.points if p.repeats[0].cell_id in hrefs}
    known = {p.point_id for p in view.points}
    row_of = {p.point_id: point_row(p, view.axes, best, extras, estimates, hrefs) for p in view.points}
    return {
        "view": view, "extras": extras, "how": how, "description": code_spans(view.description),
        "point_hrefs": point_hrefs,
        "generated_at": view.generated_at or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gates": [(k, fmt_param(v)) for k, v in view.gates.items()],
        "rows": list(row_of.values()), "best": row_of.get(best.point_id) if best is not None else None,
        "completed": sum(1 for c in view.cells if c.state == "completed"),
        "states": _counts([c.state for c in view.cells]), "verdicts": _counts([p.verdict for p in view.points]),
        "axis_figures": _axis_figures(every, best, *((scope.lengths, scope.full) if scope else (None, 0))),
        "curve_figures": curves, "scope": scope,
        "curve_note": curve_note(view, figured, shown),
        "heatmap": heat,
        "heatmap_json": site_figures.safe_json(heat) if heat else "",
        "pareto": pareto, "short_axes": short_axis_names(view.axes),
        "estimates": bool(estimates), "infeasible": [r for r in extras.estimates if r.get("feasible") is False
                                                     and r.get("point_id") not in known],
        "trials": trial_table(extras.trials, point_hrefs) if extras.trials else None,
        "fp_groups": groups, "fp_keys": fp_keys, "fp_differs": differing_keys(groups, fp_keys),
        "fp_missing": [c.cell_id for c in view.cells if not c.fingerprint and c.state != "pending"],
        "fmt_number": fmt_number,
        "eager_rows": EAGER_ROWS, "confidence": f"{CONFIDENCE:.0%}",
        "damaged": [c for c in view.cells if c.damaged],
        "parity": parity_rows(view), "parity_figures": parity_figures(view) if view.parity else [],
        "outcome": outcome_badge(extras), "parity_head": ((extras.outcome or {}).get("parts") or {}).get("parity"),
        "parity_counts": _counts([p["verdict"] for p in view.parity]),
    }  # fmt: skip


def outcome_badge(extras: SiteExtras) -> dict[str, str] | None:
    """The campaign's outcome as the closing line says it (the orchestrator's, orchestrator/judge/outcome.py):
    its verdict, its word and the rest of the line; None for a page rendered without it."""
    if not extras.outcome:
        return None
    word, _, text = str(extras.outcome.get("closing", "")).partition(" ")
    return {"verdict": str(extras.outcome.get("verdict")), "word": word, "text": text}


def render_report(view: CampaignView, extras: SiteExtras | None = None, hrefs: dict[str, str] | None = None,
                  asset_dir: str = "assets") -> str:  # fmt: skip
    """The index page as HTML text; `hrefs` maps cell ids to their pages (relative), `asset_dir` is where the
    page loads plotly.js, site.js and site.css from (relative)."""
    context = index_context(view, extras or SiteExtras(), hrefs or {})
    return environment().get_template("report.html.j2").render(asset_dir=asset_dir, **context)


def _plotly_js_source() -> Path | None:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


def _copy_if_changed(source: Path, target: Path) -> None:
    src, dst = source.stat(), target.stat() if target.is_file() else None
    if dst is None or (dst.st_size, dst.st_mtime_ns) != (src.st_size, src.st_mtime_ns):
        atomic_copy(source, target)  # keeps the mtime: an unchanged asset is not copied again


def write_assets(out_dir: Path) -> Path:
    """Copy the installed plotly package's plotly.min.js, site.js and site.css to out_dir/assets/ so the pages
    work offline; returns the plotly asset's path."""
    target = Path(out_dir) / PLOTLY_ASSET
    target.parent.mkdir(parents=True, exist_ok=True)
    source = _plotly_js_source()
    if source is not None:
        _copy_if_changed(source, target)
    else:
        from plotly.offline import get_plotlyjs

        atomic_write(target, get_plotlyjs())
    for name in SITE_ASSETS:
        _copy_if_changed(TEMPLATE_DIR / name, target.parent / name)
    return target


def write_report(view: CampaignView, out_dir: Path, extra: dict[str, str] | None = None) -> Path:
    """Write out_dir/index.html alone (no cell pages: reports/site.py writes the whole site), its assets and the
    `extra` files (name → text), each whole or not at all; returns the page's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_assets(out_dir)
    page = out_dir / "index.html"
    atomic_write(page, render_report(view))
    for name, text in (extra or {}).items():
        atomic_write(out_dir / name, text)
    return page
