"""Shared Slurm pieces: task tables, sbatch/srun/pyxis flags, state resolution (run dir, sacct, squeue), scancel."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from launchers._rank import JIT_CACHE_VARIABLES
from launchers.base import JobState, LauncherSettings, LaunchSpec, Rendered, Submitted
from launchers.jobenv import runtime_env

ROOT = Path(__file__).resolve().parent.parent
RANK_ENTRY = ROOT / "launchers" / "_rank.py"
TASKS_FILE = "tasks.json"
SCRIPT_FILE = "job.sbatch"
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
SBATCH_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")

# Slurm job states (squeue %T / sacct State) → mbx job states.
_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED",
            "RESIZING", "SIGNALING", "SPECIAL_EXIT", "STOPPED"}  # fmt: skip
_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "POWER_UP_NODE", "UPDATE_DB"}
_FINAL = {
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "DEADLINE": JobState.TIMEOUT,
    "TIMEOUT": JobState.TIMEOUT,
    "CANCELLED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "PREEMPTED": JobState.PREEMPTED,
}
_FILE_STATES = {s.value: s for s in JobState}


class SlurmSettings(LauncherSettings):
    """Settings both Slurm backends share (the cluster itself is the campaign's `cluster` section)."""

    poll_interval_s: float = Field(
        5.0,
        gt=0,
        description="Shortest time between two scheduler queries; it doubles while nothing changes.",
    )
    poll_max_interval_s: float = Field(60.0, gt=0, description="Longest time between two scheduler queries.")
    stop_margin_s: float = Field(
        30.0,
        ge=0,
        description="Stop the trainer this long before Slurm's time limit so the timeout is recorded.",
    )
    master_port_base: int = Field(
        20000, ge=1024, le=45535, description="MASTER_PORT = this + job id mod 20000 (one port per job)."
    )
    requeue: bool | None = Field(
        None, description="sbatch --requeue / --no-requeue (None: the cluster default)."
    )
    cpus_per_task: int | None = Field(None, ge=1, description="sbatch --cpus-per-task.")
    mem: str | None = Field(None, description="sbatch --mem (e.g. 0 for the whole node, 200G).")
    srun_args: list[str] = Field(default_factory=list, description="Extra srun arguments (each one token).")
    container_auto_mounts: bool = Field(
        True, description="Mount the mbx checkout and the workspace at their own paths inside the container."
    )
    gone_after_s: float = Field(
        120.0,
        gt=0,
        description="A job Slurm no longer knows, with no status file for this long, counts as failed.",
    )

    @field_validator("mem", "srun_args")
    @classmethod
    def _no_control(cls, value: Any) -> Any:
        for item in value if isinstance(value, list) else [value]:
            if item is not None and CONTROL_CHARS.search(str(item)):
                raise ValueError(f"{item!r} contains a control character (newline, tab, ...)")
        return value


# rendering ------------------------------------------------------------------------------------------------
@dataclass
class SlurmRendered(Rendered):
    """A rendered group plus what a Slurm dry run shows: the job scripts and every submit command."""

    scripts: dict[Path, str] = field(default_factory=dict)
    submit_commands: list[list[str]] = field(default_factory=list)


def check_value(where: str, value: Any) -> str:
    """A value going into a job script as one quoted token: refuse control characters (a newline ends a line)."""
    text = str(value)
    if CONTROL_CHARS.search(text):
        raise ValueError(
            f"{where}: {text!r} contains a control character (newline, tab, ...); not allowed in job scripts"
        )
    return text


def safe_name(text: str, limit: int = 64) -> str:
    """A Slurm job name / file name made of [A-Za-z0-9._-] only."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:limit] or "mbx"


def slurm_minutes(time_limit_min: float | None) -> int | None:
    """sbatch --time in whole minutes (Slurm's resolution), at least 1."""
    return None if time_limit_min is None else max(1, math.ceil(time_limit_min - 1e-9))


def wrapper_limit_s(time_limit_min: float | None, margin_s: float) -> float | None:
    """When the attempt wrapper stops the trainer: the asked limit, but `margin_s` before Slurm's own."""
    if time_limit_min is None:
        return None
    asked = time_limit_min * 60.0
    before_slurm = slurm_minutes(time_limit_min) * 60.0 - margin_s
    return round(min(asked, before_slurm) if before_slurm > 0 else asked, 3)


def shape_of(spec: LaunchSpec) -> tuple[int, int, int | None]:
    """What one array shares: nodes, ranks per node, Slurm time limit."""
    res = spec.resources
    return (res.nodes, res.gpus_per_node, slurm_minutes(res.time_limit_min))


def group_by_shape(specs: list[LaunchSpec]) -> list[list[LaunchSpec]]:
    groups: dict[tuple, list[LaunchSpec]] = {}
    for spec in specs:
        groups.setdefault(shape_of(spec), []).append(spec)
    return list(groups.values())


def shape_label(spec: LaunchSpec) -> str:
    nodes, ranks, minutes = shape_of(spec)
    return f"{nodes}n{ranks}g" + (f"{minutes}m" if minutes else "")


def batch_key(specs: list[LaunchSpec]) -> str:
    """A stable id of a group of attempts (their cell ids and attempt numbers)."""
    ident = "\n".join(f"{s.cell_id}/{s.attempt}" for s in specs)
    return hashlib.sha256(ident.encode()).hexdigest()[:10]


def batch_dir(workspace: Path, spec: LaunchSpec, key: str) -> Path:
    return Path(workspace) / spec.campaign / "slurm" / f"{shape_label(spec)}-{key}"


def trainer_argv(spec: LaunchSpec, python: str) -> list[str]:
    """The command every rank runs (the bundled trainer: python -m trainer ...)."""
    if spec.module is None:
        return list(spec.args)
    return [python, "-u", "-m", spec.module, *spec.args]


def task_entry(
    spec: LaunchSpec, campaign: Any, settings: SlurmSettings, git_sha: str | None
) -> dict[str, Any]:
    """One attempt as the rank entry reads it: run dir, argv, environment values (never pass-through values)."""
    python = getattr(getattr(campaign, "cluster", None), "python", None) or "python3"
    image = getattr(getattr(campaign, "container", None), "image", None)
    return {
        "cell_id": spec.cell_id,
        "attempt": spec.attempt,
        "run_dir": str(spec.run_dir),
        "argv": trainer_argv(spec, python),
        "env": runtime_env(spec, rank=None),
        "env_passed_by_name": sorted(spec.env_pass),
        "time_limit_s": wrapper_limit_s(spec.resources.time_limit_min, settings.stop_margin_s),
        "container_image": image,
        "git_sha": git_sha,
    }


def task_table(specs: list[LaunchSpec], campaign: Any, settings: SlurmSettings, git_sha: str | None) -> str:
    return json.dumps([task_entry(s, campaign, settings, git_sha) for s in specs], indent=1) + "\n"


def rank_command(campaign: Any, table: Path, settings: SlurmSettings) -> list[str]:
    """What srun starts on every task: the per-rank entry, by path (so nothing needs installing on the nodes)."""
    python = getattr(getattr(campaign, "cluster", None), "python", None) or "python3"
    return [check_value("cluster.python", python), "-u", str(RANK_ENTRY), "--tasks", str(table),
            "--port-base", str(settings.master_port_base)]  # fmt: skip


def container_mounts(campaign: Any, settings: SlurmSettings, workspace: Path) -> list[str]:
    container = getattr(campaign, "container", None)
    mounts = [check_value("container.mounts", m) for m in getattr(container, "mounts", []) or []]
    for mount in mounts:
        if "," in mount:
            raise ValueError(
                f"container.mounts: {mount!r} contains a comma (pyxis separates mounts with commas)"
            )
    if settings.container_auto_mounts:
        for path in (str(ROOT), str(Path(workspace).resolve())):
            if "," in path or ":" in path:
                raise ValueError(f"cannot mount {path!r} into the container (comma or colon in the path)")
            if not any(m.split(":")[0] == path for m in mounts):
                mounts.append(f"{path}:{path}")
    return mounts


def container_flags(
    campaign: Any, settings: SlurmSettings, workspace: Path, env_pass: Iterable[str]
) -> list[str]:
    """pyxis srun flags from the campaign's `container` section (none without an image)."""
    container = getattr(campaign, "container", None)
    image = getattr(container, "image", None)
    if not image:
        return []
    flags = [f"--container-image={check_value('container.image', image)}"]
    mounts = container_mounts(campaign, settings, workspace)
    if mounts:
        flags.append("--container-mounts=" + ",".join(mounts))
    if getattr(container, "workdir", None):
        flags.append(f"--container-workdir={check_value('container.workdir', container.workdir)}")
    names = sorted(set(env_pass))
    if names:
        flags.append("--container-env=" + ",".join(names))
    return flags


def sbatch_cluster_parameters(campaign: Any, settings: SlurmSettings) -> dict[str, Any]:
    """partition/account/qos/constraint/exclusive/extra parameters from the campaign's `cluster` section."""
    cluster = getattr(campaign, "cluster", None)
    params: dict[str, Any] = {}
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(cluster, key, None)
        if value:
            params[key] = check_value(f"cluster.{key}", value)
    if getattr(cluster, "exclusive", False):
        params["exclusive"] = True
    if settings.cpus_per_task:
        params["cpus_per_task"] = settings.cpus_per_task
    if settings.mem:
        params["mem"] = settings.mem
    return params


def sbatch_extra(campaign: Any, settings: SlurmSettings) -> dict[str, Any]:
    """`cluster.sbatch_extra` (validated names and values) plus --requeue/--no-requeue and --export=ALL."""
    extra: dict[str, Any] = {"export": "ALL"}
    if settings.requeue is not None:
        extra["requeue" if settings.requeue else "no-requeue"] = True
    for key, value in (getattr(getattr(campaign, "cluster", None), "sbatch_extra", {}) or {}).items():
        if not SBATCH_KEY.match(key):
            raise ValueError(f"cluster.sbatch_extra: {key!r} is not an sbatch option name")
        if value is False:
            continue
        extra[key.replace("_", "-")] = (
            True if value is True else check_value(f"cluster.sbatch_extra.{key}", value)
        )
    return extra


def submit_env() -> dict[str, str]:
    """The environment sbatch runs with (exported to the job): the caller's, minus rank-local JIT cache values."""
    env = dict(os.environ)
    for name in JIT_CACHE_VARIABLES:
        env.pop(name, None)
    return env


def parse_parsable(stdout: str) -> str:
    """The job id from `sbatch --parsable` output (`123` or `123;cluster`)."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = line.split(";")[0].strip()
    if not job_id.isdigit():
        raise RuntimeError(f"could not read a job id from sbatch output {stdout!r}")
    return job_id


# talking to Slurm ------------------------------------------------------------------------------------------
Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def run_local(argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command on this machine; a missing binary or a hang becomes a failed CompletedProcess."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=submit_env())
    except FileNotFoundError as err:
        return subprocess.CompletedProcess(argv, 127, "", str(err))
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} timed out after {timeout:.0f} s")


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


@dataclass
class SchedulerState:
    state: str  # Slurm's word, e.g. RUNNING, TIMEOUT, CANCELLED
    reason: str = ""
    source: str = ""  # sacct | squeue
    seen_at: float = 0.0


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
        ok = True
        if self.sacct_enabled:
            ok = self._sacct(job_ids, answered)
        missing = [j for j in job_ids if j not in answered]
        if missing:
            ok = self._squeue(missing, answered) and ok
        now = time.time()
        for job_id in job_ids:
            if job_id in answered:
                answered[job_id].seen_at = now
                self.states[job_id] = answered[job_id]
            elif ok:
                self.states.pop(job_id, None)  # neither sacct nor squeue knows it (any more)
        self.last_query = now
        self.queries += 1
        changed = {k: v.state for k, v in self.states.items()} != before
        self.interval_s = (
            self.min_interval_s if changed and ok else min(self.interval_s * 2, self.max_interval_s)
        )
        return True

    def _sacct(self, job_ids: list[str], answered: dict[str, SchedulerState]) -> bool:
        for chunk in _chunks(job_ids):
            out = self.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode", "-j", ",".join(chunk)])
            if out.returncode != 0:
                message = (out.stderr or out.stdout).strip()
                if "accounting storage is disabled" in message.lower() or out.returncode == 127:
                    self.sacct_enabled = False  # no accounting here: squeue and the run dirs it is
                    return True
                self.errors.append(f"sacct: {message}")
                return False
            for line in out.stdout.splitlines():
                parts = line.split("|")
                if len(parts) < 2 or not parts[0]:
                    continue
                words = parts[1].split()
                state = words[0].rstrip("+") if words else "UNKNOWN"
                reason = " ".join(words[1:])  # "by 0" for CANCELLED
                exit_code = parts[2] if len(parts) > 2 else ""
                for job_id in _expand_ids(parts[0]):
                    detail = reason + (f" exit {exit_code}" if exit_code and exit_code != "0:0" else "")
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


def cancel_jobs(job_ids: list[str], run: Runner = run_local) -> None:
    """scancel in batches; ids of jobs that already ended are ignored by Slurm."""
    for chunk in _chunks(sorted(set(job_ids))):
        run(["scancel", *chunk])


# the run dir side ------------------------------------------------------------------------------------------
def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".poll.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - 6000))
        return "\n".join(handle.read().decode("utf-8", "replace").splitlines()[-lines:])


def _interrupted_by_signal(status: dict[str, Any]) -> bool:
    """A status written after a signal (the wrapper's fallback, or the trainer's own "terminated by signal"):
    Slurm knows better why the signal came (scancel, time limit, preemption, another rank failing)."""
    if status.get("state") == "completed":
        return False
    reason = str(status.get("reason", ""))
    return (status.get("written_by") == "launcher" and status.get("state") == "cancelled") or bool(
        re.search(r"signal|SIGTERM|SIGKILL", reason)
    )


def scheduler_reason(sched: SchedulerState, job: Submitted) -> tuple[str, str]:
    """(mbx state, reason) for a job Slurm says has ended."""
    state = _FINAL.get(sched.state, JobState.FAILED).value
    minutes = job.info.get("time_min")
    detail = f" ({sched.reason})" if sched.reason else ""
    if sched.state in ("TIMEOUT", "DEADLINE"):
        limit = f" of {minutes} min" if minutes else ""
        return (
            state,
            f"Slurm time limit{limit} reached: job {job.job_id} {sched.state}{detail} (DUE TO TIME LIMIT)",
        )
    if sched.state in ("CANCELLED", "REVOKED"):
        return (
            state,
            f"cancelled in Slurm (scancel or an administrator): job {job.job_id} {sched.state}{detail}",
        )
    if sched.state == "PREEMPTED":
        return state, f"preempted by Slurm: job {job.job_id}{detail}"
    if sched.state == "COMPLETED":
        return "failed", f"Slurm job {job.job_id} COMPLETED but the run dir has no status.json"
    return state, f"Slurm job {job.job_id} ended {sched.state}{detail}"


class StateResolver:
    """Job states for the engine: the run dir's status file first, then Slurm (batched sacct → squeue).

    With accounting disabled squeue answers for queued and running jobs (and finished ones until MinJobAge);
    after that the run dir's exit.json/status.json say how it ended. A fallback status that the attempt wrapper
    wrote after a signal is corrected with what Slurm says (TIMEOUT → timeout, CANCELLED → cancelled with its
    reason, a rank failure that made srun stop the others → failed). A job that left nothing and that Slurm no
    longer knows counts as failed after `gone_after_s`.
    """

    def __init__(self, query: SlurmQuery, gone_after_s: float = 120.0, settle_s: float = 5.0):
        self.query = query
        self.gone_after_s = gone_after_s
        self.settle_s = settle_s
        self._missing_since: dict[str, float] = {}
        self._final_since: dict[str, float] = {}
        self.last: dict[str, JobState] = {}

    def resolve(self, jobs: list[Submitted]) -> dict[str, JobState]:
        states: dict[str, JobState] = {}
        ask: list[Submitted] = []
        for job in jobs:
            state = self._from_files(job)
            if state is not None:
                states[job.job_id] = state
            else:
                ask.append(job)
        if ask:
            self.query.refresh([j.job_id for j in ask])
        for job in ask:
            states[job.job_id] = self._with_scheduler(job)
        self.last.update(states)
        return states

    def exit_info(self, job: Submitted) -> dict[str, Any]:
        sched = self.query.states.get(job.job_id)
        return (
            {"slurm_state": sched.state, "slurm_reason": sched.reason, "source": sched.source}
            if sched
            else {}
        )

    # ------------------------------------------------------------------------------------------------------
    def _files(self, job: Submitted) -> tuple[Path, dict[str, Any] | None, bool]:
        run_dir = Path(job.info.get("run_dir", "."))
        return run_dir, _read_json(run_dir / "status.json"), (run_dir / "exit.json").exists()

    def _from_files(self, job: Submitted) -> JobState | None:
        _, status, exited = self._files(job)
        if status is None or not exited or _interrupted_by_signal(status):
            return None
        return _FILE_STATES.get(str(status.get("state")), JobState.FAILED)

    def _with_scheduler(self, job: Submitted) -> JobState:
        now = time.time()
        run_dir, status, exited = self._files(job)
        sched = self.query.states.get(job.job_id)
        if sched is not None:
            self._missing_since.pop(job.job_id, None)
        if status is not None and exited:  # the wrapper's fallback after a signal: ask why
            if sched is None:
                return _FILE_STATES.get(str(status.get("state")), JobState.FAILED)
            if sched.state in _FINAL:
                return self._correct(job, run_dir, status, sched)
            return JobState.PENDING if sched.state in _PENDING else JobState.RUNNING
        if sched is None:
            if self.query.queries == 0:
                return JobState.PENDING
            first = self._missing_since.setdefault(job.job_id, now)
            if status is not None and now - first > self.settle_s:
                return _FILE_STATES.get(str(status.get("state")), JobState.FAILED)
            if now - first > self.gone_after_s:
                gone = SchedulerState("FAILED", "no longer known to squeue/sacct", "mbx")
                self._write_scheduler_status(job, run_dir, gone)
                return JobState.FAILED
            return self.last.get(job.job_id, JobState.RUNNING)
        if sched.state in _FINAL:
            first = self._final_since.setdefault(job.job_id, now)
            if now - first < self.settle_s:  # the wrapper may still be writing (or the file system lagging)
                return JobState.RUNNING
            if status is None:
                self._write_scheduler_status(job, run_dir, sched)
                return _FINAL[sched.state]
            if status.get("state") != "completed" and (not exited or _interrupted_by_signal(status)):
                return self._correct(
                    job, run_dir, status, sched
                )  # the wrapper was killed or saw only a signal
            return _FILE_STATES.get(str(status.get("state")), JobState.FAILED)
        if sched.state in _PENDING:
            return JobState.PENDING
        return JobState.RUNNING

    def _log_tail(self, job: Submitted) -> str:
        parts = []
        for key in ("slurm_error", "slurm_output"):
            path = job.info.get(key)
            if path:
                tail = _tail(Path(path))
                if tail:
                    parts.append(tail)
        return "\n".join(parts)

    def _write_scheduler_status(self, job: Submitted, run_dir: Path, sched: SchedulerState) -> None:
        state, reason = scheduler_reason(sched, job)
        if not run_dir.exists():
            return
        _write_json(run_dir / "status.json", {
            "state": state, "reason": reason, "slurm_state": sched.state, "job_id": job.job_id,
            "log_tail": self._log_tail(job), "written_by": "mbx slurm poll",
        })  # fmt: skip

    def _correct(
        self, job: Submitted, run_dir: Path, status: dict[str, Any], sched: SchedulerState
    ) -> JobState:
        if sched.state in ("TIMEOUT", "DEADLINE", "CANCELLED", "REVOKED", "PREEMPTED"):
            state, reason = scheduler_reason(sched, job)
        elif sched.state in ("FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"):
            state = "failed"
            if status.get("state") == "cancelled":  # rank 0 was stopped, not killed by its own failure
                reason = (f"Slurm job {job.job_id} {sched.state}: another rank failed and srun stopped the others "
                          "(see logs/rank-*.log)")  # fmt: skip
            else:
                reason = f"Slurm job {job.job_id} {sched.state}: {status.get('reason')} (see logs/rank-*.log)"
        else:
            return _FILE_STATES.get(str(status.get("state")), JobState.FAILED)
        corrected = {**status, "state": state, "reason": reason, "slurm_state": sched.state,
                     "attempt_wrapper": {"state": status.get("state"), "reason": status.get("reason")},
                     "written_by": "mbx slurm poll"}  # fmt: skip
        _write_json(run_dir / "status.json", corrected)
        return _FILE_STATES.get(state, JobState.FAILED)


def write_files(files: dict[Path, str]) -> None:
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def describe(rendered: SlurmRendered) -> str:
    """What a dry run prints for one rendered group: each script, then each submit command."""
    out = []
    for path, text in rendered.scripts.items():
        out.append(f"# ---- {path}\n{text.rstrip()}\n")
    for path, text in rendered.files.items():
        if path not in rendered.scripts:
            out.append(f"# ---- {path} (read by the ranks; no shell sees it)\n{text.rstrip()}\n")
    for argv in rendered.submit_commands:
        out.append("$ " + shlex.join(argv))
    return "\n".join(out) + "\n"


_GIT_SHA: list[str | None] = []


def project_git_sha() -> str | None:
    """Commit of the mbx checkout the ranks run from ('+dirty' with uncommitted changes); None outside git."""
    if not _GIT_SHA:
        try:
            sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                 timeout=5, check=True).stdout.strip()  # fmt: skip
            dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=5).stdout.strip()  # fmt: skip
            _GIT_SHA.append(sha + ("+dirty" if dirty else ""))
        except (OSError, subprocess.SubprocessError):
            _GIT_SHA.append(None)
    return _GIT_SHA[0]


def check_campaign(campaign: Any, settings: SlurmSettings, workspace: Path) -> None:
    """Refuse, before anything is written, campaign values that cannot go into a job script as one token."""
    if campaign is None:
        return
    cluster = getattr(campaign, "cluster", None)
    for key in ("partition", "account", "qos", "constraint", "python"):
        value = getattr(cluster, key, None)
        if value:
            check_value(f"cluster.{key}", value)
    sbatch_extra(campaign, settings)
    container = getattr(campaign, "container", None)
    if getattr(container, "image", None):
        check_value("container.image", container.image)
        container_mounts(campaign, settings, workspace)
        if container.workdir:
            check_value("container.workdir", container.workdir)
