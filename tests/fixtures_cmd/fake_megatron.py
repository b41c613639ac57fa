"""A stand-in for Megatron-LM's pretrain_gpt.py: replays a real Megatron log line by line, honouring swept flags.

    python fake_megatron.py --replay LOG [--fake-slowdown 2.0] [--fake-noise 0.02] [--fake-loss-drift-from N]
                            [--echo FILE] [--sleep-s 0.02]
                            [--fail {none,infra-once,infra-always,infra-progress,config}] [--hang-s 60] ...

- every line of LOG is printed (flushed), with a small sleep after each `iteration` line;
- `elapsed time per iteration (ms)` is multiplied and `throughput per GPU (TFLOP/s/GPU)` divided by
  --fake-slowdown (both printed with one decimal, as Megatron does);
- --fake-noise X: the run's step times (and TFLOP/s) move by a random run-level factor of relative spread X, and
  each step by as much again: every run differs, as real runs do, but the draws are seeded by the run dir's last
  three parts (campaign/cell/attempt), so a test sees the same figures every time;
- --fake-loss-drift-from N (N > 0): from iteration N on, `lm loss` is 5% higher (a change of numerics);
- --echo writes this process's argv and environment as JSON before anything else;
- --fail infra-once: the first attempt of a cell (state in <run dir>/../fake_state.json) prints an NCCL
  watchdog timeout after a few iterations and exits 1; later attempts replay the whole log;
  infra-always: every attempt fails the same way after --fail-after iterations (no progress);
  infra-progress: every attempt fails, each one iteration later than the one before;
  config: an argparse error before anything is replayed (exit 2);
- --hang-s: after the replay, sleep this long instead of exiting (a run that hangs after its last step);
- unknown flags (the rendered Megatron params) are accepted and ignored, like a real script would use them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from pathlib import Path

ELAPSED = re.compile(r"(elapsed time per iteration \(ms\): )([0-9.]+)")
TFLOPS = re.compile(r"(throughput per GPU \(TFLOP/s/GPU\): )([0-9.]+)")
LOSS = re.compile(r"(lm loss: )([0-9.E+-]+)")
ITERATION = re.compile(r" iteration\s+(\d+)/")
WATCHDOG = (
    "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600008 "
    "milliseconds before timing out."
)


def scaled(line: str, slowdown: float, drift_from: int = 0) -> str:
    line = ELAPSED.sub(lambda m: f"{m.group(1)}{float(m.group(2)) * slowdown:.1f}", line)
    step = ITERATION.search(line)
    if drift_from > 0 and step and int(step.group(1)) >= drift_from:
        line = LOSS.sub(lambda m: f"{m.group(1)}{float(m.group(2)) * 1.05:.6E}", line)
    return TFLOPS.sub(lambda m: f"{m.group(1)}{float(m.group(2)) / slowdown:.1f}", line)


def main() -> int:
    parser = argparse.ArgumentParser(prog="fake_megatron.py")
    parser.add_argument("--replay", required=True)
    parser.add_argument("--fake-slowdown", type=float, default=1.0)
    parser.add_argument("--fake-loss-drift-from", type=int, default=0)
    parser.add_argument("--fake-noise", type=float, default=0.0)
    parser.add_argument("--echo", default=None)
    parser.add_argument("--sleep-s", type=float, default=0.02)
    parser.add_argument("--fail", default="none", choices=["none", "infra-once", "infra-always", "infra-progress",
                                                            "config"])  # fmt: skip
    parser.add_argument("--fail-after", type=int, default=3)
    parser.add_argument("--hang-s", type=float, default=0.0)
    args, unknown = parser.parse_known_args()
    if args.echo:
        Path(args.echo).write_text(
            json.dumps({"argv": sys.argv, "env": dict(os.environ), "unknown": unknown})
        )
    if args.fail == "config":
        parser.error("unrecognized arguments: --moe-router-topk-typo")

    run_dir = Path(os.environ.get("MBX_RUN_DIR", "."))
    state_file = run_dir.parent / "fake_state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {"attempts": 0}
    state["attempts"] += 1
    state_file.write_text(json.dumps(state))
    fail_at = None
    if args.fail == "infra-once" and state["attempts"] == 1:
        fail_at = args.fail_after
    elif args.fail == "infra-always":
        fail_at = args.fail_after
    elif args.fail == "infra-progress":
        fail_at = args.fail_after + state["attempts"] - 1

    iterations = 0
    draws = random.Random("/".join(run_dir.resolve().parts[-3:]))
    run_level = 1 + draws.gauss(0, args.fake_noise)
    with open(args.replay, encoding="utf-8", errors="replace") as log:
        for line in log:
            if " iteration " in line and "/" in line:
                if fail_at is not None and iterations >= fail_at:
                    print(WATCHDOG, flush=True)
                    print(
                        "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 0.",
                        flush=True,
                    )
                    return 1
                iterations += 1
                slowdown = args.fake_slowdown * run_level * (1 + draws.gauss(0, args.fake_noise))
                sys.stdout.write(scaled(line, slowdown, args.fake_loss_drift_from))
                sys.stdout.flush()
                time.sleep(args.sleep_s)
            else:
                sys.stdout.write(line)
    sys.stdout.flush()
    if args.hang_s:
        time.sleep(args.hang_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
