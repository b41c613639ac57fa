"""Expert-parallel weak scaling of the MoE proxy on one node: EP = 1, 2, 4, 8 GPUs, same per-GPU batch.

    python benchmarks/ep_scaling.py --out /tmp/ep [--gpus 1,2,4,8] [--set model.moe.pad_to_capacity=true ...]
        [--variant padded:model.moe.capacity_factor=1.0,model.moe.pad_to_capacity=true ...] [--profile 6:1]
    python benchmarks/ep_scaling.py --out /tmp/ep --gpus 2 --parity [--variant ...]   # EP=N vs EP=1, same N GPUs

Each size is one real `torchrun --nproc-per-node N -m trainer` run of benchmarks/recipes/moe_proxy.yaml with
parallel.expert = N (the 128 experts sharded N ways, tokens crossing GPUs by all-to-all) and the global batch
scaled with N (16 sequences per GPU per step). Weak-scaling efficiency = TFLOP/s/GPU at N ÷ TFLOP/s/GPU at 1
of the same variant (goal ≥ 95 % on 2 GPUs). Every `--variant LABEL:k=v,k=v` runs at every size (none: one
variant, `base`). Prints one JSON object per run and a summary; NVLink multicast stays off.

`--profile START:COUNT` profiles those steps on rank 0 (torch.profiler, keep them before the last-10 window) and
summarizes the trace per step: GPU busy and idle, all-to-all time (NCCL kernels of the EP exchange), how much
of it ran beside compute kernels (the overlap the chunked pipeline buys), the all-reduce time, and the host
syncs (cudaStreamSynchronize / cudaEventSynchronize / cudaDeviceSynchronize / blocking cudaMemcpy calls).

`--parity` runs, per variant, EP = 1 and EP = N on the same N GPUs and global batch (DP = N either way) and
reports the largest relative difference of the per-step loss and grad norm (bf16: rounding, not bitwise).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))

from trainer_proxies import run_and_summarize  # noqa: E402

RECIPE = ROOT / "benchmarks/recipes/moe_proxy.yaml"
SEQUENCES_PER_GPU = 16
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy")
ALL_TO_ALL = ("SendRecv", "AllToAll", "alltoall")  # NCCL kernels of all_to_all_single (grouped send/recv)


def parse_variant(text: str) -> tuple[str, list[str]]:
    """`LABEL:k=v,k=v` → (LABEL, ["k=v", "k=v"]); `LABEL:` is the plain recipe."""
    label, _, items = text.partition(":")
    if not label:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: LABEL:key=value[,key=value...]")
    return label, [item for item in items.split(",") if item]


def run_size(gpus: int, out: Path, overrides: list[str], ep: int | None = None, profile: str | None = None) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **NO_MULTICAST)
    if profile:
        env["MBX_TRAINER_PROFILE"] = profile
    ep = gpus if ep is None else ep
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus),
            "-m", "trainer", "--recipe", str(RECIPE), "--out", str(out),
            "--set", f"parallel.expert={ep}",
            "--set", f"training.global_batch_size={SEQUENCES_PER_GPU * gpus}"]
    for item in overrides:
        argv += ["--set", item]
    result = {"gpus": gpus, "ep": ep, **run_and_summarize(argv, out, env)}
    trace = out / "profile-trace.json"
    if profile and trace.is_file():
        try:
            result["profile"] = trace_summary(trace)
        except ValueError as err:  # not a trace, or past the report's size limit
            result["profile"] = {"error": str(err)[:300]}
    return result


def _is_comm(name: str) -> bool:
    return name.startswith(("ncclDevKernel", "ncclKernel")) or "nccl" in name.lower()


def trace_summary(path: Path) -> dict:
    """Per profiled step (ms): GPU kernel time busy/idle, all-to-all, its overlap with compute kernels, all-reduce
    time, and host syncs counted from the CUDA runtime calls."""
    import numpy as np

    from reports.profile_trace import load_events, step_windows, union_length

    events = load_events(path)
    windows = step_windows(events)
    steps = max(len(windows), 1)
    lo = min(w[0] for w in windows) if windows else float("-inf")
    hi = max(w[1] for w in windows) if windows else float("inf")

    def spans(keep) -> tuple[np.ndarray, np.ndarray]:
        chosen = [(e["ts"], e["ts"] + e.get("dur", 0.0)) for e in events
                  if e.get("cat") == "kernel" and lo <= e.get("ts", lo) <= hi and keep(e.get("name", ""))]
        arr = np.array(chosen, dtype=float).reshape(-1, 2)
        return arr[:, 0], arr[:, 1]

    def length(*parts: tuple[np.ndarray, np.ndarray]) -> float:
        starts = np.concatenate([p[0] for p in parts])
        ends = np.concatenate([p[1] for p in parts])
        return union_length(starts, ends) if len(starts) else 0.0

    a2a = spans(lambda n: _is_comm(n) and any(k in n for k in ALL_TO_ALL))
    reduce = spans(lambda n: _is_comm(n) and "AllReduce" in n)
    compute = spans(lambda n: not _is_comm(n))
    every = spans(lambda n: True)
    a2a_ms, compute_ms = length(a2a), length(compute)
    overlap = a2a_ms + compute_ms - length(a2a, compute)  # |A ∩ C| = |A| + |C| − |A ∪ C|
    window_ms = sum(b - a for a, b in windows)
    syncs = [e for e in events if e.get("cat") == "cuda_runtime" and lo <= e.get("ts", lo) <= hi
             and e.get("name", "").startswith(SYNC_CALLS) and not e.get("name", "").startswith("cudaMemcpyAsync")]
    per = 1e3 * steps  # µs over the window → ms per step
    return {
        "steps": steps,
        "step_ms": round(window_ms / per, 2),
        "gpu_busy_ms": round(length(every) / per, 2),
        "gpu_idle_ms": round((window_ms - length(every)) / per, 2),
        "all_to_all_ms": round(a2a_ms / per, 2),
        "all_to_all_kernels": int(len(a2a[0]) / steps),
        "all_to_all_overlapped_ms": round(overlap / per, 2),
        "all_to_all_exposed_ms": round((a2a_ms - overlap) / per, 2),
        "all_reduce_ms": round(length(reduce) / per, 2),
        "host_syncs": round(len(syncs) / steps, 1),
    }


def parity(rows_ep: list[dict], rows_base: list[dict]) -> dict:
    """Largest relative per-step difference of loss and grad norm between two runs' metrics rows."""
    def worst(key: str) -> float:
        diffs = [abs(a[key] - b[key]) / max(abs(b[key]), 1e-12) for a, b in zip(rows_ep, rows_base, strict=False)
                 if a.get(key) is not None and b.get(key) is not None]
        return max(diffs) if diffs else float("nan")

    return {"steps": min(len(rows_ep), len(rows_base)), "loss_max_rel": worst("loss"),
            "grad_norm_max_rel": worst("grad_norm")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gpus", default="1,2,4,8", help="comma-separated GPU counts (EP sizes)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override key=value")
    ap.add_argument("--variant", action="append", type=parse_variant, default=[],
                    help="LABEL:key=value[,key=value] run at every size (repeatable)")
    ap.add_argument("--profile", default=None, help="START:COUNT steps to profile on rank 0 (torch.profiler)")
    ap.add_argument("--parity", action="store_true", help="EP=1 vs EP=N on the same N GPUs, per variant")
    args = ap.parse_args()
    variants = args.variant or [("base", [])]
    results = []
    for label, extra in variants:
        for gpus in (int(g) for g in args.gpus.split(",")):
            overrides = args.overrides + extra
            if args.parity:
                from trainer.rundir import read_metrics

                base_out, ep_out = args.out / f"{label}-dp{gpus}-ep1", args.out / f"{label}-ep{gpus}"
                base = run_size(gpus, base_out, overrides, ep=1)
                ep = run_size(gpus, ep_out, overrides)
                result = {"variant": label, "gpus": gpus, "ep1": base, "epN": ep,
                          "parity": parity(read_metrics(ep_out), read_metrics(base_out))}
            else:
                result = {"variant": label, **run_size(gpus, args.out / f"{label}-ep{gpus}", overrides,
                                                       profile=args.profile)}
            results.append(result)
            print(json.dumps(result), flush=True)
    for r in results:
        base = next((b for b in results if b.get("variant") == r.get("variant") and b.get("gpus") == 1
                     and b.get("tflops_per_gpu")), None)
        if base and r.get("tflops_per_gpu"):
            r["weak_scaling_efficiency"] = round(r["tflops_per_gpu"] / base["tflops_per_gpu"], 4)
    print(json.dumps({"summary": results, "overrides": args.overrides}, indent=2))
    for r in results:  # one line each, last: what the device call's output tail shows
        if "parity" in r:
            print(f"{r['variant']:>24} EP{r['gpus']} vs EP1 on {r['gpus']} GPUs: {r['parity']}")
            continue
        prof = r.get("profile", {})
        print(f"{r['variant']:>24} EP{r['ep']}: {r.get('tflops_per_gpu')} TFLOP/s/GPU, {r.get('step_time_ms')} ms "
              f"(std {r.get('step_time_ms_std')}), weak {r.get('weak_scaling_efficiency')}, a2a "
              f"{prof.get('all_to_all_ms')} ms ({prof.get('all_to_all_overlapped_ms')} overlapped), syncs "
              f"{prof.get('host_syncs')}, idle {prof.get('gpu_idle_ms')} ms, {r.get('state')} {r.get('reason') or ''}")


if __name__ == "__main__":
    main()
