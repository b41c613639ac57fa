"""Run the bundled trainer on the MoE and dense proxy recipes and print their last-10-step figures as JSON.

    python benchmarks/trainer_proxies.py --out /tmp/proxies [--only moe] [--set training.micro_batch_size=1]
        [--repeats 3] [--profile 8:2]

Each run is a real `python -m trainer` process (what mbx launches); the window is the last 10 timed steps
(the first step never counts), TFLOP/s use Megatron-LM's FLOPs accounting (trainer/flops.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reports.window import summarize  # noqa: E402
from trainer.rundir import read_metrics, read_status  # noqa: E402

RECIPES = {"moe": ROOT / "benchmarks/recipes/moe_proxy.yaml", "dense": ROOT / "benchmarks/recipes/dense_proxy.yaml"}


def run_and_summarize(argv: list[str], out: Path, env: dict[str, str]) -> dict:
    """Run one trainer process (or torchrun) writing `out`; its status and last-10-step window figures."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    (out / "stdout.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    status = read_status(out) or {}
    summary = summarize(read_metrics(out)).to_dict()
    return {
        "state": status.get("state"),
        "reason": status.get("reason"),
        "wall_s": round(time.time() - started, 1),
        "params": status.get("params"),
        "flops_per_step": status.get("flops_per_step"),
        **{k: summary[k] for k in ("tflops_per_gpu", "step_time_ms", "step_time_ms_std", "tokens_per_s_per_gpu",
                                   "peak_alloc_gib", "peak_reserved_gib", "first_loss", "last_loss", "window_steps")},
    }


def run_one(name: str, recipe: Path, out: Path, overrides: list[str], profile: str | None) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if profile:
        env["MBX_TRAINER_PROFILE"] = profile
    argv = [sys.executable, "-m", "trainer", "--recipe", str(recipe), "--out", str(out)]
    for item in overrides:
        argv += ["--set", item]
    return {"name": name, "overrides": overrides, **run_and_summarize(argv, out, env)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", choices=sorted(RECIPES), action="append")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="key=value for every run")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:key=value,key=value — extra runs with these overrides (repeatable)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--profile", default=None, help="START:COUNT steps to profile (torch.profiler)")
    args = parser.parse_args()
    variants = [("base", [])] + [(v.split(":", 1)[0], v.split(":", 1)[1].split(",")) for v in args.variant]
    results = []
    for name in args.only or sorted(RECIPES):
        for variant, extra in variants:
            for repeat in range(args.repeats):
                label = f"{name}-{variant}-r{repeat}"
                out = args.out / label
                out.mkdir(parents=True, exist_ok=True)
                result = run_one(label, RECIPES[name], out, args.overrides + extra, args.profile if repeat == 0 else None)
                results.append(result)
                print(json.dumps(result), flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
