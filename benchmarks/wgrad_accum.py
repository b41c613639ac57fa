"""Time one MoE layer's expert weight-gradient GEMMs with their accumulation, three ways, on a GPU.

    python benchmarks/wgrad_accum.py [--tokens 65536] [--experts 128] [--hidden 2048] [--ffn 768] [--iters 20]

- `torch-gemm-only`: torch's grouped_mm alone (its result dropped): the GEMM's own time;
- `torch`: torch's grouped_mm makes each micro-batch's gradient, then it is added to the gradient (what
  autograd does: the add is a separate pass over the gradient);
- `te-cutlass`: Transformer Engine's grouped GEMM with accumulate, NVTE_USE_CUTLASS_GROUPED_GEMM=1 (CUTLASS
  grouped GEMM on Hopper, beta = 1 in the epilogue);
- `te-cublas`: the same call without that variable (one cuBLAS GEMM per expert over several streams).

Each way runs in its own process (TE reads the variable once). The default shapes are the MoE proxy's
(benchmarks/recipes/moe_proxy.yaml): 2 × 4096 tokens × top-8 rows, 128 experts, fc1 [1536, 2048] and
fc2 [2048, 768] per expert, force-balanced (512 rows per expert). Prints one JSON line per way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WAYS = {"torch-gemm-only": {}, "torch": {}, "te-cutlass": {"NVTE_USE_CUTLASS_GROUPED_GEMM": "1"}, "te-cublas": {}}


def gemm_only(grad, x, dy, offs, splits) -> None:
    """torch's grouped weight-gradient GEMM alone (no accumulation): the floor the fused ways aim at."""
    import torch.nn.functional as F

    F.grouped_mm(dy.t(), x, offs=offs)


def measure(way: str, args: argparse.Namespace) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from trainer import grad_accum

    accumulate = {"torch": grad_accum.accumulate_with_torch, "torch-gemm-only": gemm_only}.get(
        way, grad_accum.accumulate_with_te)
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    rows = args.tokens
    counts = torch.full((args.experts,), rows // args.experts, dtype=torch.int32, device=dev)
    offs = counts.cumsum(0).to(torch.int32)
    splits = counts.tolist()
    shapes = {"fc1": (2 * args.ffn, args.hidden), "fc2": (args.hidden, args.ffn)}  # [out, in] per expert
    result = {"way": way, "tokens": rows, "experts": args.experts, "ms": {}}
    for name, (out_f, in_f) in shapes.items():
        x = torch.randn(rows, in_f, device=dev, dtype=bf16)
        dy = torch.randn(rows, out_f, device=dev, dtype=bf16)
        grad = torch.zeros(args.experts, out_f, in_f, device=dev, dtype=bf16)
        for _ in range(3):
            accumulate(grad, x, dy, offs, splits)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(args.iters):
            accumulate(grad, x, dy, offs, splits)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / args.iters
        flops = 2 * rows * out_f * in_f
        result["ms"][name] = round(ms, 4)
        result.setdefault("tflops", {})[name] = round(flops / ms / 1e9, 1)
    if way == "torch-gemm-only":
        return result
    check = torch.zeros(args.experts, 64, 128, device=dev, dtype=bf16)
    ref = check.clone()
    xs, dys = torch.randn(rows, 128, device=dev, dtype=bf16), torch.randn(rows, 64, device=dev, dtype=bf16)
    accumulate(check, xs, dys, offs, splits)
    grad_accum.accumulate_with_torch(ref, xs, dys, offs, splits)
    result["max_rel_err_vs_torch"] = float((check.float() - ref.float()).abs().max() / ref.float().abs().max())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2 * 4096 * 8)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=768)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--way", choices=sorted(WAYS), help=argparse.SUPPRESS)  # one way, in this process
    args = parser.parse_args()
    if args.way:
        print(json.dumps(measure(args.way, args)), flush=True)
        return
    for way, env in WAYS.items():
        child_env = {k: v for k, v in os.environ.items() if k != "NVTE_USE_CUTLASS_GROUPED_GEMM"} | env
        argv = [sys.executable, __file__, "--way", way, "--tokens", str(args.tokens), "--experts",
                str(args.experts), "--hidden", str(args.hidden), "--ffn", str(args.ffn), "--iters", str(args.iters)]
        proc = subprocess.run(argv, env=child_env, capture_output=True, text=True)
        line = proc.stdout.strip().splitlines()[-1:] or [json.dumps({"way": way, "error": proc.stderr[-800:]})]
        print(line[0], flush=True)


if __name__ == "__main__":
    main()
