"""HolisticTraceAnalysis on one rank's GPU trace: why the GPU idled (host wait, kernel wait) and how much
communication ran beside compute. Optional (`pip install mbx[profile]`): without HTA, or on a trace HTA
cannot read, every function returns None and the report shows the kernel classes only."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from functools import lru_cache
from pathlib import Path

IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")  # HTA's idle_category values


@contextlib.contextmanager
def _quiet():
    """HTA prints, logs and warns (pandas deprecations) for each file it parses; keep the caller's terminal clean."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
    finally:
        root.setLevel(level)


def _figures(path: Path, steps: int) -> dict[str, float]:
    from hta.trace_analysis import TraceAnalysis

    with _quiet():
        analysis = TraceAnalysis(trace_files={0: str(path.resolve())}, include_last_profiler_step=True)
        idle, _ = analysis.get_idle_time_breakdown(visualize=False)
        overlap = analysis.get_comm_comp_overlap(visualize=False)
    out: dict[str, float] = {}
    if len(idle):
        # The busiest stream (least idle) is the compute stream; its idle time by cause, µs -> ms per step.
        per_stream = idle.groupby("stream")["idle_time"].sum()
        stream = per_stream.idxmin()
        mine = idle[idle["stream"] == stream].groupby("idle_category")["idle_time"].sum()
        for category in IDLE_CATEGORIES:
            out[f"idle_{category}_ms"] = float(mine.get(category, 0.0)) / 1000.0 / steps
    if len(overlap) and "comp_comm_overlap_pctg" in overlap:
        value = float(overlap["comp_comm_overlap_pctg"].iloc[0])
        if value == value:  # HTA gives NaN when the trace has no communication
            out["comm_overlap_pct"] = value
    return out


@lru_cache(maxsize=128)
def _cached(path: str, size: int, mtime_ns: int, steps: int) -> tuple[tuple[str, float], ...] | None:
    try:
        return tuple(_figures(Path(path), steps).items())
    except ImportError:
        return None
    except Exception:  # HTA could not analyse this trace: the kernel classes still stand
        return None


def hta_figures(path: Path, steps: int = 1) -> dict[str, float] | None:
    """HTA's idle time by cause on the compute stream (`idle_host_wait_ms`, `idle_kernel_wait_ms`,
    `idle_other_ms`, per step) and `comm_overlap_pct` (share of communication time with compute beside it)
    of one GPU trace; None without HTA or when HTA cannot analyse it."""
    stat = Path(path).stat()
    found = _cached(str(path), stat.st_size, stat.st_mtime_ns, max(steps, 1))
    return dict(found) if found is not None else None
