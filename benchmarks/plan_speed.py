"""Time `mbx campaign plan` of an N-cell campaign through the real CLI entry point, in-process and as a subprocess.

    .venv/bin/python benchmarks/plan_speed.py --cells 10000 --runs 5
    .venv/bin/python benchmarks/plan_speed.py --shape axes12 --runs 5     # the issue's 12 axes, 4,096 cells

The campaign is campaigns/quickstart.yaml with its sweep replaced (`--shape seeds`: training.seed × 4 binary
axes, one of them env; `axes12`: 12 axes of 2 values). Prints the median and range of wall and CPU seconds
over `--runs` runs (the first in-process run includes imports; it is reported apart). On a busy shared
machine the CPU figure is the steadier one.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TWO = {
    "model.moe.capacity_factor": [1.0, 1.5],
    "model.moe.top_k": [1, 2],
    "optimizer.lr": [1.0e-3, 2.0e-3],
    "env.FOO": ["a", "b"],
}
AXES12 = {
    **TWO,
    "training.seed": [1, 2],
    "training.steps": [10, 20],
    "optimizer.warmup_steps": [1, 2],
    "training.micro_batch_size": [1, 2],
    "model.moe.drop_policy": ["probs", "position"],
    "optimizer.min_lr": [1.0e-5, 2.0e-5],
    "training.seq_length": [64, 128],
    "env.BAR": ["x", "y"],
}


def write_campaign(path: Path, cells: int, shape: str) -> int:
    """The benchmark campaign; returns its cell count."""
    data = yaml.safe_load((ROOT / "campaigns" / "quickstart.yaml").read_text())
    if shape == "axes12":
        axes = AXES12
    else:
        if cells % 16:
            raise SystemExit("--cells must be a multiple of 16 for --shape seeds")
        axes = {"training.seed": list(range(cells // 16)), **TWO}
    data["sweep"] = {"axes": axes}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    count = 1
    for values in axes.values():
        count *= len(values)
    return count


def in_process(argv: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s, exit code) of one `orchestrator.cli.app.main` call with stdout captured."""
    from orchestrator.cli.app import main

    saved = sys.argv
    sys.argv = ["mbx", *argv]
    code = 0
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            main()
    except SystemExit as stop:
        code = int(stop.code or 0)
    finally:
        sys.argv = saved
    return time.perf_counter() - wall, time.process_time() - cpu, code


def as_subprocess(argv: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s of the child, exit code) of `python -m orchestrator ARGV`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, check=False
    )
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def summary(label: str, samples: list[tuple[float, float, int]]) -> str:
    walls = [s[0] for s in samples]
    cpus = [s[1] for s in samples]
    codes = sorted({s[2] for s in samples})
    return (
        f"{label:<22} wall median {statistics.median(walls):6.2f} s ({min(walls):.2f}–{max(walls):.2f}), "
        f"CPU median {statistics.median(cpus):6.2f} s ({min(cpus):.2f}–{max(cpus):.2f}), exit {codes}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--shape", choices=("seeds", "axes12"), default="seeds")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="Time `plan --json` instead of the table.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan_speed.yaml"
        count = write_campaign(path, args.cells, args.shape)
        argv = ["campaign", "plan", str(path), *(["--json"] if args.json else [])]
        argv += ["--max-cells", str(count)] if count > 10_000 else []
        print(f"mbx {' '.join(argv[:2])} of {count:,} cells ({args.shape}), {args.runs} runs, {os.cpu_count()} CPUs")
        first = in_process(argv)
        print(summary("in-process, first", [first]))
        print(summary("in-process", [in_process(argv) for _ in range(args.runs)]))
        print(summary("subprocess", [as_subprocess(argv) for _ in range(args.runs)]))


if __name__ == "__main__":
    main()
