"""How long the report takes to turn one profiler trace into time per kernel class (reports/profile_trace.py),
on a synthetic Kineto trace of a given size, or on real traces given as arguments.

    .venv/bin/python benchmarks/profile_breakdown.py [--kernels 200000] [--hta] [TRACE ...]

The synthetic trace has, per kernel, one CPU op around one cudaLaunchKernel (the shape torch.profiler writes
for eager PyTorch), in 2 profiled steps; a real MoE-proxy step on an H200 has a few thousand kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reports.profile_hta import hta_figures  # noqa: E402
from reports.profile_trace import breakdown_of, load_events  # noqa: E402

NAMES = (
    "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(...)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >(...)",
    "void at::native::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(...)",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
)


def synthetic(kernels: int) -> dict:
    """Two steps of `kernels` kernels in all, 5 µs each with 1 µs gaps, each launched from its own CPU op."""
    events: list[dict] = []
    per_step = kernels // 2
    for step in range(2):
        base = step * per_step * 6.0 + 10.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step + 8}", "pid": 1,
                       "tid": 1, "ts": base - 5, "dur": per_step * 6.0 + 10})  # fmt: skip
        for i in range(per_step):
            ts, corr = base + i * 6.0, step * per_step + i
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts - 3,
                           "dur": 2.0, "args": {"External id": corr}})  # fmt: skip
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": ts - 2.5, "dur": 1.0, "args": {"correlation": corr}})  # fmt: skip
            events.append({"ph": "X", "cat": "kernel", "name": NAMES[i % len(NAMES)], "pid": 0, "tid": 7, "ts": ts,
                           "dur": 5.0, "args": {"correlation": corr, "device": 0, "stream": 7}})  # fmt: skip
    return {"schemaVersion": 1, "traceEvents": events}


def timed(path: Path, with_hta: bool) -> dict:
    t0 = time.perf_counter()
    events = load_events(path)
    t1 = time.perf_counter()
    found = breakdown_of(events, source=str(path))
    t2 = time.perf_counter()
    row = {"trace": path.name, "MB": path.stat().st_size / 1e6, "events": len(events),
           "load_s": t1 - t0, "breakdown_s": t2 - t1}  # fmt: skip
    if with_hta:
        t3 = time.perf_counter()
        row["hta_ok"] = hta_figures(path, found.steps) is not None
        row["hta_s"] = time.perf_counter() - t3
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--kernels", type=int, default=200_000)
    parser.add_argument("--hta", action="store_true", help="Also time HolisticTraceAnalysis on each trace.")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = list(args.traces)
        if not paths:
            path = Path(tmp) / f"synthetic_{args.kernels}.json"
            path.write_text(json.dumps(synthetic(args.kernels)))
            paths = [path]
        rows = [timed(p, args.hta) for p in paths]
    print("| trace | MB | events | load (s) | breakdown (s) | HTA (s) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        hta = f"{r['hta_s']:.2f}" if "hta_s" in r else "–"
        print(
            f"| {r['trace']} | {r['MB']:.1f} | {r['events']:,} | {r['load_s']:.2f} | {r['breakdown_s']:.2f} | {hta} |"
        )


if __name__ == "__main__":
    main()
