"""Plotly figures of the report site as plain JSON (no plotly.graph_objects: a thousand cell pages stay fast):
per-step curves (grad norm with its spikes marked), the TFLOP/s heatmap of two swept axes, and the Pareto plot of
TFLOP/s against peak memory."""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Callable
from typing import Any

from reports.metrics import finite
from reports.site_data import cell_memory, point_memory
from reports.views import CampaignView, CellView, PointView

PALETTE = (
    "#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd #8c564b #e377c2 #7f7f7f #bcbd22 #17becf "
    "#393b79 #637939 #8c6d31 #843c39 #7b4173 #3182bd #e6550d #31a354 #756bb1 #636363"
).split()
CATEGORY_MAX = 12  # a numeric axis with at most this many distinct values is shown as categories

# Per-step curves: (row key, figure id, title, y-axis title, clip the first step's outlier)
CURVES: tuple[tuple[str, str, str, str, bool], ...] = (
    ("step_time_ms", "fig-step-time", "Step time per step", "step time (ms)", True),
    ("loss", "fig-loss", "Training loss per step", "loss", False),
    ("eval_loss", "fig-eval-loss", "Eval loss", "eval loss", False),
    ("tflops_per_gpu", "fig-tflops", "TFLOP/s/GPU per step", "TFLOP/s/GPU", True),
    ("tokens_dropped_frac", "fig-dropped", "Dropped tokens per step", "dropped fraction", False),
)
MEMORY = "memory"  # the curve of mem_max_allocated_gib, or rss_gib on a CPU run


def t(text: Any) -> str:
    """User text for a plotly label: plotly renders a few HTML tags in labels, so show them literally."""
    return html.escape(str(text), quote=False)


def safe_json(data: Any) -> str:
    """JSON that is safe inside a <script> element (no '<', '>' or '&' left unescaped)."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


TITLE_CHARS = 52  # a title line fits the narrowest figure (560 px, 15 px font) in this many characters
TITLE_LINE_PX = 28  # from the figure's top edge to the bottom of its title's first line (the next ones below)
LEGEND_ROW_PX = 20  # one row of the legend under the plot
LEGEND_WIDTH_PX = 500  # what a legend row may fill in the narrowest figure
PLOT_PX = 300  # the plot area's height in every figure (its legend and title add to the figure's height)
_GLYPH = re.compile(r"&[A-Za-z0-9#]+;|.", re.S)  # an escaped entity counts as one character


def wrap(text: str, width: int = TITLE_CHARS) -> list[str]:
    """A label's lines of at most `width` characters, broken at spaces (a longer word is cut); entities whole."""
    lines: list[list[str]] = [[]]
    for word in text.split(" "):
        glyphs = _GLYPH.findall(word)
        while glyphs:
            line = lines[-1]
            room = width - len(line) - (1 if line else 0)
            if len(glyphs) <= room:
                lines[-1] = line + ([" "] if line else []) + glyphs
                glyphs = []
            elif line:
                lines.append([])
            else:  # a word longer than a line: cut it
                lines[-1], glyphs = glyphs[:width], glyphs[width:]
                lines.append([])
    return ["".join(line) for line in lines if line]


def legend_rows(names: list[str]) -> int:
    """Rows a horizontal legend of these entries takes in the narrowest figure (entries packed left to right)."""
    rows, used = 0, LEGEND_WIDTH_PX
    for name in names:
        width = 45 + 7 * len(_GLYPH.findall(name))  # the symbol, the gap and ~7 px a character at 11 px
        if used + width > LEGEND_WIDTH_PX:
            rows, used = rows + 1, 0
        used += width
    return rows


def layout(title: str, xtitle: str, ytitle: str, **extra: Any) -> dict[str, Any]:
    """The house layout of every figure: the title wrapped to the figure's width above the plot; `figure` then
    puts the legend in rows under the x axis (never over the plot) and makes the figure tall enough for both."""
    lines = wrap(title)
    top = 30 + 20 * len(lines)
    return {
        "title": {"text": "<br>".join(lines), "x": 0, "xref": "container", "xanchor": "left", "pad": {"l": 12},
                  "yref": "container", "yanchor": "bottom", "font": {"size": 15}},  # y: set by `figure`
        "xaxis": {"title": {"text": xtitle}, "automargin": True, **extra.pop("xaxis", {})},
        "yaxis": {"title": {"text": ytitle}, "automargin": True, **extra.pop("yaxis", {})},
        "template": {"layout": {"paper_bgcolor": "white", "plot_bgcolor": "white"}},
        "height": extra.pop("plot_px", PLOT_PX) + top + 60,
        "margin": {"l": 70, "r": 30, "t": top, "b": 60},
        "legend": {"font": {"size": 11}, "orientation": "h", "x": 0, "xanchor": "left", "y": 0,
                   "yref": "container", "yanchor": "bottom"},
        **extra,
    }  # fmt: skip


def legend_names(data: list[dict[str, Any]], shapes: list[dict[str, Any]]) -> list[str]:
    """The legend's entries: named traces and shapes that show one (a legend group once)."""
    names, groups = [], set()
    traces = [(t, t.get("showlegend", t.get("type") != "heatmap")) for t in data]
    for item, shown in traces + [(s, s.get("showlegend", False)) for s in shapes]:
        group = item.get("legendgroup")
        if not shown or not item.get("name") or (group and group in groups):
            continue
        groups.add(group)
        names.append(str(item["name"]))
    return names


def figure(
    fig_id: str, title: str, data: list[dict[str, Any]], fig_layout: dict[str, Any], **more: Any
) -> dict[str, Any]:
    """A figure for the page: its legend (two entries or more) below the plot, the figure grown to hold it."""
    names = legend_names(data, fig_layout.get("shapes", []))
    rows = legend_rows(names) if len(names) > 1 else 0
    grow = LEGEND_ROW_PX * rows + (10 if rows else 0)
    height = fig_layout["height"] + grow
    fig_layout = {**fig_layout, "showlegend": bool(rows), "height": height,
                  "title": {**fig_layout["title"], "y": 1 - TITLE_LINE_PX / height},  # plotly anchors the first line
                  "margin": {**fig_layout["margin"], "b": fig_layout["margin"]["b"] + grow}}  # fmt: skip
    return {"id": fig_id, "title": title, "json": safe_json({"data": data, "layout": fig_layout}), **more}


def _num(value: Any) -> float | None:
    return float(value) if finite(value) else None


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float | None]]:
    """Steps and values of `key` (the last row of a step wins; non-finite values as None); steps without the
    key are left out (eval loss is logged every few steps)."""
    by_step: dict[int, Any] = {}
    for row in rows:
        step = row.get("step")
        if isinstance(step, int) and not isinstance(step, bool) and key in row:
            by_step[step] = row[key]
    steps = sorted(by_step)
    return steps, [_num(by_step[s]) for s in steps]


def axis_kind(values: list[Any]) -> tuple[bool, list[Any]]:
    """(categorical, category order): discrete knobs (integers, booleans, text, few distinct values) are
    categories, numbers in ascending order; only many distinct real numbers make a linear axis."""
    distinct = list(dict.fromkeys(json.dumps(v, sort_keys=True, default=str) for v in values))
    numeric = bool(values) and all(finite(v) for v in values)
    if numeric and len(distinct) > CATEGORY_MAX and not all(float(v).is_integer() for v in values):
        return False, []
    if numeric:
        return True, sorted({float(v): v for v in values}.values())
    return True, [json.loads(d) for d in distinct]


def eval_steps(*sides: list[dict[str, Any]]) -> list[int]:
    """The steps either side evaluated at (a row with an `eval_loss`)."""
    return sorted({r["step"] for rows in sides for r in rows if isinstance(r.get("step"), int)
                   and r.get("eval_loss") is not None})  # fmt: skip


def eval_marks(steps: list[int], rows: int, legend: bool = True) -> list[dict[str, Any]]:
    """A dotted vertical line at each eval step across every row, over the curves (one legend entry for
    all)."""
    axes = ["y"] + [f"y{i}" for i in range(2, rows + 1)]
    return [{"type": "line", "xref": "x", "yref": f"{axis} domain", "x0": s, "x1": s, "y0": 0, "y1": 1,
             "layer": "above", "line": {"color": "#57606a", "width": 1.2, "dash": "dot"}, "name": "eval step",
             "legendgroup": "eval", "showlegend": legend and i == 0 and axis == "y"}
            for axis in axes for i, s in enumerate(steps)]  # fmt: skip


def _memory_key(cell: CellView) -> str:
    return "rss_gib" if cell_memory(cell)[1] == "rss" else "mem_max_allocated_gib"


def curve(cells: list[CellView], names: dict[str, str], key: str, fig_id: str, title: str, ytitle: str,
          clip_first: bool = False) -> dict[str, Any] | None:  # fmt: skip
    """One line per cell of `key` (MEMORY: peak allocated, or RSS on CPU) against the step; legends by `names`;
    the training loss with the eval steps marked."""
    data: list[dict[str, Any]] = []
    tail: list[float] = []
    heads: list[float] = []
    for index, cell in enumerate(cells):
        steps, ys = series(cell.rows, _memory_key(cell) if key == MEMORY else key)
        if not any(y is not None for y in ys):
            continue
        data.append({"type": "scatter", "x": steps, "y": ys, "mode": "lines+markers" if len(steps) < 60 else "lines",
                     "name": t(names.get(cell.cell_id, cell.cell_id)), "meta": t(cell.cell_id),
                     "line": {"color": PALETTE[index % len(PALETTE)], "width": 1.5}, "marker": {"size": 4},
                     "hovertemplate": "%{meta}<br>step %{x}: %{y:.4g}<extra>%{fullData.name}</extra>"})  # fmt: skip
        tail.extend(y for y in ys[1:] if y is not None)
        heads.extend(y for y in ys[:1] if y is not None)
    if not data:
        return None
    yaxis: dict[str, Any] = {}
    if clip_first and tail:  # each cell's first step (compile, warm-up) is often several times slower
        low, high = min(tail), max(tail)
        pad = max((high - low) * 0.15, abs(high) * 0.05)
        yaxis = {"range": [max(0.0, low - pad), high + pad]}
        if any(h > high + pad or h < low - pad for h in heads):
            title += " (first steps off scale)"
    marks = eval_marks(eval_steps(*(c.rows for c in cells)), 1, legend=False) if key == "loss" else []
    title += " (dotted: eval steps)" if marks else ""  # the legend names the cells alone
    return figure(fig_id, title, data, layout(title, "step", ytitle, yaxis=yaxis, shapes=marks))


def curves(cells: list[CellView], names: dict[str, str], prefix: str = "") -> list[dict[str, Any]]:
    """The per-step figures of these cells: step time, loss, eval loss, TFLOP/s, dropped tokens, memory."""
    out = [
        curve(cells, names, key, prefix + fid, title, ytitle, clip)
        for key, fid, title, ytitle, clip in CURVES
    ]
    rss = any(cell_memory(c)[1] == "rss" for c in cells)
    ytitle = "peak RSS (GiB, CPU run)" if rss else "peak allocated (GiB)"
    out.append(curve(cells, names, MEMORY, prefix + "fig-memory", "Memory per step", ytitle))
    return [f for f in out if f is not None]


# ---------------------------------------------------------------- heatmap of two swept axes


def heatmap_data(
    points: list[PointView], axes: list[str], text: Callable[[Any], str]
) -> dict[str, Any] | None:
    """For every pair of swept axes, the grid of TFLOP/s/GPU (the best point's mean over the other axes) with
    category labels in axis order; None with fewer than two axes or nothing measured."""
    measured = [(p, p.mean("tflops_per_gpu")) for p in points if p.completed]
    measured = [(p, v) for p, v in measured if finite(v)]
    if len(axes) < 2 or not measured:
        return None
    orders = {a: axis_kind([p.params[a] for p, _ in measured if a in p.params])[1] for a in axes}
    pairs: dict[str, Any] = {}
    for i, a in enumerate(axes):
        for b in axes[i + 1 :]:
            xs, ys = [text(v) for v in orders[a]], [text(v) for v in orders[b]]
            z: list[list[float | None]] = [[None] * len(xs) for _ in ys]
            label: list[list[str]] = [[""] * len(xs) for _ in ys]
            for point, value in measured:
                if a not in point.params or b not in point.params:
                    continue
                col, row = xs.index(text(point.params[a])), ys.index(text(point.params[b]))
                if z[row][col] is None or value > z[row][col]:  # type: ignore[operator]
                    z[row][col], label[row][col] = value, t(point.label)
            pairs[f"{i}|{axes.index(b)}"] = {
                "x": [t(x) for x in xs],
                "y": [t(y) for y in ys],
                "z": z,
                "text": label,
            }
    return {"axes": [t(a) for a in axes], "pairs": pairs, "many": len(axes) > 2}


# ---------------------------------------------------------------- Pareto: TFLOP/s vs peak memory


def frontier(pairs: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both (less memory, more TFLOP/s), by memory."""
    order = sorted(range(len(pairs)), key=lambda i: (pairs[i][0], -pairs[i][1]))
    best, kept = -math.inf, []
    for i in order:
        if pairs[i][1] > best:
            kept.append(i)
            best = pairs[i][1]
    return kept


def pareto(points: list[PointView], names: dict[str, str], best: PointView | None, front: set[str] | None = None,
           lengths: dict[str, int] | None = None, memory_front: frozenset[str] = frozenset(),
           full: int | None = None) -> dict[str, Any] | None:  # fmt: skip
    """TFLOP/s/GPU against peak memory per point, the frontier drawn through the non-dominated points (`front`:
    the point ids a search put on its Pareto front, used as they are: one notion, orchestrator/judge/best.py's).
    A search (`lengths`: point id → run length) draws every trial, one trace per run length (`full`: its full
    length, so named; None: the longest), and marks the points on its front for memory from a shorter run
    (`memory_front`) apart from the frontier of full-length ones."""
    rows = [(p, point_memory(p), p.mean("tflops_per_gpu")) for p in points if p.completed]
    rows = [(p, m, v) for p, m, v in rows if m[0] is not None and finite(v)]
    if not rows:
        return None
    pairs = [(m[0], float(v)) for _, m, v in rows]  # type: ignore[misc]
    if front is None and lengths is None:
        kept = frontier(pairs)  # type: ignore[arg-type]
    else:
        kept = sorted((i for i, (p, _, _) in enumerate(rows) if p.point_id in (front or set())),
                      key=lambda i: pairs[i][0])  # fmt: skip
    rss = any(m[1] == "rss" for _, m, _ in rows)
    label = [t(names.get(p.point_id, p.label)) for p, _, _ in rows]
    data = _length_traces(rows, pairs, label, lengths, full) + [
        {"type": "scatter", "mode": "lines+markers", "name": f"frontier ({len(kept)})", "line": {"shape": "hv", "color": "#d62728"},
         "x": [pairs[i][0] for i in kept], "y": [pairs[i][1] for i in kept], "text": [label[i] for i in kept],
         "marker": {"size": 12, "symbol": "diamond-open", "color": "#d62728"},
         "hovertemplate": "%{text}<extra>frontier</extra>"},
    ]  # fmt: skip
    low = [i for i, (p, _, _) in enumerate(rows) if p.point_id in memory_front]
    if low:
        data.append({"type": "scatter", "mode": "markers", "name": "front for memory (shorter run)",
                     "x": [pairs[i][0] for i in low], "y": [pairs[i][1] for i in low], "text": [label[i] for i in low],
                     "marker": {"size": 13, "symbol": "triangle-left-open", "color": "#d62728"},
                     "hovertemplate": "%{text}<br>on the front for memory; its TFLOP/s is from a shorter run"
                                      "<extra></extra>"})  # fmt: skip
    if best is not None and any(p is best for p, _, _ in rows):
        i = next(i for i, (p, _, _) in enumerate(rows) if p is best)
        data.append({"type": "scatter", "mode": "markers", "name": "best", "x": [pairs[i][0]], "y": [pairs[i][1]],
                     "marker": {"size": 20, "symbol": "star-open", "color": "#111"}, "hoverinfo": "skip"})  # fmt: skip
    xtitle = "peak memory (GiB; RSS on CPU runs)" if rss else "peak allocated memory (GiB)"
    title = "TFLOP/s/GPU vs peak memory (Pareto frontier)"
    fig = figure("fig-pareto", title, data, layout(title, xtitle, "TFLOP/s/GPU"), frontier=len(kept))
    return {**fig, "points": [p.point_id for p, _, _ in rows], "front": [rows[i][0].point_id for i in kept]}


def length_name(steps: int, full: int) -> str:
    """A search trace's name: its run length ('40 steps (full length)', '5 steps')."""
    return f"{steps} steps" + (" (full length)" if steps == full else "")


def _length_traces(rows: list[Any], pairs: list[tuple[float, float]], label: list[str],
                   lengths: dict[str, int] | None, full: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The points as one trace ('points'), or a search's as one trace per run length, longest first; only the
    search's full length (`full`; None: the longest run) is called so."""
    groups: dict[str, list[int]] = {}
    if full is None:
        full = max(lengths.values(), default=0) if lengths else 0
    for i, (p, _, _) in enumerate(rows):
        name = length_name(lengths[p.point_id], full) if lengths and p.point_id in lengths else "points"
        groups.setdefault(name, []).append(i)
    order = sorted(groups, key=lambda n: -int(n.split()[0]) if n[0].isdigit() else 0)
    return [{"type": "scatter", "mode": "markers", "name": name, "x": [pairs[i][0] for i in groups[name]],
             "y": [pairs[i][1] for i in groups[name]], "text": [label[i] for i in groups[name]],
             "marker": {"size": 10, "color": "#1f77b4" if k == 0 else PALETTE[(k + 1) % len(PALETTE)],
                        "opacity": 0.8, "symbol": "circle" if k == 0 else "circle-open"},
             "hovertemplate": "%{text}<br>%{x:.3g} GiB, %{y:.4g} TFLOP/s/GPU<extra>%{fullData.name}</extra>"}
            for k, name in enumerate(order)]  # fmt: skip


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


def spike_marks(view: CampaignView) -> bool:
    """Whether the grad-norm figures mark spikes: when the campaign gates on them or compares parity pairs."""
    return "grad_norm_spikes_max" in view.gates or bool(view.parity)
