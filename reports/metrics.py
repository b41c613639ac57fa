"""Read a run directory's metrics.jsonl and status.json, tolerating a truncated last line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
STATUS_FILE = "status.json"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Step rows of a metrics.jsonl, in file order.

    A writer killed mid-line leaves a partial last line: it is ignored. A malformed line anywhere
    else is an error, because it means the file was corrupted rather than cut short.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    rows: list[dict[str, Any]] = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            is_last = index == len(lines) - 1 or all(not rest.strip() for rest in lines[index + 1 :])
            if is_last and not raw.endswith(b"\n"):
                break  # truncated tail: the writer died mid-line
            raise ValueError(f"{path}:{index + 1}: not a JSON object: {line[:80]!r}") from None
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The trainer's (or launcher's) final status.json, or None when the run has not finished."""
    path = Path(run_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def finite(value: Any) -> bool:
    """True for a real, finite number."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
