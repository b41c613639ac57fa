"""Runs one attempt's command on this node and leaves the run dir self-describing: exit.json, fallback status.json.

`python -m launchers._attempt --run-dir DIR [--time-limit-s S] [--log FILE] -- ARGV...`

The child runs in this process's session; SIGTERM/SIGINT are forwarded to it. When the child ends, exit.json
records its exit code (or signal) and, if the trainer did not write status.json itself, a status.json with
state failed/timeout/cancelled and the tail of the log is written, so whoever collects the run later —
even a new orchestrator after the first was killed — knows what happened.
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

STATUS_FILE = "status.json"
EXIT_FILE = "exit.json"


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _tail(path: Path | None, lines: int = 20) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 8192))
        text = handle.read().decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launchers._attempt")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--time-limit-s", type=float, default=None)
    parser.add_argument("--log", type=Path, default=None, help="file receiving the child's stdout and stderr")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given after --")
    run_dir: Path = args.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)

    stopping = {"signal": None}
    output = args.log.open("ab") if args.log else None
    started = time.time()
    try:
        child = subprocess.Popen(command, stdout=output or None, stderr=subprocess.STDOUT if output else None)
    except OSError as err:  # the program does not exist or cannot run: say so where collection looks
        message = f"cannot start {command[0]!r}: {err.strerror or err}"
        if output:
            output.write((message + "\n").encode())
            output.close()
        print(message, file=sys.stderr)
        now = time.time()
        _write_json(
            run_dir / EXIT_FILE, {"exit_code": 127, "signal": None, "started_at": started, "ended_at": now}
        )
        status_path = run_dir / STATUS_FILE
        if not status_path.exists():
            _write_json(
                status_path,
                {"state": "failed", "reason": message, "exit_code": 127, "written_by": "launcher"},
            )
        return 127

    def forward(signum: int, _frame: object) -> None:
        stopping["signal"] = signum
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    timed_out = False
    while True:
        try:
            code = child.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if args.time_limit_s is not None and time.time() - started > args.time_limit_s and not timed_out:
                timed_out = True
                child.terminate()
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
    ended = time.time()
    exit_info = {
        "exit_code": code,
        "signal": -code if code < 0 else None,
        "started_at": started,
        "ended_at": ended,
    }
    _write_json(run_dir / EXIT_FILE, exit_info)

    status_path = run_dir / STATUS_FILE
    if timed_out:
        state, reason = "timeout", f"time limit of {args.time_limit_s:.0f} s reached"
    elif stopping["signal"] is not None:
        state, reason = "cancelled", f"cancelled (signal {stopping['signal']})"
    elif code != 0:
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        state, reason = "failed", f"trainer {how}"
    else:
        state, reason = "failed", "trainer exited 0 without writing status.json"
    existing = None
    if status_path.exists():
        try:
            existing = json.loads(status_path.read_text())
        except json.JSONDecodeError:
            existing = None
    if existing is None or (state in ("timeout", "cancelled") and existing.get("state") != "completed"):
        _write_json(
            status_path,
            {
                "state": state,
                "reason": reason,
                "exit_code": code,
                "log_tail": _tail(args.log),
                "written_by": "launcher",
            },
        )
    if output:
        output.close()
    return 0 if code == 0 else (code if code > 0 else 128 - code)


if __name__ == "__main__":
    sys.exit(main())
