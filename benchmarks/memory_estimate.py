"""Memory estimate (trainer/memory.py) vs measured peak allocated memory for every H200 figure of BENCHMARKS.md
and tests/data/h200-samples/ that the bundled trainer's recipe can reproduce.

    .venv/bin/python benchmarks/memory_estimate.py [--markdown] [--tolerance 0.10]
    .venv/bin/python benchmarks/memory_estimate.py --results /tmp/moe/results.json [--markdown]

`--results` compares instead every run of a `benchmarks/trainer_proxies.py` results.json (a fresh H200 run of the
current trainer: its proxy, `--set`/variant overrides and measured peak; a run that ran out of memory is an OOM row).

Each case is a proxy recipe (benchmarks/recipes/*.yaml) plus the overrides of its variant, as data below; the
measured figure is the table's peak allocated GiB (one H200, torch 2.11.0+cu130). Cases run with Transformer
Engine (fp8) are estimated as their bf16 torch equivalent and listed apart; OOM rows compare the estimate with
the H200's memory. No torch: this runs on the login node.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.cli import load_recipe  # noqa: E402
from trainer.memory import GIB, estimate, estimate_megatron  # noqa: E402
from trainer.recipe import Recipe  # noqa: E402

RECIPES = {
    "moe": ROOT / "benchmarks/recipes/moe_proxy.yaml",
    "dense": ROOT / "benchmarks/recipes/dense_proxy.yaml",
}
SAMPLES = ROOT / "tests/data/h200-samples/aa-samples-h200"
H200_GIB = 143771 * (1 << 20) / GIB  # nvidia-smi's 143,771 MiB
TOLERANCE = 0.10

# Variants as `--set` overrides of the proxy recipes as committed (MoE: 2 × 8, bf16 grads, compile; dense: 2 × 4,
# fp32 main grads, eager).
FP32_WEIGHTS = ("optimizer.master_weights=false", "optimizer.main_grads=fp32", "compile=false")  # runs 1–2
MOE_EAGER_8 = ("training.global_batch_size=8", "compile=false")
SLICE2 = (
    "model.num_layers=2",
    "training.global_batch_size=2",
    "compile=false",
)  # the dispatch campaign's slice
LAYERS4 = ("model.num_layers=4", "training.global_batch_size=4", "compile=false")  # gpu_checks.py's BASE
CHUNK = ("model.moe.dispatch_chunk_tokens=2048",)
SMS16 = ("model.moe.dispatcher_sms=16",)
CAPACITY = ("model.moe.capacity_factor=1.0", "model.moe.pad_to_capacity=true")


@dataclass(frozen=True)
class Case:
    source: str
    proxy: str
    label: str
    overrides: tuple[str, ...]
    measured: float | None  # peak allocated GiB; None = out of memory
    te: bool = False  # ran Transformer Engine modules (fp8): estimated as bf16
    samples: str | None = None  # an h200-samples cell: the measured peak is read from its metrics.jsonl


def _run(source: str, proxy: str, rows: list[tuple]) -> list[Case]:
    return [Case(source, proxy, label, tuple(ov), measured, *rest) for label, ov, measured, *rest in rows]


CASES: list[Case] = [
    *_run(
        "run 1 (fp32 weights)",
        "dense",
        [
            ("2 × 1", (*FP32_WEIGHTS, "training.global_batch_size=2"), 58.3),
            ("1 × 1", (*FP32_WEIGHTS, "training.micro_batch_size=1", "training.global_batch_size=1"), 46.9),
        ],
    ),
    *_run(
        "run 1 (fp32 weights)",
        "moe",
        [
            ("2 × 1", (*FP32_WEIGHTS, "training.global_batch_size=2"), 96.6),
            ("1 × 1", (*FP32_WEIGHTS, "training.micro_batch_size=1", "training.global_batch_size=1"), 84.6),
        ],
    ),
    *_run(
        "run 2 (fp32 weights)",
        "dense",
        [
            ("base 2 × 4", FP32_WEIGHTS, 68.7),
            ("mbs4 4 × 2", (*FP32_WEIGHTS, "training.micro_batch_size=4"), 91.5),
            ("mbs1 1 × 8", (*FP32_WEIGHTS, "training.micro_batch_size=1"), 57.4),
            ("fused CE 2 × 4", (*FP32_WEIGHTS, "cross_entropy=fused"), 63.4),
        ],
    ),
    *_run(
        "run 2 (fp32 weights)",
        "moe",
        [
            ("base 2 × 4", (*FP32_WEIGHTS, "training.global_batch_size=8"), 117.5),
            (
                "mbs1 1 × 8",
                (*FP32_WEIGHTS, "training.micro_batch_size=1", "training.global_batch_size=8"),
                105.5,
            ),
            ("fused CE 2 × 4", (*FP32_WEIGHTS, "training.global_batch_size=8", "cross_entropy=fused"), 108.3),
            (
                "mbs4 4 × 2",
                (*FP32_WEIGHTS, "training.micro_batch_size=4", "training.global_batch_size=8"),
                None,
            ),
        ],
    ),
    *_run(
        "runs 3–5",
        "dense",
        [
            ("base (fp32 main grads) 2 × 4", (), 69.7),
            ("bf16 grads 2 × 4", ("optimizer.main_grads=bf16",), 64.5),
            ("gbs16 2 × 8", ("training.global_batch_size=16",), 69.7),
        ],
    ),
    *_run(
        "runs 3–5",
        "moe",
        [
            ("base (fp32 main grads) 2 × 4", (*MOE_EAGER_8, "optimizer.main_grads=fp32"), 118.1),
            ("bf16 grads 2 × 4", MOE_EAGER_8, 107.6),
            ("bf16 grads, compile 2 × 4", ("training.global_batch_size=8",), 106.3),
            ("bf16 grads, compile 2 × 8", (), 106.3),
            ("micro-batch 4, 4 × 2", ("training.micro_batch_size=4", "training.global_batch_size=8"), None),
        ],
    ),
    *_run("run 6 / issue 9 / issue 15 A/B", "moe", [("committed 2 × 8", (), 106.34)]),
    *_run("run 6", "dense", [("committed 2 × 4", (), 69.7)]),
    *_run(
        "run 7 (4 layers, 2 × 2)",
        "moe",
        [
            ("base", LAYERS4, 65.5),
            ("chunk 4096, dispatcher stream", (*LAYERS4, "model.moe.dispatch_chunk_tokens=4096"), 65.5),
            (
                "… + dispatcher_sms 32",
                (*LAYERS4, "model.moe.dispatch_chunk_tokens=4096", "model.moe.dispatcher_sms=32"),
                65.5,
            ),
            (
                "… + dispatcher_sms 16",
                (*LAYERS4, "model.moe.dispatch_chunk_tokens=4096", "model.moe.dispatcher_sms=16"),
                65.5,
            ),
            ("capacity 1.0 + pad_to_capacity", (*LAYERS4, *CAPACITY), 65.5),
        ],
    ),
    *_run(
        "run 8 (2 layers, 2 × 1)",
        "moe",
        [
            ("dropless", SLICE2, 40.91),
            ("capacity 1.0 padded", (*SLICE2, *CAPACITY), 40.92),
            ("sms 16", (*SLICE2, *SMS16), 40.98),
            ("sms 16, capacity", (*SLICE2, *SMS16, *CAPACITY), 40.98),
            ("chunk 2048", (*SLICE2, *CHUNK), 40.98),
            ("chunk 2048, capacity", (*SLICE2, *CHUNK, *CAPACITY), 40.98),
            ("chunk 2048, sms 16", (*SLICE2, *CHUNK, *SMS16), 40.98),
            ("chunk 2048, sms 16, capacity", (*SLICE2, *CHUNK, *SMS16, *CAPACITY), 40.98),
        ],
    ),
    *_run(
        "h200-samples (2 layers)",
        "moe",
        [
            ("base r0–r3", SLICE2, 40.91, False, "45ad6c6851"),
            ("static capacity r0–r3", (*SLICE2, *CAPACITY), 40.92, False, "a8ddbee1ab"),
            # measured before trainer/adamw_pa.py: its optimizer step still cast every bf16 gradient to fp32
            (
                "fused CE r0–r3 (fp32 gradient casts, gone)",
                (*SLICE2, "cross_entropy=fused"),
                34.88,
                False,
                "7db0e86111",
            ),
        ],
    ),
    *_run(
        "issue 15",
        "dense",
        [
            ("bf16 committed", (), 69.68),
            ("compile", ("compile=true",), 67.93),
            ("compile, bf16 grads", ("compile=true", "optimizer.main_grads=bf16"), 62.72),
            ("fp8 current scaling", ("precision=fp8",), 71.84, True),
        ],
    ),
    *_run("issue 15", "moe", [("fp8 current scaling", ("precision=fp8",), 106.78, True)]),
]

# megatron-core 0.19.2 + TE on the MoE proxy's shapes (BENCHMARKS.md, peers): informational, not the bundled trainer.
MEGATRON_PEER = {
    "num-layers": 8,
    "hidden-size": 2048,
    "ffn-hidden-size": 6144,
    "num-attention-heads": 32,
    "group-query-attention": True,
    "num-query-groups": 4,
    "kv-channels": 128,
    "seq-length": 4096,
    "micro-batch-size": 2,
    "global-batch-size": 16,
    "vocab-size": 151936,
    "num-experts": 128,
    "moe-router-topk": 8,
    "moe-ffn-hidden-size": 768,
    "use-distributed-optimizer": True,
    "bf16": True,
    "swiglu": True,
    "world-size": 1,
}
MEGATRON_PEER_MEASURED = 104.78


def case_recipe(case: Case) -> Recipe:
    return load_recipe(str(RECIPES[case.proxy]), [*case.overrides, "device=cuda"])


def measured_peak(case: Case) -> float | None:
    """The recorded figure; an h200-samples cell's own metrics (max over its repeats, tests/data/h200-samples)."""
    if case.samples is None:
        return case.measured
    peaks = []
    for metrics in sorted(SAMPLES.glob(f"{case.samples}-r*/1/metrics.jsonl")):
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        peaks.append(max(r["mem_max_allocated_gib"] for r in rows))
    return max(peaks) if peaks else case.measured


def proxy_cases(path: Path) -> list[Case]:
    """The runs of a trainer_proxies.py results.json as cases (name `<proxy>-<variant>-r<n>`); runs that failed
    for another reason than memory are left out."""
    cases = []
    for run in json.loads(path.read_text()):
        proxy = str(run["name"]).split("-", 1)[0]
        oom = run.get("state") != "completed" and "out of memory" in str(run.get("reason") or "").lower()
        if (
            proxy not in RECIPES
            or (run.get("state") != "completed" and not oom)
            or (not oom and not run.get("peak_alloc_gib"))
        ):
            continue
        overrides = tuple(run.get("overrides") or ())
        te = any(o in overrides for o in ("precision=fp8", "precision=mxfp8", "cross_entropy=te"))
        cases.append(
            Case(path.name, proxy, run["name"], overrides, None if oom else run["peak_alloc_gib"], te)
        )
    return cases


def rows(tolerance: float = TOLERANCE, cases: list[Case] | None = None) -> list[dict]:
    """One dict per case: estimate, measured, relative error and verdict."""
    out = []
    for case in CASES if cases is None else cases:
        est = estimate(case_recipe(case))
        measured = measured_peak(case)
        row = {
            "source": case.source,
            "proxy": case.proxy,
            "label": case.label,
            "estimate_gib": est.peak_gib,
            "measured_gib": measured,
            "peak_at": est.peak_at,
            "te": case.te,
        }
        if measured is None:
            row["error"] = None
            gpu = int(H200_GIB * GIB)
            row["verdict"] = "OOM predicted" if est.headroom(gpu) < 0 else "OOM not predicted"
            row["with_slack_gib"] = (est.peak_bytes + est.reserve_bytes) / GIB
        else:
            row["error"] = est.peak_gib / measured - 1
            row["verdict"] = "within" if abs(row["error"]) <= tolerance else "outside"
        out.append(row)
    return out


def table(results: list[dict], markdown: bool) -> list[str]:
    head = ["source", "proxy", "variant", "estimate GiB", "measured GiB", "error", "verdict", "peak at"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "--:|" * 3 + "---|---|"] if markdown else []
    for r in results:
        measured = "OOM" if r["measured_gib"] is None else f"{r['measured_gib']:.2f}"
        error = "–" if r["error"] is None else f"{100 * r['error']:+.1f}%"
        verdict = r["verdict"] + (" (TE fp8 as bf16)" if r["te"] else "")
        cells = [
            r["source"],
            r["proxy"],
            r["label"],
            f"{r['estimate_gib']:.2f}",
            measured,
            error,
            verdict,
            r["peak_at"],
        ]
        lines.append("| " + " | ".join(cells) + " |" if markdown else "  ".join(cells))
    return lines


def summary(results: list[dict], tolerance: float) -> list[str]:
    measured = [r for r in results if r["error"] is not None and not r["te"]]
    within = [r for r in measured if r["verdict"] == "within"]
    if not measured:
        return ["no bf16 case with a measured peak"]
    worst = max(measured, key=lambda r: abs(r["error"]))
    ooms = [r for r in results if r["error"] is None]
    peer = estimate_megatron(MEGATRON_PEER)
    return [
        f"bf16 cases within ±{100 * tolerance:.0f}%: {len(within)} of {len(measured)}; worst "
        f"{100 * worst['error']:+.1f}% ({worst['source']}, {worst['proxy']} {worst['label']}); mean |error| "
        f"{100 * sum(abs(r['error']) for r in measured) / len(measured):.1f}%",
        "TE fp8 cases (estimated as bf16): "
        + ", ".join(f"{r['proxy']} {100 * r['error']:+.1f}%" for r in results if r["te"]),
        "OOM rows (estimate + allocator slack of 2 × the largest buffer vs the H200's memory): "
        + "; ".join(
            f"{r['source']} {r['proxy']} {r['label']}: {r['estimate_gib']:.1f} + slack = {r['with_slack_gib']:.1f} GiB "
            f"vs {H200_GIB:.1f} GiB ({r['verdict']})"
            for r in ooms
        ),
        f"megatron-core peer (estimate_megatron, informational, not calibrated): {peer.peak_gib:.1f} GiB vs "
        f"{MEGATRON_PEER_MEASURED} measured",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="relative error counted as within")
    parser.add_argument(
        "--results", type=Path, default=None, help="a trainer_proxies.py results.json to compare"
    )
    args = parser.parse_args()
    results = rows(args.tolerance, proxy_cases(args.results) if args.results else None)
    print("\n".join(table(results, args.markdown)))
    print()
    print("\n".join(summary(results, args.tolerance)))


if __name__ == "__main__":
    main()
