"""Time `mbx --help` and `mbx campaign validate campaigns/quickstart.yaml` in fresh processes (median of N runs).

    .venv/bin/python benchmarks/cli_speed.py --runs 15

Each run starts a new interpreter through the installed entry point (`.venv/bin/mbx`, as a user types it), so
imports are counted; one warm-up run of each command is not counted (it fills the OS file cache). Prints the
median, min and max wall seconds and the median CPU seconds (user + system of the child) per command, and the
targets of issue 22 (--help <= 0.3 s, validate <= 0.5 s). On a busy shared machine the CPU figure is the steadier
one. `python -X importtime -m orchestrator --help 2> imports.txt` shows what loads.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    "mbx --help": (["--help"], 0.3),
    "mbx campaign validate campaigns/quickstart.yaml": (["campaign", "validate", "campaigns/quickstart.yaml"], 0.5),
}


def one_run(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one fresh process; exits non-zero on a failed command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="measured runs per command (after one warm-up)")
    parser.add_argument("--mbx", default=str(ROOT / ".venv" / "bin" / "mbx"), help="the mbx entry point")
    args = parser.parse_args()
    os.environ.pop("MBX_DEBUG", None)
    print(f"{args.runs} runs each, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    for label, (words, target) in COMMANDS.items():
        argv = [args.mbx, *words]
        one_run(argv)  # warm-up
        runs = [one_run(argv) for _ in range(args.runs)]
        walls = [w for w, _ in runs]
        cpu = statistics.median(c for _, c in runs)
        wall = statistics.median(walls)
        verdict = "ok" if wall <= target else "OVER"
        print(f"{label}: wall median {wall:.3f} s (min {min(walls):.3f}, max {max(walls):.3f}), "
              f"cpu median {cpu:.3f} s; target {target} s: {verdict}")  # fmt: skip


if __name__ == "__main__":
    main()
