"""The pack runner: one allocation runs its points back to back, each point as its own srun step.

Command line (the contract; `launchers.slurm.pack.runner_argv` builds it, the job script or NeMo-Run's srun
starts it once per allocation, by path, on the allocation's first node, outside any container)::

    PYTHON -u <mbx>/launchers/node/pack.py --pack PACK_FILE [--allocation N]

PACK_FILE is written at submission (`launchers.slurm.pack.pack_file`); this runner takes allocation
SLURM_ARRAY_TASK_ID, else --allocation, else 0, and for each of its points in order:

- skips it when its record says it ended already (a requeued allocation does not run a finished point again)
  or when mbx asked to stop it (its cancel file exists: recorded as stopped, never started);
- runs its srun step (`argv`: launchers/node/rank.py on every rank, exactly as one job per point runs it, so the
  run dir is written the same way; the rank-local JIT caches of the nodes stay warm from point to point); a
  point that never started in an earlier run of a requeued allocation gets SLURM_RESTART_COUNT=0, so rank.py
  archives nothing for it;
- stops the step when mbx asks (cancel file) or at its deadline (`deadline_s`, past the point's own limit, which
  the attempt wrapper enforces first): `scancel --signal=TERM` of the step, `scancel` (SIGKILL) 30 s later, srun
  killed if it is still there 30 s after that;
- records the step's end (exit code, whether it was stopped and why) in the point's `record` (JSON, atomic).

A failing, crashing or hanging point ends only its own step (srun --kill-on-bad-exit=1); the next point starts.
When the allocation itself is signalled (scancel, its time limit, preemption) the runner starts nothing more
and leaves the running point's record open, so the login side takes Slurm's word for it.
Exit status 0 unless the pack file cannot be read (2). Standard library only (plus trainer/rundir.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
if __name__ == "__main__" and sys.path and Path(sys.path[0]).resolve() == ROOT / "launchers" / "node":
    sys.path[0] = str(ROOT)  # run by path: the checkout root, not this folder, is where imports start

from trainer import rundir  # noqa: E402

POLL_S = 0.5  # how often a running step is checked for a cancel request or its deadline
KILL_AFTER_S = 30.0  # after scancel of a step: kill srun itself
STOP = {"signal": 0}  # the signal that stopped the allocation (0: none)


def say(message: str) -> None:
    print(f"pack: {message}", flush=True)


def pick_allocation(data: dict[str, Any], allocation: int | None) -> list[dict[str, Any]]:
    """The points of this allocation: SLURM_ARRAY_TASK_ID, else --allocation, else 0."""
    array = os.environ.get("SLURM_ARRAY_TASK_ID")
    number = int(array) if array and array.isdigit() else (allocation or 0)
    allocations = data.get("allocations") or []
    if not 0 <= number < len(allocations):
        raise SystemExit(
            f"pack.py: allocation {number} is not in the pack file ({len(allocations)} allocations)"
        )
    return allocations[number]


def find_step(name: str) -> str | None:
    """The step id (JOB.STEP) of this allocation's step called `name`, from squeue."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i|%j"], capture_output=True, text=True,
                             timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.stdout.splitlines():
        step, _, step_name = line.strip().partition("|")
        if step_name == name:
            return step
    return None


def stop_step(child: subprocess.Popen[bytes], name: str) -> None:
    """Stop a point's step as Slurm stops a cancelled job: SIGTERM to its tasks (the attempt wrapper forwards it
    and records it), SIGKILL KILL_AFTER_S later; srun itself is killed when no step id can be found."""
    step = find_step(name)
    if step is None:
        child.terminate()  # srun kills its step (SIGKILL) at once
    else:
        subprocess.run(["scancel", "--signal=TERM", step], capture_output=True, timeout=30, check=False)
    try:
        child.wait(timeout=KILL_AFTER_S)
        return
    except subprocess.TimeoutExpired:
        pass
    if step is not None:
        subprocess.run(["scancel", step], capture_output=True, timeout=30, check=False)
    try:
        child.wait(timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def write_record(path: Path, record: dict[str, Any]) -> None:
    """A point's record (atomic); a file system error is said, never fatal to the other points."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        rundir.write_json(path, record)
    except OSError as err:
        say(f"could not write {path}: {err}")


def step_name(point: dict[str, Any]) -> str:
    argv = point["argv"]
    found = [a.split("=", 1)[1] for a in argv if isinstance(a, str) and a.startswith("--job-name=")]
    return found[0] if found else f"mbx-point-{point['pos']}"


def run_step(point: dict[str, Any], env: dict[str, str]) -> tuple[int | None, str | None]:
    """Run one point's srun step to its end: (srun's exit code, None | "cancel" | "deadline" | "signal")."""
    cancel, deadline = Path(point["cancel"]), point.get("deadline_s")
    started = time.time()
    try:
        child = subprocess.Popen([str(a) for a in point["argv"]], env=env)
    except OSError as err:
        say(f"cannot start srun for {point['cell_id']}: {err}")
        return 127, None
    stopped: str | None = None
    while True:
        try:
            return child.wait(timeout=POLL_S), stopped
        except subprocess.TimeoutExpired:
            pass
        if STOP["signal"]:
            stopped = "signal"
        elif stopped is None and cancel.exists():
            stopped = "cancel"
            stop_step(child, step_name(point))
        elif stopped is None and deadline is not None and time.time() - started > float(deadline):
            stopped = "deadline"
            stop_step(child, step_name(point))


def run_point(point: dict[str, Any], restart: int) -> None:
    """One point: skip, or run its step and record how it ended."""
    record_path = Path(point["record"])
    record = rundir.read_json(record_path) or {}
    label = f"{point['cell_id']} attempt {point['attempt']}"
    if record.get("ended_at") is not None:
        say(f"{label}: ended in an earlier run of this allocation, skipped")
        return
    if Path(point["cancel"]).exists():
        write_record(record_path, {"started_at": None, "ended_at": time.time(), "exit_code": None,
                                        "stopped": "cancel", "restart": restart})  # fmt: skip
        say(f"{label}: stopped by mbx before it started")
        return
    env = dict(os.environ)
    if restart > 0 and not record.get("started_at"):
        env["SLURM_RESTART_COUNT"] = "0"  # never ran before: nothing of it to archive
    started = time.time()
    write_record(record_path, {"started_at": started, "restart": restart, "step": step_name(point)})
    say(f"{label}: started ({point['run_dir']})")
    code, stopped = run_step(point, env)
    if stopped == "signal" or STOP["signal"]:
        say(f"{label}: the allocation was stopped (signal {STOP['signal']}); Slurm's word decides")
        return
    write_record(record_path, {"started_at": started, "restart": restart, "ended_at": time.time(),
                                    "exit_code": code, "stopped": stopped,
                                    "deadline_s": point.get("deadline_s")})  # fmt: skip
    say(f"{label}: srun exit {code}" + (f", stopped ({stopped})" if stopped else "")
        + f" after {time.time() - started:.1f} s")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launchers/node/pack.py")
    parser.add_argument("--pack", required=True, type=Path, help="pack file (JSON) written at submission")
    parser.add_argument(
        "--allocation", type=int, default=None, help="allocation to run (default: array task)"
    )
    args = parser.parse_args(argv)
    try:
        data = json.loads(args.pack.read_text())
    except (OSError, ValueError) as err:
        print(f"pack.py: cannot read {args.pack}: {err}", file=sys.stderr)
        return 2
    points = pick_allocation(data, args.allocation)
    restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)

    def stopped(signum: int, _frame: object) -> None:
        STOP["signal"] = signum

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)
    say(f"{len(points)} point(s) back to back (restart {restart})")
    for point in points:
        if STOP["signal"]:
            break
        run_point(point, restart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
