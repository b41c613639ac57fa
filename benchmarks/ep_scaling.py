"""Expert-parallel weak scaling of the MoE proxy on one node: EP = 1, 2, 4, 8 GPUs, same per-GPU batch.

    python benchmarks/ep_scaling.py --out /tmp/ep [--gpus 1,2,4,8] [--set model.moe.pad_to_capacity=true ...]

Each size is one real `torchrun --nproc-per-node N -m trainer` run of benchmarks/recipes/moe_proxy.yaml with
parallel.expert = N (the 128 experts sharded N ways, tokens crossing GPUs by all-to-all) and the global batch
scaled with N (16 sequences per GPU per step). Weak-scaling efficiency = TFLOP/s/GPU at N ÷ TFLOP/s/GPU at 1
(goal ≥ 90 % within one node). Prints one JSON object per size and a summary; NVLink multicast stays off.
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


def run_size(gpus: int, out: Path, overrides: list[str]) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **NO_MULTICAST)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus),
            "-m", "trainer", "--recipe", str(RECIPE), "--out", str(out),
            "--set", f"parallel.expert={gpus}",
            "--set", f"training.global_batch_size={SEQUENCES_PER_GPU * gpus}"]
    for item in overrides:
        argv += ["--set", item]
    return {"gpus": gpus, "ep": gpus, **run_and_summarize(argv, out, env)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gpus", default="1,2,4,8", help="comma-separated GPU counts (EP sizes)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override key=value")
    args = ap.parse_args()
    results = []
    for gpus in (int(g) for g in args.gpus.split(",")):
        result = run_size(gpus, args.out / f"ep{gpus}", args.overrides)
        results.append(result)
        print(json.dumps(result), flush=True)
    base = next((r for r in results if r["gpus"] == 1 and r["tflops_per_gpu"]), None)
    for r in results:
        if base and r["tflops_per_gpu"]:
            r["weak_scaling_efficiency"] = round(r["tflops_per_gpu"] / base["tflops_per_gpu"], 4)
    print(json.dumps({"summary": results, "overrides": args.overrides}, indent=2))


if __name__ == "__main__":
    main()
