"""Nsight Systems reports of command trainers (`profile.nsys-rep` in a run dir) as trace events for the kernel
classifier: exported once to SQLite with `nsys export` (where `nsys` is on PATH), then kernels, copies, sets,
CUDA runtime launches and NVTX ranges are read into the Chrome-trace event shape reports/profile_trace.py reads.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

NSYS_REPORT = "profile.rank0.nsys-rep"  # orchestrator/spec/profile_spec.py: rank 0 records
# A one-rank local run starts without torchrun, so RANK is unset when nsys expands `%q{RANK}`: an empty string.
NSYS_REPORTS = (NSYS_REPORT, "profile.rank.nsys-rep")
NSYS_SQLITE = (
    "profile.sqlite"  # an export made beside the report (by a user or an earlier run of this module)
)
_NS_PER_US = 1000.0
BRIDGE_STEP_KEYS = ("profiling.profile_step_start", "profiling.profile_step_end")  # Bridge's Hydra overrides

# (table, category, name column or None): name columns hold StringIds ids.
_GPU_TABLES = (
    ("CUPTI_ACTIVITY_KIND_KERNEL", "kernel", "demangledName"),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", "gpu_memcpy", None),
    ("CUPTI_ACTIVITY_KIND_MEMSET", "gpu_memset", None),
)


def _tables(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _x(cat: str, name: str, start: int, end: int, pid: Any, tid: Any, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": start / _NS_PER_US,
            "dur": (end - start) / _NS_PER_US, "args": args}  # fmt: skip


def events_from_sqlite(path: Path) -> list[dict[str, Any]]:
    """Trace events of an `nsys export --type sqlite` file (ValueError when it holds no CUDA kernel table)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = _tables(db)
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables or "StringIds" not in tables:
            raise ValueError(f"{path}: not an Nsight Systems SQLite export with CUDA kernels")
        strings = dict(db.execute("SELECT id, value FROM StringIds"))
        events = []
        for table, cat, name_column in _GPU_TABLES:
            if table not in tables:
                continue
            column = name_column or "NULL"
            query = f"SELECT start, end, deviceId, streamId, correlationId, {column} FROM {table}"
            for start, end, device, stream, correlation, name in db.execute(query):
                label = strings.get(name, str(name)) if name_column else table.rsplit("_", 1)[-1].title()
                events.append(
                    _x(cat, label, start, end, device, stream, correlation=correlation, stream=stream)
                )
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
            query = "SELECT start, end, globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME"
            for start, end, tid, correlation, name in db.execute(query):
                events.append(
                    _x(
                        "cuda_runtime",
                        strings.get(name, ""),
                        start,
                        end,
                        "host",
                        tid,
                        correlation=correlation,
                    )
                )
        if "NVTX_EVENTS" in tables:
            query = "SELECT start, end, globalTid, text, textId FROM NVTX_EVENTS WHERE end IS NOT NULL"
            for start, end, tid, text, text_id in db.execute(query):
                events.append(
                    _x("user_annotation", text or strings.get(text_id, ""), start, end, "host", tid)
                )
        return events
    finally:
        db.close()


def megatron_steps(run_dir: Path) -> int | None:
    """Profiled steps from the attempt's recorded argv (recipe.yaml): --profile-step-end − --profile-step-start
    (Megatron-LM), or profiling.profile_step_end − profiling.profile_step_start (Megatron-Bridge's overrides)."""
    try:
        argv = [
            str(a)
            for a in (yaml.safe_load((Path(run_dir) / "recipe.yaml").read_text()) or {}).get("argv") or []
        ]
        flags = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--profile-step")}
        flags.update(a.split("=", 1) for a in argv if a.startswith(tuple(f"{k}=" for k in BRIDGE_STEP_KEYS)))
        for start, end in (("--profile-step-start", "--profile-step-end"), BRIDGE_STEP_KEYS):
            if start in flags and end in flags:
                return int(flags[end]) - int(flags[start])
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        return None


def nsys_events(run_dir: Path) -> list[dict[str, Any]] | None:
    """The run dir's Nsight Systems profile as trace events: its SQLite export, else `nsys export` of the
    report into a temporary folder; None when there is neither, or no `nsys` to export with."""
    run_dir = Path(run_dir)
    if (run_dir / NSYS_SQLITE).is_file():
        return events_from_sqlite(run_dir / NSYS_SQLITE)
    nsys = shutil.which("nsys")
    report = next((run_dir / n for n in NSYS_REPORTS if (run_dir / n).is_file()), None)
    if report is None or nsys is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / NSYS_SQLITE
        done = subprocess.run([nsys, "export", "--type", "sqlite", "--output", str(out), str(report)],
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        if done.returncode != 0 or not out.is_file():
            return None
        return events_from_sqlite(out)
