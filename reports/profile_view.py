"""Where the time goes, for the report: per-cell time by kernel class from the profiler traces in run dirs.

`breakdown(run_dir)` gives ms per profiled step per class (reports/kernels.py's classes plus "idle"),
None when the run dir holds no trace; `profile_section(cells)` renders the stacked bars of several cells
on one scale as an HTML fragment (user text escaped), "" when no cell has a trace. Traces are parsed once
per process (keyed by path, size and mtime).
"""

from __future__ import annotations

import os
import re
import sqlite3
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from reports.kernels import ALL_CLASSES, IDLE
from reports.profile_hta import hta_figures
from reports.profile_nsys import NSYS_REPORTS, NSYS_SQLITE, megatron_steps, nsys_events
from reports.profile_trace import TraceBreakdown, breakdown_of, load_events
from trainer import rundir

TEMPLATE_DIR = Path(__file__).parent / "templates"
# Where a run dir's trace lies: the bundled trainer's (trainer/profiling.py), else Kineto's own file names
# (Megatron's --use-pytorch-profiler, torch.profiler.tensorboard_trace_handler) under the run dir.
TRACE_NAMES = (rundir.PROFILE_TRACE, rundir.PROFILE_TRACE + ".gz")
KINETO_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")  # under the run dir or its profile/ folder
# Megatron-Bridge's torch profiler under a campaign's `profile:` (orchestrator/spec/profile_spec.py points its
# logger.tensorboard_dir at <run dir>/tensorboard): <run dir>/torch_profile/rank-<RANK>.json.gz.
BRIDGE_TRACE_DIR = "torch_profile"
BRIDGE_TRACE = re.compile(r"^rank-(\d+)\.json(\.gz)?$")
NSYS_FILES = (NSYS_SQLITE, *NSYS_REPORTS)  # command trainers under Nsight Systems (reports/profile_nsys.py)
# One colour per class, in ALL_CLASSES order (idle last, light grey).
COLOURS = dict(zip(ALL_CLASSES, (
    "#1f77b4", "#9467bd", "#ff7f0e", "#d62728", "#8c564b", "#2ca02c", "#17becf", "#bcbd22", "#7f7f7f", "#dddddd",
), strict=True))  # fmt: skip


def _names(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:  # no such folder, or not one
        return []


def trace_file(run_dir: Path) -> Path | None:
    """The profiler trace of a run dir, or None (one directory listing: the report asks for every cell)."""
    run_dir = Path(run_dir)
    names = _names(run_dir)
    known = [n for n in TRACE_NAMES if n in names]
    if known:
        return run_dir / known[0]
    kineto = [run_dir / n for n in names if n.endswith(KINETO_SUFFIXES)]
    if "profile" in names:
        kineto += [
            run_dir / "profile" / n for n in _names(run_dir / "profile") if n.endswith(KINETO_SUFFIXES)
        ]
    if kineto:
        return kineto[0]
    if BRIDGE_TRACE_DIR in names and (bridge := bridge_trace(run_dir / BRIDGE_TRACE_DIR)):
        return bridge
    nsys = [n for n in NSYS_FILES if n in names]
    return run_dir / nsys[0] if nsys else None


def bridge_trace(folder: Path) -> Path | None:
    """The lowest rank's trace of Bridge's torch_profile/ folder (rank 0 where it recorded), or None."""
    ranks = sorted((int(m.group(1)), n) for n in _names(folder) if (m := BRIDGE_TRACE.match(n)))
    return folder / ranks[0][1] if ranks else None


def _steps_hint(run_dir: Path) -> int | None:
    """Profiled steps from profile.txt's header (traces written before the step ranges existed; rundir reads it,
    None for one a newer mbx wrote), else from a Megatron argv's --profile-step-start/end (nsys captures exactly
    those steps)."""
    header = rundir.read_profile_header(Path(run_dir))
    return megatron_steps(run_dir) if header is None else header.steps


@lru_cache(maxsize=256)
def _cached(path: str, size: int, mtime_ns: int, steps_hint: int | None) -> TraceBreakdown | None:
    where = Path(path)
    try:
        events = nsys_events(where.parent) if where.name in NSYS_FILES else load_events(where)
        if events is None:  # an .nsys-rep and no `nsys` to export it with
            return None
        found = breakdown_of(events, steps_hint, source=path)
    except (OSError, ValueError, EOFError, sqlite3.Error):  # unreadable or torn trace: the report shows none
        return None
    if found.device == "gpu" and where.name not in NSYS_FILES:
        found.hta = hta_figures(where, found.steps)
    return found


def trace_breakdown(run_dir: Path | str | None) -> TraceBreakdown | None:
    """The full breakdown (device, steps, window, overlap, top kernels) of a run dir's trace, or None (also for
    no run dir: a cell that never ran)."""
    if not run_dir:
        return None
    path = trace_file(Path(run_dir))
    if path is None:
        return None
    stat = path.stat()
    return _cached(str(path), stat.st_size, stat.st_mtime_ns, _steps_hint(run_dir))


def breakdown(run_dir: Path | str | None) -> dict[str, float] | None:
    """ms per profiled step per class ("GEMM", ..., "idle"), in stacking order; None if no trace.

    GPU traces: kernel time (streams that overlap add up; see `trace_breakdown(...).overlap_ms`);
    CPU-only traces: CPU op self time."""
    found = trace_breakdown(run_dir)
    if found is None:
        return None
    return {c: found.classes[c] for c in ALL_CLASSES if c in found.classes}


def moved(found: TraceBreakdown, reference: TraceBreakdown, top: int = 3) -> list[tuple[str, float]]:
    """The classes whose ms per step changed most against `reference` (largest |change| first, non-zero only)."""
    classes = [c for c in ALL_CLASSES if c in found.classes or c in reference.classes]
    deltas = [(c, found.classes.get(c, 0.0) - reference.classes.get(c, 0.0)) for c in classes]
    return [d for d in sorted(deltas, key=lambda d: -abs(d[1])) if d[1] != 0.0][:top]


def _bars(label: str, found: TraceBreakdown, scale: float) -> dict[str, Any]:
    total = sum(found.classes.values())
    parts = [
        {"cls": c, "ms": found.classes[c], "pct": 100.0 * found.classes[c] / scale, "colour": COLOURS[c],
         "share": 100.0 * found.classes[c] / total if total else 0.0,
         "top": ", ".join(f"{n[:80]} {ms:.2f} ms" for n, ms in found.top.get(c, [])[:3])}
        for c in ALL_CLASSES if found.classes.get(c, 0.0) > 0
    ]  # fmt: skip
    return {"label": label, "parts": parts, "total": total, "found": found, "moved": "",
            "window_pct": 100.0 * found.window_ms / scale}  # fmt: skip


def profile_section(cells: list[dict[str, Any]]) -> str:
    """HTML stacked bars of time per class for the cells with a trace (`cells`: [{"label", "run_dir"}])."""
    found = [(str(c["label"]), b) for c in cells if (b := trace_breakdown(c.get("run_dir"))) is not None]
    if not found:
        return ""
    scale = max(max(sum(b.classes.values()), b.window_ms) for _, b in found) or 1.0
    rows = [_bars(label, b, scale) for label, b in found]
    ref_label, reference = found[0]
    for row, (_, b) in zip(rows[1:], found[1:], strict=True):
        changes = ", ".join(f"{c} {ms:+.2f} ms" for c, ms in moved(b, reference))
        row["moved"] = f"vs {ref_label}: {changes}" if changes else ""
    devices = sorted({b.device for _, b in found})
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), autoescape=True,
                             undefined=jinja2.StrictUndefined)  # fmt: skip
    return env.get_template("profile_section.html.j2").render(
        rows=rows, classes=[(c, COLOURS[c]) for c in ALL_CLASSES], devices=devices, idle=IDLE
    )


def _md(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def profile_markdown(cells: list[dict[str, Any]]) -> str:
    """A Markdown table of ms per profiled step per class for the cells with a trace; "" when none has one."""
    found = [(str(c["label"]), b) for c in cells if (b := trace_breakdown(c.get("run_dir"))) is not None]
    return markdown_table(found)


def markdown_table(found: list[tuple[str, TraceBreakdown]]) -> str:
    """The Markdown table of labelled breakdowns ("" for none)."""
    if not found:
        return ""
    classes = [c for c in ALL_CLASSES if any(b.classes.get(c, 0.0) > 0 for _, b in found)]
    unit = "/".join(sorted({b.device.upper() for _, b in found}))
    head = ["cell", "step (ms)", *classes, "overlap"]
    lines = [
        f"Where the time goes ({unit} ms per profiled step by kernel class)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for label, b in found:
        figures = [_md(label), f"{b.window_ms:.2f}", *(f"{b.classes.get(c, 0.0):.2f}" for c in classes)]
        lines.append("| " + " | ".join([*figures, f"{b.overlap_ms:.2f}"]) + " |")
    return "\n".join(lines) + "\n"
