"""Per-process accounting for the test suite (benchmarks/suite_processes.py): every Python process started with
this folder on PYTHONPATH appends its argv, wall and CPU seconds and the test that started it to $PROCLOG."""

import atexit
import json
import os
import resource
import sys
import time

_start = time.time()


def _log() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    row = {"argv": list(getattr(sys, "orig_argv", sys.argv))[:6], "wall": round(time.time() - _start, 3),
           "cpu": round(usage.ru_utime + usage.ru_stime, 3), "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
    try:
        with open(os.environ.get("PROCLOG", "/tmp/proclog.jsonl"), "a") as fh:
            fh.write(json.dumps(row) + "\n")
    except OSError:
        pass


_os_exit = os._exit


def _exit_logged(code: int) -> None:  # the trainer leaves through os._exit, which skips atexit
    _log()
    _os_exit(code)


atexit.register(_log)
os._exit = _exit_logged
