"""The attempt wrapper: runs one attempt's command and leaves the run dir self-describing (exit.json, status.json).

Command line (the contract; the local backend builds it with `launchers.command.attempt_argv`, and
launchers/node/rank.py calls `run()` in-process on rank 0)::

    PYTHON -m launchers.node.attempt --run-dir DIR --log FILE [--time-limit-s S]
                                     [--gpu-min-gib G --gpu-planned TEXT] -- ARGV...

- run as a command (the local backend), it first writes node.json (`launchers.node.fingerprint`: the machine's
  GPU and its memory, read with nvidia-smi); rank.py writes it itself and passes the GPU to `run()`;
- before the child starts, the GPU check: with --gpu-min-gib G (the memory the point needs per GPU by its
  estimate, orchestrator/run/feasibility.py) and a GPU with less memory than G, the child is never started:
  exit.json records exit code 78 and status.json says failed, failure class `rundir.INFEASIBLE`, with the GPU,
  its memory, the need and the GPU it was planned on (TEXT); without a GPU (none found) nothing is checked;
- the child runs with this process's environment and cwd, its stdout and stderr appended to FILE;
- SIGTERM/SIGINT are forwarded to it; after S seconds it is terminated (SIGKILL 30 s later);
- when it ends, exit.json records its exit code (or signal), the time limit that stopped it
  (`timed_out_after_s`) or the signal that stopped it (`stopped_by_signal`), through `rundir.write_exit`;
- then status.json is settled from what the run left (`rundir.resolve_state(status, exit)`): the trainer's own
  status stands unless this wrapper stopped it; with no status at all, one is written from the exit code
  (writer `rundir.WRAPPER`, with the tail of FILE), so whoever collects the run later knows what happened;
- a command that cannot start is recorded as exit code 127, failed with reason "cannot start ...";
- while the command runs, `rundir.DISK_RESERVE` holds a little of the run dir's file system: if the disk filled
  (the trainer's own last words may be lost then), the wrapper frees it, appends the ENOSPC (or EDQUOT) to FILE
  (where the failure classifier finds it: an infrastructure failure, retried) and adds it to the reason.

Exit status: 0 when the child exited 0, its code when positive, 128 + N when killed by signal N, 78 when the
GPU check refused the point.
Standard library only (plus trainer/rundir.py and reports/secrets.py from the checkout; the scanner's
detect-secrets plugins where that package is installed, its own rules everywhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from launchers.node import fingerprint
from reports import secrets
from trainer import rundir

KILL_AFTER_S = 30.0  # after SIGTERM at the time limit
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
EXIT_INFEASIBLE = 78  # EX_CONFIG: the GPU check refused the point; its command never started


def gpu_refusal(gpu: dict[str, Any] | None, need: dict[str, Any] | None) -> str | None:
    """Why the point cannot run on this allocation's GPU (`fingerprint.card`: name, memory_gib): less memory
    than `need` (min_gib: what the point needs per GPU by its estimate; planned: the GPU it was planned on);
    None when it fits, or when there is no need or no GPU to check."""
    if not need or not gpu or gpu.get("memory_gib") is None or gpu["memory_gib"] >= float(need["min_gib"]):
        return None
    return (f"infeasible on this allocation's GPU: {gpu.get('name')} has {gpu['memory_gib']:.1f} GiB, the point "
            f"needs {float(need['min_gib']):.1f} GiB per GPU by its memory estimate (planned on "
            f"{need.get('planned') or 'a larger GPU'}); the trainer was not started")  # fmt: skip


def refuse(run_dir: Path, log: Path | None, reason: str, started: float) -> int:
    """Record a point the GPU check refused (exit.json, status.json failed with class INFEASIBLE); nothing ran."""
    note(log, f"attempt: {reason}")
    print(f"attempt: {reason}", file=sys.stderr)
    rundir.write_exit(run_dir, exit_code=EXIT_INFEASIBLE, started_at=started, ended_at=time.time())
    rundir.write_status(run_dir, {"state": "failed", "reason": reason, "failure_class": rundir.INFEASIBLE,
                                  "exit_code": EXIT_INFEASIBLE}, rundir.WRAPPER)  # fmt: skip
    return EXIT_INFEASIBLE


def tail(path: Path | None, lines: int = 20) -> str:
    """The last lines of a log file ('' when there is none), any secret in them masked (reports/secrets.py: a
    trainer may print one; status.json and what is made of it must not repeat it)."""
    if path is None or not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - 8192))
        text = handle.read().decode("utf-8", "replace")
    return secrets.mask("\n".join(text.splitlines()[-lines:]))


def settle(run_dir: Path, log: Path | None, reason: str | None = None, also: str | None = None) -> rundir.Resolution:
    """status.json from the run's status and exit facts; a record this wrapper writes carries the log's tail,
    `reason` instead of the resolved one, or `also` after it."""
    resolution = rundir.resolve_state(rundir.read_status(run_dir), rundir.read_exit(run_dir))
    if resolution.write is not None:
        record = {**resolution.write, "log_tail": tail(log)}
        if reason is not None:
            record["reason"] = reason
        if also is not None:
            record["reason"] = f"{record['reason']}; {also}" if record.get("reason") else also
        resolution = dataclasses.replace(resolution, write=record, reason=record["reason"])
    return rundir.settle(run_dir, resolution)


def cannot_start(run_dir: Path, log: Path | None, command: list[str], err: OSError, started: float) -> int:
    """The program does not exist or cannot run: say so where collection looks (exit code 127)."""
    message = f"cannot start {command[0]!r}: {err.strerror or err}"
    rundir.release_space(run_dir)
    note(log, message)
    print(message, file=sys.stderr)
    rundir.write_exit(run_dir, exit_code=127, started_at=started, ended_at=time.time())
    settle(run_dir, log, reason=message if rundir.read_status(run_dir) is None else None)
    return 127


def wait(child: subprocess.Popen[bytes], time_limit_s: float | None, started: float) -> tuple[int, bool]:
    """Wait for the child; terminate it at the time limit. (exit code, whether the limit stopped it)"""
    timed_out = False
    while True:
        try:
            return child.wait(timeout=1.0), timed_out
        except subprocess.TimeoutExpired:
            if time_limit_s is not None and not timed_out and time.time() - started > time_limit_s:
                timed_out = True
                child.terminate()
                try:
                    child.wait(timeout=KILL_AFTER_S)
                except subprocess.TimeoutExpired:
                    child.kill()


def run(run_dir: Path, command: list[str], log: Path | None = None, time_limit_s: float | None = None,
        gpu_need: dict[str, Any] | None = None, gpu: dict[str, Any] | None = None) -> int:  # fmt: skip
    """Run `command` as one attempt in `run_dir` unless `gpu` is smaller than `gpu_need` (`gpu_refusal`);
    returns this wrapper's exit status."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    refusal = gpu_refusal(gpu, gpu_need)
    if refusal is not None:
        return refuse(run_dir, log, refusal, time.time())
    rundir.reserve_space(run_dir)  # best effort: without it a full disk may leave no record (see record_end)
    try:
        return _run(run_dir, command, log, time_limit_s)
    finally:
        rundir.release_space(run_dir)  # also when this wrapper fails (a SIGKILL leaves it: the engine removes it)


def _run(run_dir: Path, command: list[str], log: Path | None, time_limit_s: float | None) -> int:
    started = time.time()
    output = log.open("ab") if log is not None else None
    try:
        try:
            child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT if output else None)
        except OSError as err:
            if output is not None:
                output.close()
                output = None
            return cannot_start(run_dir, log, command, err, started)
        stopping: dict[str, int] = {}

        def forward(signum: int, _frame: object) -> None:
            stopping.setdefault("signal", signum)
            if child.poll() is None:
                child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        code, timed_out = wait(child, time_limit_s, started)
    finally:
        if output is not None:
            output.close()
    record_end(run_dir, log, {"exit_code": code, "started_at": started, "ended_at": time.time(),
                              "timed_out_after_s": time_limit_s if timed_out else None,
                              "stopped_by_signal": None if timed_out else stopping.get("signal")})  # fmt: skip
    return 0 if code == 0 else (code if code > 0 else 128 - code)


def record_end(run_dir: Path, log: Path | None, facts: dict[str, Any]) -> None:
    """exit.json (`facts`: write_exit's arguments) and the settled status.json. On a full disk (or quota) the
    reserve is freed, the cause noted in the log and added to the reason, and both written again."""
    try:
        rundir.write_exit(run_dir, **facts)
        settle(run_dir, log)
        return
    except OSError as err:
        if err.errno not in DISK_FULL:
            print(f"attempt: could not record how the command ended in {run_dir}: {err}", file=sys.stderr)
            return
        full = err
    rundir.release_space(run_dir)  # run() deletes it in every other case
    cause = f"the run dir's disk was full ({errno.errorcode[full.errno]}) when the command ended: {full}"
    try:  # without a reserve (the disk was full from the start) the log's last page may still take the note
        note(log, f"attempt: {cause}")
        rundir.write_exit(run_dir, **facts)
        settle(run_dir, log, also=cause)
    except OSError as again:  # the scheduler's view and collection decide without these files
        print(f"attempt: could not record how the command ended in {run_dir}: {again}", file=sys.stderr)


def note(log: Path | None, line: str) -> None:
    """Append one line to the attempt's log (the file the failure classifier reads)."""
    if log is not None:
        with log.open("ab") as handle:
            handle.write((line + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launchers.node.attempt")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--time-limit-s", type=float, default=None)
    parser.add_argument("--log", type=Path, default=None, help="file receiving the child's stdout and stderr")
    parser.add_argument("--gpu-min-gib", type=float, default=None,
                        help="refuse to start the command on a GPU with less memory than this (GiB)")
    parser.add_argument("--gpu-planned", default=None, help="the GPU the point was planned on (for the reason)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given after --")
    gpus = fingerprint.query_gpus()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    try:
        fingerprint.write_node_record(args.run_dir, fingerprint.node_record({}, dict(os.environ), gpus))
    except OSError as err:  # the fingerprint is a nice-to-have; the GPU check below still runs
        print(f"attempt: could not write {rundir.NODE}: {err}", file=sys.stderr)
    need = None if args.gpu_min_gib is None else {"min_gib": args.gpu_min_gib, "planned": args.gpu_planned}
    return run(args.run_dir, command, args.log, args.time_limit_s, need, fingerprint.card(gpus))


if __name__ == "__main__":
    sys.exit(main())
