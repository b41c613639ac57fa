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

Writing (`lm_document`): the reader keeps each Megatron-LM series' layout (start/end/interval, every step the
file lists, list or dict form) and the file's scalar keys, so a file read and written back is the same JSON;
`rows_layout` gives step rows of a run (mbx metrics.jsonl rows included) the layout of a new golden file.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from reports import limits
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


@dataclass(frozen=True)
class SeriesLayout:
    """How a Megatron-LM golden file lays out one metric: its header and every step it lists, "nan" ones too."""

    start_step: int
    end_step: int
    step_interval: int
    steps: tuple[int, ...]
    as_list: bool = False  # the legacy schema: values is a list on the start + i × interval grid


@dataclass
class GoldenValues:
    """Rows (one per step that has at least one value) and file-level scalars of a golden file."""

    schema: str  # "megatron-lm" | "megatron-lm-legacy" | "megatron-bridge" | "empty"
    rows: list[Row]
    scalars: dict[str, float] = field(default_factory=dict)
    points: dict[str, int] = field(default_factory=dict)  # metric → values present
    missing: dict[str, int] = field(default_factory=dict)  # metric → "nan" (no value) points
    layout: dict[str, SeriesLayout] = field(default_factory=dict)  # Megatron-LM series, in file order
    scalar_keys: tuple[str, ...] = ()  # the file's own top-level scalars (not derived ones), in file order

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
    """A Megatron-LM (dict or legacy list schema) or Megatron-Bridge golden-values file as rows; LimitError (a
    ValueError) past limits.MAX_GOLDEN_BYTES, MAX_GOLDEN_VALUES or MAX_JSON_DEPTH."""
    raw = limits.read_bytes_bounded(path, limits.MAX_GOLDEN_BYTES, "a golden-values file")
    text = raw.decode("utf-8")
    data = limits.json_loads_bounded(text, path) if text.strip() else {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: golden values must be a JSON object, not {type(data).__name__}")
    if not data:
        return GoldenValues("empty", [])
    count = _value_count(data)
    if count > limits.MAX_GOLDEN_VALUES:
        raise limits.LimitError(f"{path}: too many values ({count:,} > {limits.MAX_GOLDEN_VALUES:,}, the limit "
                                "for a golden-values file)")  # fmt: skip
    series = {k: v for k, v in data.items() if isinstance(v, dict) and "values" in v}
    if series:
        return _read_lm(data, series)
    if any(k.isdigit() and isinstance(v, dict) for k, v in data.items()):
        return _read_bridge(data)
    raise ValueError(f"{path}: not a Megatron-LM or Megatron-Bridge golden-values file")


def _value_count(data: dict[str, Any]) -> int:
    """Step values a golden document holds (Megatron-LM series' `values`, Megatron-Bridge steps' metrics)."""
    count = 0
    for entry in data.values():
        if isinstance(entry, dict):
            values = entry.get("values")
            count += len(values) if isinstance(values, (list, dict)) else len(entry)
    return count


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
    layout: dict[str, SeriesLayout] = {}
    for metric, spec in series.items():
        values = spec["values"]
        if isinstance(values, list):
            start, interval = int(spec.get("start_step", 0)), int(spec.get("step_interval", 1)) or 1
            pairs = [(start + i * interval, v) for i, v in enumerate(values)]
        else:
            pairs = [(int(k), v) for k, v in values.items()]
        layout[metric] = _layout(spec, [step for step, _ in pairs], isinstance(values, list))
        target, extra_key, scale = LM_METRICS.get(metric, (None, metric, 1.0))
        points[metric] = missing[metric] = 0
        for step, raw in pairs:
            value = float(raw) if raw.__class__ is float or raw.__class__ is int else _value(raw)
            if value is None or not math.isfinite(value):
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
    own = tuple(scalars)
    if "iteration_timing_avg" in scalars:
        scalars["step_time_ms"] = scalars["iteration_timing_avg"] * 1000.0
    rows = [by_step[s] for s in sorted(by_step)]
    schema = "megatron-lm-legacy" if legacy else "megatron-lm"
    return GoldenValues(schema, rows, scalars, points, missing, layout, own)


def _layout(spec: dict[str, Any], steps: list[int], as_list: bool) -> SeriesLayout:
    first, last = (steps[0], steps[-1]) if steps else (0, 0)
    return SeriesLayout(int(spec.get("start_step", first)), int(spec.get("end_step", last)),
                        int(spec.get("step_interval", 1)), tuple(steps), as_list)  # fmt: skip


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


# ---- writing Megatron-LM golden values ---------------------------------------------------------------------
def _row_value(row: Row, metric: str) -> float | None:
    """The row's value of a golden metric in the row's unit: its contract field, else its extra (nested in
    `extra` for parsed rows, top-level in metrics.jsonl rows)."""
    target, extra_key, _scale = LM_METRICS.get(metric, (None, metric, 1.0))
    raw = row.get(target) if target else (row.get("extra") or {}).get(extra_key, row.get(extra_key))
    return _value(raw)


def _unscale(value: float, scale: float) -> float:
    """A row value back in the golden file's unit: the shortest decimal that the reader's scaling maps to
    exactly `value` (a file's 8.99025 s, read as 8990.25 ms, is written as 8.99025, not 8.990250000000001)."""
    if scale == 1.0:
        return value
    raw = value / scale
    for digits in range(1, 18):
        candidate = float(f"{raw:.{digits}g}")
        if candidate * scale == value:
            return candidate
    return raw


def rows_layout(rows: list[Row], metrics: tuple[str, ...] = tuple(LM_METRICS)) -> dict[str, SeriesLayout]:
    """A golden layout for step rows: each metric that has a value, from its first to its last such step over
    every step the rows list (a step without the value is written "nan"), the interval the smallest step gap."""
    steps = sorted({int(row["step"]) for row in rows if isinstance(row.get("step"), int)})
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    interval = min(gaps) if gaps else 1
    layout: dict[str, SeriesLayout] = {}
    for metric in metrics:
        have = [
            row["step"]
            for row in rows
            if isinstance(row.get("step"), int) and _row_value(row, metric) is not None
        ]
        if have:
            first, last = min(have), max(have)
            span = tuple(s for s in steps if first <= s <= last)
            layout[metric] = SeriesLayout(first, last, interval, span)
    return layout


def lm_document(golden: GoldenValues) -> dict[str, Any]:
    """The Megatron-LM golden-values JSON of `golden`: each series of its layout with the rows' values in the
    file's unit ("nan" where a listed step has none; a list in the legacy form), then the file's scalars."""
    if golden.schema not in ("megatron-lm", "megatron-lm-legacy", "empty"):
        raise ValueError(f"cannot write a {golden.schema} golden file as Megatron-LM golden values")
    by_step = {row["step"]: row for row in golden.rows}
    doc: dict[str, Any] = {}
    for metric, layout in golden.layout.items():
        scale = LM_METRICS.get(metric, (None, None, 1.0))[2]
        values: list[float | str] = []
        for step in layout.steps:
            value = _row_value(by_step[step], metric) if step in by_step else None
            values.append("nan" if value is None else _unscale(value, scale))
        doc[metric] = {
            "start_step": layout.start_step,
            "end_step": layout.end_step,
            "step_interval": layout.step_interval,
            "values": values
            if layout.as_list
            else {str(s): v for s, v in zip(layout.steps, values, strict=True)},
        }
    doc.update({key: golden.scalars[key] for key in golden.scalar_keys})
    return doc


def read_card(path: str | os.PathLike[str]) -> list[CardFigure]:
    """Every numeric metric of a Bridge model-verification card (`card.yaml`), with the item path,
    GPU and, where given, status, precision, GPU count and global batch size."""
    import yaml  # deferred: only card readers need it

    text = limits.read_bytes_bounded(path, limits.MAX_YAML_BYTES, "a card file").decode("utf-8")
    loader = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader
    try:
        card = yaml.load(text, Loader=loader) or {}  # noqa: S506 - a safe loader
    except RecursionError:
        raise limits.LimitError(f"{path}: nested too deeply for a card file") from None
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


__all__ = [
    "CardFigure",
    "GoldenValues",
    "SeriesLayout",
    "lm_document",
    "read_card",
    "read_golden_values",
    "rows_layout",
]
