"""Builders of CampaignView objects for the report tests: synthetic step rows run through the real window and gates."""

from __future__ import annotations

import math
from typing import Any

from reports.gates import GateSpec, evaluate
from reports.views import CampaignView, CellView
from reports.window import summarize

GENERATED_AT = "2026-12-02T12:00:00Z"
AXES = ["model.moe.capacity_factor", "moe.dispatcher_sms"]
GATES = GateSpec(tflops_per_gpu_min=300.0, peak_alloc_gib_max=70.0)

FP_A: dict[str, Any] = {
    "gpu_name": "NVIDIA H200",
    "gpu_count": 8,
    "driver": "580.82.07",
    "cuda": "13.0",
    "torch": "2.11.0+cu130",
    "transformer_engine": "2.20.2",
    "nccl": "2.27.3",
    "container_image": "nvcr.io/nvidia/pytorch:26.01-py3",
    "git_sha": "f9f0556",
    "hostname": "node-001",
}


def step_rows(
    steps: int = 20,
    step_time_ms: float = 800.0,
    tflops: float = 400.0,
    tokens: float = 12000.0,
    alloc: float = 50.0,
    reserved: float = 60.0,
    loss0: float = 10.5,
    nan_at: tuple[int, ...] = (),
    skipped_at: tuple[int, ...] = (),
) -> list[dict[str, Any]]:
    """Deterministic step rows: a slow first step (compile), a small alternating jitter, a decaying loss."""
    rows = []
    for step in range(1, steps + 1):
        jitter = 1.0 + (0.01 if step % 2 else -0.01)
        t = step_time_ms * (4.0 if step == 1 else jitter)
        loss = loss0 * (0.97 ** (step - 1))
        row: dict[str, Any] = {
            "step": step,
            "loss": math.nan if step in nan_at else round(loss, 6),
            "grad_norm": 1.5,
            "lr": 3e-4,
            "step_time_ms": round(t, 3),
            "tflops_per_gpu": round(tflops * step_time_ms / t, 3),
            "tokens_per_s_per_gpu": round(tokens * step_time_ms / t, 3),
            "mem_allocated_gib": alloc * 0.8,
            "mem_max_allocated_gib": alloc,
            "mem_reserved_gib": reserved,
            "skipped": step in skipped_at,
            "nan": step in nan_at,
        }
        rows.append(row)
    return rows


def _cell(
    cell_id: str,
    params: dict[str, Any],
    *,
    repeat: int = 0,
    state: str = "completed",
    attempt: int = 1,
    rows: list[dict[str, Any]] | None = None,
    reason: str | None = None,
    failure_class: str | None = None,
    fingerprint: dict[str, Any] | None = None,
    spec: GateSpec = GATES,
    window: int = 10,
) -> CellView:
    rows = rows or []
    summary = summarize(rows, window) if rows else None
    gate = None if state in ("pending", "submitted", "running") else evaluate(spec, summary, state, reason)
    label = ", ".join(f"{k}={v}" for k, v in params.items())
    return CellView(
        cell_id=cell_id,
        point_id=cell_id[:6],
        repeat=repeat,
        label=label,
        params=params,
        state=state,
        attempt=attempt,
        reason=reason,
        failure_class=failure_class,
        run_dir=f"/ws/moe-dispatch/{cell_id}/{attempt}" if state != "pending" else None,
        summary=summary,
        gate=gate,
        rows=rows,
        fingerprint=dict(fingerprint) if fingerprint is not None else None,
    )


def campaign_view(fingerprint_b: dict[str, Any] | None = None) -> CampaignView:
    """A campaign with passing repeats, a best cell, a memory-gate failure, a NaN run, a failed and a pending cell."""
    fp_b = fingerprint_b if fingerprint_b is not None else FP_A
    cf, sms = AXES
    cells = [
        _cell("c1a0", {cf: 1.0, sms: 16}, rows=step_rows(tflops=410.0, step_time_ms=820.0), fingerprint=FP_A),
        _cell(
            "c1a1",
            {cf: 1.0, sms: 16},
            repeat=1,
            rows=step_rows(tflops=405.0, step_time_ms=830.0),
            fingerprint=FP_A,
        ),
        _cell(
            "c2b0",
            {cf: 1.25, sms: 24},
            rows=step_rows(tflops=455.5, step_time_ms=760.0, alloc=62.0),
            fingerprint=fp_b,
        ),
        _cell(
            "c3c0",
            {cf: 1.5, sms: 24},
            rows=step_rows(tflops=470.0, step_time_ms=740.0, alloc=75.25, reserved=78.0),
            fingerprint=FP_A,
        ),
        _cell(
            "c4d0",
            {cf: 1.5, sms: 32},
            rows=step_rows(tflops=290.0, step_time_ms=1100.0, nan_at=(17, 18), skipped_at=(18,)),
            fingerprint=FP_A,
        ),
        _cell(
            "c5e0",
            {cf: 2.0, sms: 32},
            state="failed",
            rows=step_rows(steps=3, tflops=300.0),
            reason="CUDA out of memory on rank 3",
            failure_class="oom",
            fingerprint=FP_A,
        ),
        _cell("c6f0", {cf: 2.0, sms: 16}, state="pending", attempt=0),
    ]
    return CampaignView(
        name="moe-dispatch",
        description="Dispatcher SMs × expert capacity factor on 8×H200.",
        axes=list(AXES),
        cells=cells,
        gates=GATES.model_dump(exclude_none=True),
        window=10,
        source_file="campaigns/moe-dispatch.yaml",
        generated_at=GENERATED_AT,
    )


def mismatched_view() -> CampaignView:
    """The standard campaign, with one cell run under a different torch and driver."""
    return campaign_view(fingerprint_b={**FP_A, "torch": "2.12.0+cu130", "driver": "590.10", "hostname": "x"})


HOSTILE = '<script>alert("x")</script> & <b>bold</b>'


def hostile_view() -> CampaignView:
    """User-controlled strings carrying HTML and Markdown special characters everywhere they can appear."""
    axis = 'model.<i>cf</i>|"q"'
    cells = [
        _cell(
            "h<1>",
            {axis: HOSTILE},
            rows=step_rows(),
            fingerprint={**FP_A, "container_image": HOSTILE},
        ),
        _cell(
            "h&2",
            {axis: "plain"},
            state="failed",
            reason=HOSTILE,
            failure_class="<oom>",
            fingerprint={**FP_A, "git_sha": "</script><script>alert(2)</script>"},
        ),
    ]
    return CampaignView(
        name='camp<a href="x">aign</a>',
        description=HOSTILE,
        axes=[axis],
        cells=cells,
        gates=GATES.model_dump(exclude_none=True),
        window=10,
        source_file="<evil>.yaml",
        generated_at=GENERATED_AT,
    )


def empty_view() -> CampaignView:
    """A campaign where nothing completed: one failed cell without rows, one pending, one running."""
    cells = [
        _cell("e1", {"x": 1}, state="failed", reason="node failure", failure_class="infra"),
        _cell("e2", {"x": 2}, state="pending", attempt=0),
        _cell("e3", {"x": 3}, state="running", rows=step_rows(steps=2)),
    ]
    return CampaignView(
        name="empty",
        description="",
        axes=["x"],
        cells=cells,
        gates={},
        window=10,
        generated_at=GENERATED_AT,
    )
