"""GPU-only checks of the trainer's MoE performance knobs, for an H200 (not run in CI): does each knob work, at what cost.

    python benchmarks/gpu_checks.py --out /tmp/gpu-checks                 # everything (~15 min on one H200)
    python benchmarks/gpu_checks.py --out /tmp/gc --group layer --group green   # the in-process checks only
    python benchmarks/gpu_checks.py --list                                 # what would run (no GPU needed)

Each check prints one JSON line as it finishes; all of them land in <out>/gpu_checks.json with the machine
(torch, CUDA, GPU, SMs, Transformer Engine). Groups (--group, repeatable; split the runs across calls when
a machine is lent for a few minutes at a time):
- green: the green-context API this torch has (trainer.green.detect_api), contexts of 8/16/32 SMs and their
  streams.
- layer: one MoE layer of the MoE proxy's shapes (hidden 2048, 128 experts top-8, expert FFN 768, 8192
  tokens, bf16), forward + backward timed with CUDA events; the chunked layer's output and gradients are
  compared with the unchunked one's: chunks without a dispatcher stream, with an ordinary side stream,
  with green contexts of 8/16/32 SMs; pad_to_capacity; recompute modes; grouped GEMM torch vs loop (vs te).
- dispatch, recompute, loss, gemm, te: real `python -m trainer` runs of a 4-layer MoE proxy
  (benchmarks/recipes/moe_proxy.yaml, `--steps` steps, no torch.compile unless --compile) with each knob
  set; mean TFLOP/s/GPU and step time over the steps after the first two, peak memory, final loss, and
  the run's status (a refused knob shows its NotSupportedError reason there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MOE_PROXY = ROOT / "benchmarks/recipes/moe_proxy.yaml"
# The 4-layer proxy every trainer run starts from (2 micro-batches of 2 × 4096 tokens per step).
BASE = ["model.num_layers=4", "training.global_batch_size=4", "compile=false"]
PAD = ["model.moe.capacity_factor=1.0", "model.moe.pad_to_capacity=true"]  # force-balanced: nothing dropped

# group → [(name, overrides)]
RUNS: dict[str, list[tuple[str, list[str]]]] = {
    "dispatch": [
        ("base", []),
        ("chunk4096-no-stream", ["model.moe.dispatch_chunk_tokens=4096", "model.moe.dispatch_overlap=false"]),
        ("chunk4096-stream", ["model.moe.dispatch_chunk_tokens=4096"]),
        ("chunk2048-stream", ["model.moe.dispatch_chunk_tokens=2048"]),
        ("chunk4096-sms8", ["model.moe.dispatch_chunk_tokens=4096", "model.moe.dispatcher_sms=8"]),
        ("chunk4096-sms16", ["model.moe.dispatch_chunk_tokens=4096", "model.moe.dispatcher_sms=16"]),
        ("chunk4096-sms32", ["model.moe.dispatch_chunk_tokens=4096", "model.moe.dispatcher_sms=32"]),
        ("no-chunk-sms16", ["model.moe.dispatcher_sms=16"]),
        ("pad-to-capacity", PAD),
        ("capacity-compact", ["model.moe.capacity_factor=1.0"]),
        ("discrete-expert-weights", ["model.moe.expert_weights=discrete"]),
    ],
    "recompute": [
        ("recompute-selective", ["recompute=selective"]),
        ("recompute-core-attn", ["recompute=selective", "recompute_modules=[core_attn]"]),
        ("recompute-moe-act", ["recompute=selective", "recompute_modules=[moe_act]"]),
        ("recompute-moe-dispatch", ["recompute=selective", "recompute_modules=[moe_dispatch]"]),
        ("recompute-full", ["recompute=full"]),
        ("chunk4096-stream-recompute-full-refused", ["model.moe.dispatch_chunk_tokens=4096", "recompute=full"]),
    ],
    "loss": [
        ("ce-native", []),
        ("ce-fused", ["cross_entropy=fused"]),
        ("ce-te", ["cross_entropy=te"]),
    ],
    "gemm": [
        ("gemm-torch", []),
        ("gemm-loop", ["model.moe.grouped_gemm=loop"]),
        ("gemm-te", ["model.moe.grouped_gemm=te"]),
        ("gemm-te-padded", ["model.moe.grouped_gemm=te", *PAD]),
        ("compile-chunk4096-stream", ["compile=true", "model.moe.dispatch_chunk_tokens=4096"]),
    ],
    "te": [
        ("fp8-current", ["precision=fp8", "fp8_recipe=current"]),
        ("fp8-delayed", ["precision=fp8", "fp8_recipe=delayed"]),
        ("fp8-block", ["precision=fp8", "fp8_recipe=block"]),
        ("fp8-delayed-te-experts-padded", ["precision=fp8", "fp8_recipe=delayed", "model.moe.grouped_gemm=te",
                                           *PAD]),
        ("mxfp8-refused-below-sm100", ["precision=mxfp8"]),
    ],
}
IN_PROCESS = ("green", "layer")
GROUPS = (*IN_PROCESS, *RUNS)


# ---------------------------------------------------------------------------------------------
# Trainer runs.
# ---------------------------------------------------------------------------------------------


def summarize_run(out: Path, skip: int = 2) -> dict:
    """Mean figures of the steps after the first `skip` (compile/warm-up), from metrics.jsonl and status.json."""
    rows = []
    if (out / "metrics.jsonl").exists():
        for line in (out / "metrics.jsonl").read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a truncated last line
                pass
    status = json.loads((out / "status.json").read_text()) if (out / "status.json").exists() else {}
    window = rows[skip:] or rows
    mean = (lambda key: round(sum(r[key] for r in window) / len(window), 2)) if window else (lambda key: None)
    return {
        "state": status.get("state"),
        "reason": status.get("reason"),
        "steps": len(rows),
        "tflops_per_gpu": mean("tflops_per_gpu"),
        "step_time_ms": mean("step_time_ms"),
        "peak_alloc_gib": round(max(r["mem_max_allocated_gib"] for r in rows), 2) if rows else None,
        "first_loss": rows[0]["loss"] if rows else None,
        "last_loss": rows[-1]["loss"] if rows else None,
    }


def trainer_run(name: str, overrides: list[str], out: Path, steps: int, compile_: bool) -> dict:
    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "trainer", "--recipe", str(MOE_PROXY), "--out", str(run_dir)]
    base = [o for o in BASE if not (compile_ and o.startswith("compile="))]
    for item in [*base, f"training.steps={steps}", *overrides]:
        argv += ["--set", item]
    started = time.time()
    proc = subprocess.run(argv, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True,
                          text=True, timeout=900)
    (run_dir / "stdout.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    return {"check": name, "overrides": overrides, "exit": proc.returncode, "wall_s": round(time.time() - started, 1),
            **summarize_run(run_dir)}


# ---------------------------------------------------------------------------------------------
# In-process checks (import torch only here).
# ---------------------------------------------------------------------------------------------


def green_checks() -> list[dict]:
    import torch

    from trainer import green

    results = []
    try:
        cls = green.green_context_class()
        results.append({"check": "green-api", "api": green.detect_api(cls), "torch": torch.__version__})
    except Exception as err:  # noqa: BLE001
        return [{"check": "green-api", "error": f"{type(err).__name__}: {err}"}]
    rows = torch.randn(262144, 2048, device="cuda", dtype=torch.bfloat16)
    order = torch.randperm(rows.shape[0], device="cuda")
    results.append({"check": "gather-all-sms", "gather_262144x2048_ms": round(
        _time_ms(lambda: rows.index_select(0, order)), 3)})
    for sms in (8, 16, 32):
        try:
            context, stream = green.dispatcher_stream(sms, torch.device("cuda", torch.cuda.current_device()))
            ms = _time_ms(lambda: rows.index_select(0, order), stream=stream)
            results.append({"check": f"green-{sms}", "ok": True, "stream": type(stream).__name__,
                            "gather_262144x2048_ms": round(ms, 3)})
            del context
        except Exception as err:  # noqa: BLE001
            results.append({"check": f"green-{sms}", "ok": False, "error": f"{type(err).__name__}: {err}"})
    return results


def _time_ms(fn: Callable[[], object], iters: int = 10, warmup: int = 3, stream: object = None) -> float:
    import torch

    ctx = torch.cuda.stream(stream) if stream is not None else torch.cuda.stream(torch.cuda.current_stream())
    with ctx:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def layer_checks() -> list[dict]:
    """One MoE layer of the proxy's shapes: each knob's forward+backward time and its difference to the default."""
    import torch

    from trainer import green
    from trainer.model import MLP
    from trainer.moe import MoELayer
    from trainer.parallelize import attach_dispatcher
    from trainer.recipe import MoEConfig, RouterConfig

    device = torch.device("cuda", torch.cuda.current_device())
    hidden, tokens = 2048, 8192
    x = torch.randn(2, tokens // 2, hidden, device=device, dtype=torch.bfloat16)
    upstream = torch.randn_like(x)
    keep: list[object] = []

    def build(shared: bool = False, stream: object = None, recompute: tuple[str, ...] = (), **moe) -> MoELayer:
        torch.manual_seed(0)
        cfg = MoEConfig(num_experts=128, top_k=8, ffn_hidden_size=768, router=RouterConfig(force_balance=True),
                        **moe)
        with torch.device(device):
            mlp = MLP(hidden, 768, "swiglu", 0.02, 0.002) if shared else None
            layer = MoELayer(hidden, "swiglu", cfg, 0.02, 0.002, shared=mlp).to(torch.bfloat16)
        attach_dispatcher(layer, stream)  # the chunked pipeline where it chunks or has a stream, as the Trainer
        layer.recompute_dispatch = "moe_dispatch" in recompute
        layer.experts.recompute_act = "moe_act" in recompute
        return layer

    def step(layer: MoELayer) -> tuple[torch.Tensor, list[torch.Tensor]]:
        inp = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out, aux, _ = layer(inp)
        grads = torch.autograd.grad((out.float() * upstream.float()).sum() + aux, [inp, *layer.parameters()])
        return out.detach(), list(grads)

    def measure(name: str, layer: MoELayer, reference: tuple | None) -> dict:
        result: dict = {"check": f"layer-{name}"}
        try:
            out, grads = step(layer)
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            result["fwd_bwd_ms"] = round(_time_ms(lambda: step(layer), iters=5, warmup=2), 3)
            result["peak_extra_gib"] = round((torch.cuda.max_memory_allocated() - before) / 2**30, 3)
            if reference is not None:
                ref_out, ref_grads = reference
                result["max_out_diff"] = float((out.float() - ref_out.float()).abs().max())
                # the input's gradient always; the parameters' when they are laid out alike (not for TE experts)
                pairs = zip(grads, ref_grads, strict=True) if len(grads) == len(ref_grads) else [(grads[0], ref_grads[0])]
                result["max_grad_rel_diff"] = max(
                    float((g.float() - r.float()).norm() / r.float().norm().clamp_min(1e-12)) for g, r in pairs)
                result["ok"] = result["max_out_diff"] < 2e-2 and result["max_grad_rel_diff"] < 2e-2
            else:
                result["ok"] = True
        except Exception as err:  # noqa: BLE001
            result.update(ok=False, error=f"{type(err).__name__}: {err}")
        return result

    results = []
    reference = step(build(shared=True))
    results.append(measure("default", build(shared=True), None))
    side = torch.cuda.Stream(device)
    results.append(measure("chunk4096-no-stream", build(shared=True, dispatch_chunk_tokens=4096), reference))
    results.append(measure("chunk4096-stream", build(shared=True, stream=side, dispatch_chunk_tokens=4096), reference))
    results.append(measure("chunk2048-stream", build(shared=True, stream=side, dispatch_chunk_tokens=2048), reference))
    for sms in (8, 16, 32):
        try:
            context, stream = green.dispatcher_stream(sms, device)
            keep.append(context)
            results.append(measure(f"chunk4096-sms{sms}", build(shared=True, stream=stream,
                                                                dispatch_chunk_tokens=4096), reference))
        except Exception as err:  # noqa: BLE001
            results.append({"check": f"layer-chunk4096-sms{sms}", "ok": False, "error": f"{type(err).__name__}: {err}"})
    results.append(measure("pad-to-capacity", build(shared=True, capacity_factor=1.0, pad_to_capacity=True),
                           reference))
    results.append(measure("capacity-compact", build(shared=True, capacity_factor=1.0), reference))
    for modules in (("moe_act",), ("moe_dispatch",), ("moe_act", "moe_dispatch")):
        results.append(measure("recompute-" + "+".join(modules), build(shared=True, recompute=modules), reference))
    results.append(measure("gemm-loop", build(shared=True, grouped_gemm="loop"), reference))
    try:
        import transformer_engine.pytorch as te

        from trainer.te_support import use_te_experts

        layer = build(shared=True, grouped_gemm="te")
        use_te_experts(layer, te.GroupedLinear, device)
        layer.to(torch.bfloat16)
        results.append(measure("gemm-te", layer, reference))
    except ImportError as err:
        results.append({"check": "layer-gemm-te", "ok": None, "skipped": f"no Transformer Engine: {err}"})
    del keep
    return results


def machine() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": None, "sms": None,
            "capability": None, "transformer_engine": None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(gpu=props.name, sms=props.multi_processor_count,
                    capability="sm_{}{}".format(*torch.cuda.get_device_capability()))
    try:
        import transformer_engine

        info["transformer_engine"] = getattr(transformer_engine, "__version__", "unknown")
    except Exception:  # noqa: BLE001
        pass
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="Folder for gpu_checks.json and the run directories.")
    parser.add_argument("--group", action="append", choices=GROUPS, help="Run only these groups (repeatable).")
    parser.add_argument("--only", action="append", default=[], help="Run only checks with these names.")
    parser.add_argument("--steps", type=int, default=12, help="Steps per trainer run (first 2 not averaged).")
    parser.add_argument("--compile", action="store_true", help="torch.compile the trainer runs (as the proxy).")
    parser.add_argument("--list", action="store_true", help="Print the checks and exit (no GPU needed).")
    args = parser.parse_args(argv)
    groups = args.group or list(GROUPS)
    if args.list:
        for group in groups:
            names = [n for n, _ in RUNS[group]] if group in RUNS else [f"({group}: in-process)"]
            print(f"{group}: {', '.join(names)}")
        return 0
    if args.out is None:
        parser.error("--out is required (unless --list)")
    import torch

    if not torch.cuda.is_available():
        print("error: these checks need a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"machine": machine(), "started": time.time(), "checks": []}

    def record(result: dict) -> None:
        summary["checks"].append(result)
        print(json.dumps(result), flush=True)
        (args.out / "gpu_checks.json").write_text(json.dumps(summary, indent=1))

    if "green" in groups:
        for result in green_checks():
            record(result)
    if "layer" in groups:
        for result in layer_checks():
            record(result)
    for group in groups:
        for name, overrides in RUNS.get(group, []):
            if args.only and name not in args.only:
                continue
            record({"group": group, **trainer_run(name, overrides, args.out / "runs", args.steps, args.compile)})
    summary["ended"] = time.time()
    (args.out / "gpu_checks.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
