"""benchmarks/ep_scaling.py's profile summary (all-to-all time, its overlap with compute, host syncs) and parity
figures, on a hand-made Chrome trace and metrics rows: what the H200 × 2 session reads off rank 0's trace."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import ep_scaling  # noqa: E402


def _kernel(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def test_trace_summary_splits_all_to_all_into_overlapped_and_exposed(tmp_path):
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#6", "ts": 0.0, "dur": 1000.0, "pid": 1},
        _kernel("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", 100.0, 400.0),  # compute 100..500
        _kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 300.0, 400.0),  # a2a 300..700
        _kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 800.0, 100.0),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventSynchronize", "ts": 50.0, "dur": 5.0, "pid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 950.0, "dur": 5.0, "pid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 60.0, "dur": 5.0, "pid": 1},
        _kernel("ncclDevKernel_SendRecv(x)", 5000.0, 100.0),  # outside the profiled step: not counted
    ]
    trace = tmp_path / "profile-trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    got = ep_scaling.trace_summary(trace)
    assert got["steps"] == 1 and got["step_ms"] == 1.0
    assert got["all_to_all_ms"] == 0.4 and got["all_to_all_kernels"] == 1
    assert got["all_to_all_overlapped_ms"] == 0.2 and got["all_to_all_exposed_ms"] == 0.2
    assert got["all_reduce_ms"] == 0.1
    assert got["gpu_busy_ms"] == 0.7 and got["gpu_idle_ms"] == 0.3  # 100..700 and 800..900 busy
    assert got["host_syncs"] == 2  # the async copy is no sync


def test_parity_reports_the_largest_relative_difference():
    base = [{"loss": 10.0, "grad_norm": 2.0}, {"loss": 9.0, "grad_norm": 1.0}]
    ep = [{"loss": 10.0, "grad_norm": 2.002}, {"loss": 9.009, "grad_norm": 1.0}]
    got = ep_scaling.parity(ep, base)
    assert got["steps"] == 2
    assert got["loss_max_rel"] == pytest.approx(1e-3) and got["grad_norm_max_rel"] == pytest.approx(1e-3)


def test_variants_parse():
    assert ep_scaling.parse_variant("padded:model.moe.capacity_factor=1.0,model.moe.pad_to_capacity=true") == (
        "padded", ["model.moe.capacity_factor=1.0", "model.moe.pad_to_capacity=true"])
    assert ep_scaling.parse_variant("dropless:") == ("dropless", [])
