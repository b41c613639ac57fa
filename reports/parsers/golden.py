"""Reference figures: Megatron-LM and Megatron-Bridge golden-values JSON as step rows, Bridge verification cards as figures.

Megatron-LM goldens (tests/functional_tests/test_cases/**/golden_values_*.json):
`{metric: {start_step, end_step, step_interval, values: {"<step>": float | "nan"}}}`, or the legacy
form where `values` is a list (step = start_step + i × step_interval) plus top-level scalars such as
`iteration_timing_avg` (seconds). Steps are Megatron iteration numbers (1-based). `"nan"` is how the
golden writer marks a point it has no value for (steps a resumed run did not run, the tail of a run
that stopped early, sparsely sampled `iteration-time`), so it becomes None, not a NaN loss.
Goldens never say whether an iteration was skipped or NaN: rows keep `skipped`/`nan` None.

Megatron-Bridge goldens: `{"0": {"lm loss", "elapsed time per iteration (ms)", "GPU utilization"}, ...,
"alloc": GB, "max_alloc": GB}`; keys are 0-based step indices, so step = key + 1 (key "0" is the
first iteration, the warm-up one), and `alloc`/`max_alloc` are decimal GB (mem-*-gigabytes).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from reports.parsers.rows import Row, gb_to_gib, new_row

# Megatron-LM golden metric → (row field or None for extra[<extra key>], scale to the row's unit)
LM_METRICS: dict[str, tuple[str | None, str | None, float]] = {
    "lm loss": ("loss", None, 1.0),
    "iteration-time": ("step_time_ms", None, 1000.0),  # seconds in the golden file
    "mem-allocated-bytes": ("mem_allocated_gib", None, 1.0 / 2**30),
    "mem-max-allocated-bytes": ("mem_max_allocated_gib", None, 1.0 / 2**30),
    "num-zeros": (None, "num zeros", 1.0),  # the iteration line's name for it
}
BRIDGE_METRICS: dict[str, str] = {
    "lm loss": "loss",
    "elapsed time per iteration (ms)": "step_time_ms",
    "GPU utilization": "tflops_per_gpu",
}

_GPU_RE = re.compile(r"^(?:[A-Z]{1,2}\d{2,3}[A-Z]?|RTX\w*|MI\d{3}\w*)$")


@dataclass
class GoldenValues:
    """Rows (one per step that has at least one value) and file-level scalars of a golden file."""

    schema: str  # "megatron-lm" | "megatron-lm-legacy" | "megatron-bridge" | "empty"
    rows: list[Row]
    scalars: dict[str, float] = field(default_factory=dict)
    points: dict[str, int] = field(default_factory=dict)  # metric → values present
    missing: dict[str, int] = field(default_factory=dict)  # metric → "nan" (no value) points

    def series(self, key: str) -> dict[int, float]:
        """step → value of a row field, or of an `extra` key, where present."""
        out: dict[int, float] = {}
        for row in self.rows:
            value = row.get(key, row["extra"].get(key))
            if value is not None:
                out[row["step"]] = value
        return out


@dataclass(frozen=True)
class CardFigure:
    """One reference figure of a Bridge model-verification card."""

    item: str  # path under `items`, e.g. "pretrain.H100" or "pretrain_weak_scaling.GB300.points[1]"
    gpu: str | None
    metric: str  # e.g. "last_10_steps_model_tflops_per_gpu_avg"
    value: float
    status: str | None = None
    precision: str | None = None
    num_gpus: int | None = None
    global_batch_size: int | None = None


def read_golden_values(path: str | os.PathLike[str]) -> GoldenValues:
    """A Megatron-LM (dict or legacy list schema) or Megatron-Bridge golden-values file as rows."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    data = json.loads(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: golden values must be a JSON object, not {type(data).__name__}")
    if not data:
        return GoldenValues("empty", [])
    series = {k: v for k, v in data.items() if isinstance(v, dict) and "values" in v}
    if series:
        return _read_lm(data, series)
    if any(k.isdigit() and isinstance(v, dict) for k, v in data.items()):
        return _read_bridge(data)
    raise ValueError(f"{path}: not a Megatron-LM or Megatron-Bridge golden-values file")


def _value(raw: Any) -> float | None:
    """A golden point: a number, or None for the `"nan"` placeholder (and any non-finite value)."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    value = float(raw)
    return value if math.isfinite(value) else None


def _read_lm(data: dict[str, Any], series: dict[str, dict[str, Any]]) -> GoldenValues:
    legacy = any(isinstance(s["values"], list) for s in series.values())
    by_step: dict[int, Row] = {}
    points: dict[str, int] = {}
    missing: dict[str, int] = {}
    for metric, spec in series.items():
        values = spec["values"]
        if isinstance(values, list):
            start, interval = int(spec.get("start_step", 0)), int(spec.get("step_interval", 1)) or 1
            pairs = [(start + i * interval, v) for i, v in enumerate(values)]
        else:
            pairs = [(int(k), v) for k, v in values.items()]
        target, extra_key, scale = LM_METRICS.get(metric, (None, metric, 1.0))
        points[metric] = missing[metric] = 0
        for step, raw in pairs:
            value = _value(raw)
            if value is None:
                missing[metric] += 1
                continue
            points[metric] += 1
            row = by_step.get(step)
            if row is None:
                row = by_step[step] = new_row(step)
            if target is not None:
                row[target] = value * scale
            else:
                row["extra"][extra_key] = value * scale
    scalars: dict[str, float] = {}
    for key, raw in data.items():
        value = _value(raw)
        if key not in series and value is not None:
            scalars[key] = value
    if "iteration_timing_avg" in scalars:
        scalars["step_time_ms"] = scalars["iteration_timing_avg"] * 1000.0
    rows = [by_step[s] for s in sorted(by_step)]
    return GoldenValues("megatron-lm-legacy" if legacy else "megatron-lm", rows, scalars, points, missing)


def _read_bridge(data: dict[str, Any]) -> GoldenValues:
    rows: list[Row] = []
    points: dict[str, int] = {}
    missing: dict[str, int] = {}
    scalars: dict[str, float] = {}
    for key, entry in data.items():
        if not (key.isdigit() and isinstance(entry, dict)):
            value = _value(entry)
            if value is not None:
                scalars[key] = value
            continue
        row = new_row(int(key) + 1)
        for metric, raw in entry.items():
            value = _value(raw)
            if value is None:
                missing[metric] = missing.get(metric, 0) + 1
                continue
            points[metric] = points.get(metric, 0) + 1
            target = BRIDGE_METRICS.get(metric)
            if target is not None:
                row[target] = value
            else:
                row["extra"][metric] = value
        rows.append(row)
    if "alloc" in scalars:
        scalars["mem_allocated_gib"] = gb_to_gib(scalars["alloc"])
    if "max_alloc" in scalars:
        scalars["mem_max_allocated_gib"] = gb_to_gib(scalars["max_alloc"])
    rows.sort(key=lambda r: r["step"])
    return GoldenValues("megatron-bridge", rows, scalars, points, missing)


def read_card(path: str | os.PathLike[str]) -> list[CardFigure]:
    """Every numeric metric of a Bridge model-verification card (`card.yaml`), with the item path,
    GPU and, where given, status, precision, GPU count and global batch size."""
    import yaml  # deferred: only card readers need it

    with open(path, encoding="utf-8") as fh:
        card = yaml.safe_load(fh) or {}
    figures: list[CardFigure] = []
    _walk_card(card.get("items") or {}, [], {}, figures)
    return figures


def _walk_card(node: Any, path: list[str], inherited: dict[str, Any], out: list[CardFigure]) -> None:
    if isinstance(node, list):
        for i, child in enumerate(node):
            _walk_card(child, [*path[:-1], f"{path[-1]}[{i}]"] if path else [f"[{i}]"], inherited, out)
        return
    if not isinstance(node, dict):
        return
    here = dict(inherited)
    for key in ("status", "precision", "num_gpus", "global_batch_size"):
        if key in node and not isinstance(node[key], (dict, list)):
            here[key] = node[key]
    metrics = node.get("metrics")
    if isinstance(metrics, dict):
        gpu = next((p.split("[")[0] for p in reversed(path) if _GPU_RE.match(p.split("[")[0])), None)
        for metric, raw in metrics.items():
            value = _value(raw)
            if value is None:
                continue
            out.append(
                CardFigure(
                    item=".".join(path),
                    gpu=gpu,
                    metric=str(metric),
                    value=value,
                    status=here.get("status"),
                    precision=here.get("precision"),
                    num_gpus=here.get("num_gpus"),
                    global_batch_size=here.get("global_batch_size"),
                )
            )
    for key, child in node.items():
        if key != "metrics" and isinstance(child, (dict, list)):
            _walk_card(child, [*path, str(key)], here, out)


__all__ = ["CardFigure", "GoldenValues", "read_card", "read_golden_values"]
