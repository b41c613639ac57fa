"""Talking to Slurm: batched, rate-limited sacct → squeue queries, scancel, and the environment sbatch runs with."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable

from launchers.node.environ import JIT_CACHE_VARIABLES
from launchers.scheduler import SchedulerState

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def submit_env() -> dict[str, str]:
    """The environment Slurm commands run with (sbatch exports it to the job): the caller's, minus rank-local
    JIT cache values."""
    env = dict(os.environ)
    for name in JIT_CACHE_VARIABLES:
        env.pop(name, None)
    return env


def run_local(argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command on this machine; a missing binary or a hang becomes a failed CompletedProcess."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=submit_env())
    except FileNotFoundError as err:
        return subprocess.CompletedProcess(argv, 127, "", str(err))
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} timed out after {timeout:.0f} s")


def parse_parsable(stdout: str) -> str:
    """The job id from `sbatch --parsable` output (`123` or `123;cluster`)."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = line.split(";")[0].strip()
    if not job_id.isdigit():
        raise RuntimeError(f"could not read a job id from sbatch output {stdout!r}")
    return job_id


def _chunks(items: list[str], size: int = 400) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _expand_ids(job_id: str) -> list[str]:
    """`123_[0-3,7%2]` → 123_0 ... 123_3, 123_7 (pending arrays); anything else unchanged."""
    match = re.fullmatch(r"(\d+)_\[([^\]%]*)(?:%\d+)?\]", job_id)
    if not match:
        return [job_id]
    ids = []
    for part in match.group(2).split(","):
        low, _, high = part.partition("-")
        ids += [f"{match.group(1)}_{n}" for n in range(int(low), int(high or low) + 1)]
    return ids


SACCT_GIVE_UP = 3  # sacct failures in a row after which only squeue (and the run dirs) are asked


class SlurmQuery:
    """Batched, rate-limited scheduler queries: one sacct for all job ids (skipped for good once accounting is
    found disabled), then squeue for the ids sacct did not answer. The interval doubles while nothing changes."""

    def __init__(self, run: Runner = run_local, min_interval_s: float = 5.0, max_interval_s: float = 60.0):
        self.run = run
        self.min_interval_s = min_interval_s
        self.max_interval_s = max_interval_s
        self.interval_s = min_interval_s
        self.last_query = 0.0
        self.queries = 0
        self.sacct_enabled = True
        self.sacct_failures = 0  # in a row; after SACCT_GIVE_UP the scheduler is asked through squeue only
        self.states: dict[str, SchedulerState] = {}
        self.errors: list[str] = []

    def due(self) -> bool:
        return time.time() - self.last_query >= self.interval_s

    def refresh(self, job_ids: list[str], force: bool = False) -> bool:
        """Query the scheduler about these ids if the interval has passed; True when a query was made."""
        if not job_ids or (not force and not self.due()):
            return False
        before = {k: v.state for k, v in self.states.items()}
        answered: dict[str, SchedulerState] = {}
        sacct_ok = self._sacct(job_ids, answered) if self.sacct_enabled else True
        missing = [j for j in job_ids if j not in answered]
        squeue_ok = self._squeue(missing, answered) if missing else True
        now = time.time()
        for job_id in job_ids:
            if job_id in answered:
                answered[job_id].seen_at = now
                self.states[job_id] = answered[job_id]
            elif squeue_ok:  # squeue was asked about every id sacct did not answer, and answered
                self.states.pop(job_id, None)  # neither sacct nor squeue knows it (any more)
        self.last_query = now
        self.queries += 1
        changed = {k: v.state for k, v in self.states.items()} != before
        self.interval_s = (
            self.min_interval_s
            if changed and sacct_ok and squeue_ok
            else min(self.interval_s * 2, self.max_interval_s)
        )
        return True

    def cancel(self, job_ids: list[str]) -> None:
        """scancel in batches; ids of jobs that already ended are ignored by Slurm."""
        for chunk in _chunks(sorted(set(job_ids))):
            self.run(["scancel", *chunk])

    def _sacct(self, job_ids: list[str], answered: dict[str, SchedulerState]) -> bool:
        for chunk in _chunks(job_ids):
            out = self.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode", "-j", ",".join(chunk)])
            if out.returncode != 0:
                message = (out.stderr or out.stdout).strip()
                if "accounting storage is disabled" in message.lower() or out.returncode == 127:
                    self.sacct_enabled = False  # no accounting here: squeue and the run dirs it is
                    return True
                self.errors.append(f"sacct: {message}")
                self.sacct_failures += 1
                if self.sacct_failures >= SACCT_GIVE_UP:
                    self.sacct_enabled = False
                    self.errors.append(f"sacct failed {SACCT_GIVE_UP} times in a row: asking squeue only")
                return False
            self.sacct_failures = 0
            for line in out.stdout.splitlines():
                parts = line.split("|")
                if len(parts) < 2 or not parts[0]:
                    continue
                words = parts[1].split()
                state = words[0].rstrip("+") if words else "UNKNOWN"
                reason = " ".join(words[1:])  # "by 0" for CANCELLED
                exit_code = parts[2] if len(parts) > 2 else ""
                detail = reason + (f" exit {exit_code}" if exit_code and exit_code != "0:0" else "")
                for job_id in _expand_ids(parts[0]):
                    answered[job_id] = SchedulerState(state, detail.strip(), "sacct")
        return True

    def _squeue(self, job_ids: list[str], answered: dict[str, SchedulerState]) -> bool:
        for chunk in _chunks(job_ids):
            out = self.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%r", "-j", ",".join(chunk)])
            if out.returncode != 0:
                message = (out.stderr or out.stdout).strip()
                if "invalid job id" in message.lower():
                    continue  # none of these ids is known (finished jobs leave squeue after MinJobAge)
                self.errors.append(f"squeue: {message}")
                return False
            for line in out.stdout.splitlines():
                parts = line.strip().split("|")
                if len(parts) < 2:
                    continue
                reason = parts[2] if len(parts) > 2 and parts[2] not in ("None", "(null)") else ""
                for job_id in _expand_ids(parts[0]):
                    answered[job_id] = SchedulerState(parts[1].strip(), reason, "squeue")
        return True
