"""Does having Transformer Engine importable change the bundled trainer's speed? (issue 15)

    # one process per arm, alternating: the MoE proxy's main kernels after each kind of import
    python benchmarks/te_import_ab.py kernels --te-site /root/te-site --out /tmp/ab --rounds 2
    # the whole MoE proxy, alternating the arms (each a `python -m trainer` process)
    python benchmarks/te_import_ab.py proxy --te-site /root/te-site --out /tmp/ab --rounds 2 --steps 12

Arms (`--arms`, comma-separated):
- `none`: TE not on the path (what a machine without TE runs).
- `te-import`: TE on the path and `import transformer_engine` done before the run, as trainer/train.py's
  `environment()` did to record TE's version (the top-level package imports `transformer_engine.pytorch`,
  which loads cuDNN/NVRTC/cuRAND by its own search, and `jax` when installed).
- `jax`: only `import jax` (the TE top-level package imports it when JAX is installed, as on the H200).
- `te-guarded`: TE imported through `trainer.te_support.import_te()` (torch's own CUDA libraries named to TE's
  loader, `transformer_engine.jax` kept out).
- `te-path`: TE on the path, the trainer itself decides (with trainer/train.py's `environment()` reading TE's
  version through `trainer.te_support.te_version()`, package metadata, nothing imports TE: the fix).

Found on the H200 (2026-12-03): a plain `import transformer_engine` makes libtransformer_engine.so load the
image's system cuDNN 9.14 sub-libraries (/usr/lib/x86_64-linux-gnu) by soname; torch (built against 9.19)
then refuses cuDNN and SDPA falls back from cuDNN attention to FlashAttention-2 (1.84× slower fwd+bwd at the
proxy's shapes): −8% on the MoE proxy. `te-guarded` keeps torch's cuDNN (BENCHMARKS.md, issue 15).

`kernels` prints one JSON line per process: free GPU memory after the import, the CUDA libraries mapped
into the process, cuDNN's version as torch sees it, the SDPA kernels the profiler saw, and the median time
(CUDA events, after warm-up) of the proxy's main kernels at its shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("none", "te-import", "jax", "te-guarded", "te-path")
MOE_PROXY = ROOT / "benchmarks/recipes/moe_proxy.yaml"


def arm_env(arm: str, te_site: str | None) -> dict[str, str]:
    """The environment of one arm's process: TE's site folder on PYTHONPATH or not."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != te_site]
    if arm != "none" and te_site:
        parts.insert(0, te_site)
    parts.insert(0, str(ROOT))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["MBX_AB_ARM"] = arm
    return env


def do_import(arm: str) -> None:
    if arm == "te-import":
        import transformer_engine  # noqa: F401
    elif arm == "jax":
        import jax  # noqa: F401
    elif arm == "te-guarded":
        from trainer.te_support import import_te

        import_te()


def mapped_libs() -> list[str]:
    keys = ("cudnn", "nvrtc", "curand", "cublas", "transformer_engine", "xla", "jax")
    seen = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            path = line.split()[-1] if line.strip() else ""
            if path.startswith("/") and any(k in path for k in keys) and path not in seen:
                seen.append(path)
    return seen


def cudnn_version(torch) -> int | str:
    try:
        return torch.backends.cudnn.version()
    except RuntimeError as err:  # torch refuses a mismatched cuDNN runtime: that is the finding
        return f"RuntimeError: {err}"[:200]


def kernels_child(arm: str) -> dict:
    import torch
    import torch.nn.functional as F

    torch.cuda.init()
    do_import(arm)
    dev = torch.device("cuda")
    free, total = torch.cuda.mem_get_info()
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, dtype=torch.bfloat16, grad=False):
        return torch.randn(*shape, device=dev, dtype=dtype, generator=gen).requires_grad_(grad)

    def timed(fn, reps=10, warm=3) -> float:
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        return round(times[len(times) // 2], 3)

    b, s, h, kv, d = 2, 4096, 32, 4, 128
    q, k, v = rnd(b, h, s, d, grad=True), rnd(b, kv, s, d, grad=True), rnd(b, kv, s, d, grad=True)
    go = rnd(b, h, s, d)

    def sdpa():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.backward(go)

    x, w = rnd(b * s, 2048, grad=True), rnd(151936, 2048, grad=True)
    glog = rnd(b * s, 151936)

    def logits():
        (x @ w.t()).backward(glog)

    tgt = torch.randint(0, 151936, (b * s,), device=dev, generator=gen)
    lg = rnd(b * s, 151936, grad=True)

    def xent():
        F.cross_entropy(lg.float(), tgt).backward()

    e, rows = 128, b * s * 8
    xe, w1, w2 = rnd(rows, 2048, grad=True), rnd(e, 1536, 2048, grad=True), rnd(e, 2048, 768, grad=True)
    gexp = rnd(rows, 2048)
    offs = torch.arange(1, e + 1, device=dev, dtype=torch.int32) * (rows // e)

    def experts():
        hmid = F.grouped_mm(xe, w1.transpose(-2, -1), offs=offs)
        a, g = hmid.chunk(2, dim=-1)
        F.grouped_mm(F.silu(a) * g, w2.transpose(-2, -1), offs=offs).backward(gexp)

    params = [torch.zeros(64 << 20, device=dev, requires_grad=True) for _ in range(16)]  # 1 G fp32 parameters
    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    result = {
        "arm": arm,
        "free_gib_after_import": round(free / 2**30, 2),
        "total_gib": round(total / 2**30, 2),
        "cudnn": cudnn_version(torch),
        "libs": mapped_libs(),
        "ms": {
            "sdpa_fwd_bwd": timed(sdpa),
            "logits_fwd_bwd": timed(logits),
            "xent_fp32": timed(xent),
            "experts_fwd_bwd": timed(experts),
            "adamw_1g": timed(opt.step),
        },
    }
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        sdpa()
        torch.cuda.synchronize()
    names = sorted({evt.name for evt in prof.events() if evt.device_type == torch.autograd.DeviceType.CUDA})
    result["sdpa_kernels"] = [
        n[:90]
        for n in names
        if "attn" in n.lower()
        or "fmha" in n.lower()
        or "sdpa" in n.lower()
        or "flash" in n.lower()
        or "cudnn" in n.lower()
    ][:6]
    result["te_modules"] = sorted(m for m in sys.modules if m.split(".")[0] in ("transformer_engine", "jax"))[
        :5
    ]
    return result


def kernels(args: argparse.Namespace) -> list[dict]:
    results = []
    for rnd_i in range(args.rounds):
        for arm in args.arms:
            proc = subprocess.run(
                [sys.executable, __file__, "_child", arm],
                env=arm_env(arm, args.te_site),
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            try:
                row = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                row = {"arm": arm, "error": (proc.stderr or proc.stdout)[-1500:]}
            row["round"] = rnd_i
            results.append(row)
            print(json.dumps(row), flush=True)
    return results


PREIMPORT = """
import runpy, sys
from trainer import jit_cache
import os
arm = os.environ["MBX_AB_ARM"]
if arm in ("te-import", "jax", "te-guarded"):
    sys.path.insert(0, {bench!r})
    from te_import_ab import do_import
    jit_cache.setup_jit_caches()  # before torch loads, as trainer/__main__.py does (it runs again: same dirs)
    do_import(arm)
sys.argv = ["trainer", *sys.argv[1:]]
runpy.run_module("trainer", run_name="__main__")
"""


def proxy(args: argparse.Namespace) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from benchmarks.trainer_proxies import run_and_summarize

    results = []
    code = PREIMPORT.format(bench=str(ROOT / "benchmarks"))
    for rnd_i in range(args.rounds):
        for arm in args.arms:
            out = args.out / f"moe-{arm}-r{rnd_i}"
            argv = [
                sys.executable,
                "-c",
                code,
                "--recipe",
                str(args.recipe),
                "--out",
                str(out),
                "--set",
                f"training.steps={args.steps}",
                *[a for s in args.set for a in ("--set", s)],
            ]
            row = {"arm": arm, "round": rnd_i, **run_and_summarize(argv, out, arm_env(arm, args.te_site))}
            env_json = out / "env.json"
            if env_json.exists():
                row["env_transformer_engine"] = json.loads(env_json.read_text()).get("transformer_engine")
            results.append(row)
            print(json.dumps(row), flush=True)
    return results


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_child":
        print(json.dumps(kernels_child(sys.argv[2])), flush=True)
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=("kernels", "proxy"))
    parser.add_argument("--te-site", default=os.environ.get("MBX_TE_SITE"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--arms", type=lambda s: s.split(","), default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--recipe", type=Path, default=MOE_PROXY)
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    if args.arms is None:
        args.arms = (
            ["none", "te-import", "jax", "te-guarded"]
            if args.mode == "kernels"
            else ["none", "te-import", "te-path"]
        )
    bad = [a for a in args.arms if a not in ARMS]
    if bad:
        parser.error(f"unknown arms {bad}; choose from {ARMS}")
    args.out.mkdir(parents=True, exist_ok=True)
    results = kernels(args) if args.mode == "kernels" else proxy(args)
    (args.out / f"{args.mode}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
