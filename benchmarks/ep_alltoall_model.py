"""All-to-all time per training step of the MoE proxy at EP 8/16/32, over NVLink vs InfiniBand, and what the
chunked dispatch pipeline (trainer/moe_pipeline.py) hides of it: a paper model, no GPU.

    python benchmarks/ep_alltoall_model.py [--ep 2,8,16,32] [--chunks 4] [--nvlink-gbs 370] [--ib-gbs 42.5]

Shapes (benchmarks/recipes/moe_proxy.yaml): 8 MoE layers, hidden 2048 in bf16 (4096 B per row), top-8 routing,
16 sequences of 4096 tokens per GPU per step as 8 micro-batches of 2 (8192 tokens, 65,536 (token, slot) rows
per micro-batch). Balanced routing sends (EP−1)/EP of a GPU's rows to other GPUs. Per layer and micro-batch
four exchanges of those rows: dispatch and combine in the forward, their gradients in the backward.

Fabric: 8 GPUs per node; the NVLink share of a GPU's traffic (peers in its node) and the InfiniBand share (peers
in other nodes) move at the same time, so an exchange takes the longer of the two. "NVLink domain" is the
hypothetical where all EP peers share NVLink (an NVL72-like domain); "8 per node + IB" is the H200 reality.
Achievable rates are assumptions: NVLink NV18 450 GB/s per direction, ~370 reached by NCCL all-to-all;
InfiniBand 400 Gb/s per GPU = 50 GB/s, ~42.5 (85%) reached.

Overlap: the pipeline issues, per layer, on a dispatcher stream: dispatch 0, dispatch 1, combine 0, dispatch 2,
combine 1, ..., and on the compute stream the chunk GEMMs, GEMMs i after dispatch i, combine i after GEMMs i.
`pipeline_ms` simulates that schedule (each stream in issue order, an op starts when its stream is free and its
input is ready); exposed = its makespan minus the GEMMs alone. The backward mirrors it with ~2× the GEMM time.
The model ignores that communication kernels and GEMMs slow each other down when they share SMs (the dispatcher
SM knob trades exactly that), and any overlap with attention (none in this pipeline).
"""

from __future__ import annotations

import argparse

LAYERS, MICRO_BATCHES, TOKENS, TOP_K, HIDDEN, FFN = 8, 8, 8192, 8, 2048, 768
ROW_BYTES = 2 * HIDDEN  # bf16
EXPERT_FLOP_PER_ROW_FWD = 2 * (HIDDEN * 2 * FFN + FFN * HIDDEN)  # SwiGLU up (gate|up) and down
STEP_COMPUTE_MS = 3.5325e14 / 419e12 * 1e3  # the fastest measured EP = 1 step (BENCHMARKS.md, issue 15): 843 ms
GPUS_PER_NODE = 8


def exchange_ms(ep: int, gbs_nvlink: float, gbs_ib: float | None, per_node: int = GPUS_PER_NODE) -> float:
    """One exchange of a micro-batch's rows of one layer, in ms: the slower of the NVLink and IB shares
    (gbs_ib None: every peer on NVLink)."""
    rows = TOKENS * TOP_K
    total = rows * ROW_BYTES
    local_peers = (min(ep, per_node) - 1) if gbs_ib is not None else ep - 1
    remote_peers = ep - 1 - local_peers
    nvlink = total * local_peers / ep / (gbs_nvlink * 1e9)
    ib = total * remote_peers / ep / (gbs_ib * 1e9) if remote_peers else 0.0
    return 1e3 * max(nvlink, ib)


def pipeline_ms(dispatch: float, combine: float, gemm: float, chunks: int) -> float:
    """Makespan of one layer's chunked MoE block: dispatcher stream ops in issue order (d0, d1, c0, d2, c1, ...,
    c_last), compute stream GEMMs g0..g_last; g_i after d_i, c_i after g_i; every op split evenly over chunks."""
    d, c, g = dispatch / chunks, combine / chunks, gemm / chunks
    comm_free = compute_free = 0.0
    sent: list[float] = []
    gemm_done: list[float] = []
    order = [("d", 0)]
    for i in range(chunks):
        if i + 1 < chunks:
            order.append(("d", i + 1))
        order.append(("c", i))
    for kind, i in order:
        if kind == "d":
            comm_free = comm_free + d
            sent.append(comm_free)
            continue
        while len(gemm_done) <= i:  # the compute stream runs GEMMs j as soon as d_j has landed
            j = len(gemm_done)
            compute_free = max(compute_free, sent[j]) + g
            gemm_done.append(compute_free)
        comm_free = max(comm_free, gemm_done[i]) + c
    return max(comm_free, compute_free)


def step_figures(ep: int, chunks: int, gbs_nvlink: float, gbs_ib: float | None, gemm_tflops: float) -> dict:
    """Per step (ms): all-to-all time without overlap, and what stays exposed with `chunks` chunks."""
    x = exchange_ms(ep, gbs_nvlink, gbs_ib)
    gemm_fwd = TOKENS * TOP_K * EXPERT_FLOP_PER_ROW_FWD / (gemm_tflops * 1e12) * 1e3
    gemm_bwd = 2 * gemm_fwd
    exposed = 0.0
    for gemm in (gemm_fwd, gemm_bwd):
        exposed += pipeline_ms(x, x, gemm, chunks) - gemm
    per_step = LAYERS * MICRO_BATCHES
    return {
        "exchange_ms": x,
        "a2a_ms": 4 * x * per_step,
        "exposed_ms": exposed * per_step,
        "gemm_ms": (gemm_fwd + gemm_bwd) * per_step,
        "off_gpu_gb": 4 * per_step * TOKENS * TOP_K * ROW_BYTES * (ep - 1) / ep / 1e9,
    }


def table(eps: list[int], chunks: int, gbs_nvlink: float, gbs_ib: float, gemm_tflops: float) -> str:
    lines = [
        f"| EP | fabric | off-GPU GB/step | all-to-all ms/step, no overlap | exposed ms/step, {chunks} chunks "
        f"| exposed, unchunked | % of a {STEP_COMPUTE_MS:.0f} ms step (chunked) |",
        "|--:|---|--:|--:|--:|--:|--:|",
    ]
    for ep in eps:
        fabrics = [("NVLink" if ep <= GPUS_PER_NODE else "NVLink domain", None)]
        if ep > GPUS_PER_NODE:
            fabrics.append((f"{GPUS_PER_NODE} per node + IB", gbs_ib))
        for name, ib in fabrics:
            f = step_figures(ep, chunks, gbs_nvlink, ib, gemm_tflops)
            flat = step_figures(ep, 1, gbs_nvlink, ib, gemm_tflops)
            lines.append(f"| {ep} | {name} | {f['off_gpu_gb']:.1f} | {f['a2a_ms']:.0f} | {f['exposed_ms']:.0f} | "
                         f"{flat['exposed_ms']:.0f} | {100 * f['exposed_ms'] / STEP_COMPUTE_MS:.1f}% |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ep", default="2,8,16,32", help="comma-separated EP sizes")
    ap.add_argument("--chunks", type=int, default=4, help="dispatch chunks per micro-batch (8192 / 2048 tokens)")
    ap.add_argument("--nvlink-gbs", type=float, default=370.0, help="achieved NVLink all-to-all GB/s per direction")
    ap.add_argument("--ib-gbs", type=float, default=42.5, help="achieved InfiniBand GB/s per GPU per direction")
    ap.add_argument("--gemm-tflops", type=float, default=520.0, help="expert grouped-GEMM rate (fwd and bwd)")
    args = ap.parse_args()
    eps = [int(e) for e in args.ep.split(",")]
    print(f"MoE proxy, 16 sequences/GPU/step; NVLink {args.nvlink_gbs:g} GB/s, IB {args.ib_gbs:g} GB/s per GPU, "
          f"expert GEMMs {args.gemm_tflops:g} TFLOP/s ({step_figures(2, 1, args.nvlink_gbs, None, args.gemm_tflops)['gemm_ms']:.0f} "
          "ms/step)\n")
    print(table(eps, args.chunks, args.nvlink_gbs, args.ib_gbs, args.gemm_tflops))


if __name__ == "__main__":
    main()
