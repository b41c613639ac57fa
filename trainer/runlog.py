"""Run-directory files the trainer writes: metrics.jsonl rows, status.json (atomic, last), env.json (no torch)."""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any, TextIO


def _finite_or_none(value: Any) -> Any:
    """NaN/inf are not JSON: spell them null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write a temporary file next to `path`, then os.replace it: readers see the old or the new file, whole."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


class MetricsWriter:
    """<out>/metrics.jsonl: one JSON object per training step, appended and flushed line by line."""

    def __init__(self, path: Path):
        self.path = path
        self._file: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 (closed in close())

    def write(self, row: dict) -> None:
        clean = {k: _finite_or_none(v) for k, v in row.items()}
        self._file.write(json.dumps(clean, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def status_record(*, state: str, reason: str | None, steps_completed: int, steps_planned: int,
                  skipped_iterations: int, nan_iterations: int, flops_per_step: float, world_size: int,
                  device: str, gpu_name: str | None, torch_version: str, params: int, started_at: float,
                  ended_at: float) -> dict:
    """The status.json contract (DESIGN.md, run directory)."""
    return {
        "state": state,
        "reason": reason,
        "steps_completed": steps_completed,
        "steps_planned": steps_planned,
        "skipped_iterations": skipped_iterations,
        "nan_iterations": nan_iterations,
        "flops_per_step": float(flops_per_step),
        "world_size": world_size,
        "device": device,
        "gpu_name": gpu_name,
        "torch_version": torch_version,
        "params": params,
        "started_at": started_at,
        "ended_at": ended_at,
    }


def one_line(err: BaseException) -> str:
    """`Type: message` on one line, for status.json's reason."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def base_env() -> dict:
    """Host facts that need no torch."""
    return {
        "hostname": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
