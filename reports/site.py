"""The report site of a campaign, static and offline from disk: index.html (reports/page.py), one page per cell
under cells/, the assets (plotly.js, site.js, site.css) and extra files such as summary.md; the comparison page
with the baseline (compare/, written by the orchestrator) is linked from the index."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from reports.flops_check import check
from reports.index_data import FINGERPRINT_KEYS
from reports.page import render_report, write_assets
from reports.site_data import (
    SiteExtras,
    cell_file,
    cell_memory,
    estimate_index,
    headroom,
    knob_label,
    relative,
)
from reports.site_figures import curves, grad_norm_figure, spike_marks
from reports.site_format import DASH, atomic_write, environment, fmt_number, fmt_param
from reports.views import CampaignView, CellView

CELLS_DIR = "cells"
CELL_PAGE = re.compile(r"[A-Za-z0-9._-]*-[0-9a-f]{8}\.html")  # reports.site_data.cell_file's names
GPU_MEMORY = ("peak_alloc_gib", "peak_reserved_gib")

# Window figures of a cell's page: (summary field, label, decimals)
FIGURES: tuple[tuple[str, str, int], ...] = (
    ("step_time_ms", "step time (ms)", 1),
    ("step_time_ms_std", "step time std (ms)", 1),
    ("tflops_per_gpu", "TFLOP/s/GPU", 1),
    ("tflops_per_gpu_mbx", "TFLOP/s/GPU by mbx's Megatron-LM count", 1),
    ("tokens_per_s_per_gpu", "tokens/s/GPU", 0),
    ("peak_alloc_gib", "peak allocated (GiB)", 2),
    ("peak_reserved_gib", "peak reserved (GiB)", 2),
    ("first_loss", "first loss", 4),
    ("last_loss", "last loss", 4),
)
OPTIONAL = ("tflops_per_gpu_mbx",)  # a row only where the cell or its baseline has the figure


def _figure_rows(cell: CellView, extras: SiteExtras) -> list[dict[str, str]]:
    """The cell's window figures beside the baseline's and the relative change."""
    base = extras.baselines.get(cell.cell_id)
    memory, kind = cell_memory(cell)
    out = []
    for name, label, digits in FIGURES:
        mine = getattr(cell.summary, name) if cell.summary is not None else None
        mine = None if kind == "rss" and name in GPU_MEMORY else mine  # a CPU run: RSS below, not 0.00
        theirs = getattr(base, name) if base is not None else None
        if name in OPTIONAL and mine is None and theirs is None:
            continue
        change = relative(mine, theirs)
        out.append({"name": name, "label": label, "value": fmt_number(mine, digits, thousands=digits < 4),
                    "base": fmt_number(theirs, digits, thousands=digits < 4),
                    "delta": DASH if change is None else f"{change:+.1%}"})  # fmt: skip
    if kind == "rss":
        out.append({"name": "peak_rss_gib", "label": "peak RSS (GiB, CPU run)", "value": fmt_number(memory, 2),
                    "base": DASH, "delta": DASH})  # fmt: skip
    return out


def _breakdown(cell: CellView) -> list[tuple[str, str]]:
    """GPU ms per kernel class of the profiled steps (reports/profile_view.py), when that module and a trace exist."""
    if not cell.run_dir:
        return []
    try:
        from reports.profile_view import breakdown
    except ImportError:
        return []
    found = breakdown(Path(cell.run_dir))
    return [(name, fmt_number(ms, 2)) for name, ms in (found or {}).items()]


def _curves(cell: CellView, name: str, spikes: bool) -> list[dict[str, Any]]:
    """The cell's per-step figures, its grad norm (spikes marked when the campaign gates on them) after the loss."""
    out = curves([cell], {cell.cell_id: name})
    grad = grad_norm_figure([cell], {cell.cell_id: name}, spikes)
    return out[:2] + [grad] + out[2:] if grad is not None else out


def cell_context(
    view: CampaignView, cell: CellView, extras: SiteExtras, estimates: dict[str, Any]
) -> dict[str, Any]:
    """What site_cell.html.j2 shows for one cell."""
    name = knob_label(cell, view.axes, fmt_param)
    estimate = estimates.get(cell.point_id)
    memory, kind = cell_memory(cell)
    room = headroom(estimate, memory, kind)
    fp = cell.fingerprint or {}
    return {
        "view": view, "cell": cell, "name": name, "figures": _figure_rows(cell, extras),
        "params": [(axis, fmt_param(cell.params[axis])) for axis in view.axes if axis in cell.params],
        "curves": _curves(cell, name, spike_marks(view)), "has_baseline": cell.cell_id in extras.baselines,
        "estimate": estimate, "headroom": fmt_number(room, 1), "fmt_number": fmt_number,
        "fingerprint": [(k, fmt_param(fp[k])) for k in FINGERPRINT_KEYS if fp.get(k) is not None],
        "breakdown": _breakdown(cell), "failed": [c.message for c in cell.gate.failed] if cell.gate else [],
        "unchecked": [c.message for c in cell.gate.unchecked] if cell.gate else [],
        "flops": check(cell.summary),
    }  # fmt: skip


def write_site(view: CampaignView, out_dir: Path, extras: SiteExtras | None = None,
               files: dict[str, str] | None = None) -> Path:  # fmt: skip
    """Write the whole site into out_dir (each file whole or not at all; stale cell pages removed) and return the
    index's path. OSError (full disk, a path of the wrong kind) goes to the caller."""
    extras = extras or SiteExtras()
    out_dir = Path(out_dir)
    cells_dir = out_dir / CELLS_DIR
    cells_dir.mkdir(parents=True, exist_ok=True)
    write_assets(out_dir)
    hrefs = {c.cell_id: f"{CELLS_DIR}/{cell_file(c.cell_id)}" for c in view.cells}
    template = environment().get_template("site_cell.html.j2")
    estimates = estimate_index(extras.estimates)
    for cell in view.cells:
        context = cell_context(view, cell, extras, estimates)
        atomic_write(out_dir / hrefs[cell.cell_id], template.render(**context))
    written = {Path(h).name for h in hrefs.values()}
    for stale in cells_dir.glob("*.html"):  # pages of cells no longer in the campaign (only names we write)
        if stale.name not in written and CELL_PAGE.fullmatch(stale.name):
            stale.unlink(missing_ok=True)
    for name, text in (files or {}).items():
        atomic_write(out_dir / name, text)
    page = out_dir / "index.html"
    atomic_write(page, render_report(view, extras, hrefs))
    return page
