"""Summary windows over step rows: last-N-step averages, peaks, first/last loss, NaN and skip counts."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from reports.metrics import finite
from trainer.rundir import MBX_TFLOPS

DEFAULT_WINDOW = 10


@dataclass(frozen=True)
class Summary:
    """What one attempt measured; `None` where the rows did not carry the figure."""

    steps: int
    window_first_step: int | None
    window_last_step: int | None
    window_steps: int
    step_time_ms: float | None
    step_time_ms_std: float | None
    tflops_per_gpu: float | None
    tokens_per_s_per_gpu: float | None
    peak_alloc_gib: float | None
    peak_reserved_gib: float | None
    first_loss: float | None
    last_loss: float | None
    loss_finite: bool
    nan_iterations: int
    skipped_iterations: int
    # the attempt's GPU as its node recorded it before the trainer started (node.json, read by
    # orchestrator/run/collect.py): the headroom gate judges on its memory; None where none was recorded
    gpu_name: str | None = None
    gpu_memory_gib: float | None = None
    # mbx's own Megatron-LM FLOPs count over the same window, time-weighted like tflops_per_gpu (each row's
    # `extra`, rundir.MBX_TFLOPS: a command trainer whose run dir holds Bridge's resolved config); None otherwise.
    # tflops_per_gpu stays the trainer's printed figure, the one gates and comparisons use (reports/flops_check.py)
    tflops_per_gpu_mbx: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def step_time_cv(self) -> float | None:
        """Coefficient of variation of the step time inside the window."""
        if self.step_time_ms and self.step_time_ms_std is not None:
            return self.step_time_ms_std / self.step_time_ms
        return None


def _train_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step (the last seen wins), sorted by step."""
    by_step: dict[int, dict[str, Any]] = {}
    for row in rows:
        step = row.get("step")
        if isinstance(step, int):
            by_step[step] = row
    return [by_step[s] for s in sorted(by_step)]


def window_rows(rows: list[dict[str, Any]], window: int = DEFAULT_WINDOW) -> list[dict[str, Any]]:
    """The last `window` timed, non-skipped steps, never including the run's first step (warm-up/compile)."""
    ordered = _train_rows(rows)
    if not ordered:
        return []
    first_step = ordered[0]["step"]
    if window <= 0:
        return []
    chosen = []
    for r in reversed(ordered):  # from the end: a run of 100,000 steps reads only its last few
        if r["step"] != first_step and r["step"] > 1 and not r.get("skipped") and finite(r.get("step_time_ms")):
            chosen.append(r)
            if len(chosen) == window:
                break
    return chosen[::-1]


def _extra(row: dict[str, Any], key: str) -> Any:
    """A figure under the row's `extra` (None where the row has none)."""
    extra = row.get("extra")
    return extra.get(key) if isinstance(extra, dict) else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(rows: list[dict[str, Any]], window: int = DEFAULT_WINDOW) -> Summary:
    """Summarize step rows; TFLOP/s and tokens/s are time-weighted (total work / total time) over the window."""
    ordered = _train_rows(rows)
    win = window_rows(ordered, window)
    times = [float(r["step_time_ms"]) for r in win]
    total_time = sum(times)

    def time_weighted(key: str, extra: bool = False) -> float | None:
        found = [_extra(r, key) if extra else r.get(key) for r in win]
        pairs = [(float(v), float(r["step_time_ms"])) for v, r in zip(found, win, strict=True) if finite(v)]
        if not pairs:
            return None
        weight = sum(t for _, t in pairs)
        return sum(v * t for v, t in pairs) / weight if weight else None

    std = None
    if len(times) > 1:
        mean = total_time / len(times)
        std = math.sqrt(sum((t - mean) ** 2 for t in times) / (len(times) - 1))

    def peak(*keys: str) -> float | None:
        values = [float(r[k]) for r in ordered for k in keys if finite(r.get(k))]
        return max(values) if values else None

    losses = [r.get("loss") for r in ordered if not r.get("skipped")]
    finite_losses = [float(v) for v in losses if finite(v)]
    nan_count = sum(
        1 for r in ordered if r.get("nan") or (r.get("loss") is not None and not finite(r.get("loss")))
    )
    return Summary(
        steps=len(ordered),
        window_first_step=win[0]["step"] if win else None,
        window_last_step=win[-1]["step"] if win else None,
        window_steps=len(win),
        step_time_ms=_mean(times),
        step_time_ms_std=std,
        tflops_per_gpu=time_weighted("tflops_per_gpu"),
        tokens_per_s_per_gpu=time_weighted("tokens_per_s_per_gpu"),
        peak_alloc_gib=peak("mem_max_allocated_gib", "mem_allocated_gib"),
        peak_reserved_gib=peak("mem_max_reserved_gib", "mem_reserved_gib"),
        first_loss=finite_losses[0] if finite_losses else None,
        last_loss=finite_losses[-1] if finite_losses else None,
        loss_finite=bool(ordered) and all(finite(v) for v in losses if v is not None) and bool(finite_losses),
        nan_iterations=nan_count,
        skipped_iterations=sum(1 for r in ordered if r.get("skipped")),
        tflops_per_gpu_mbx=time_weighted(MBX_TFLOPS, extra=True),
    )
