"""A launcher whose jobs a scheduler runs: what it asks the scheduler (`Scheduler`), and how `poll` decides a state.

`ScheduledLauncher` is the base of the Slurm backends (launchers/slurm/launcher.py: Slurm's queries) and of
NeMo-Run's local executor (its jobs' states as NeMo-Run reports them); a scheduler answers in Slurm's words
(`SchedulerState`: RUNNING, TIMEOUT, CANCELLED, ...). The split follows ReFrame's: where a job queues (the
scheduler) is apart from what runs on the ranks (launchers/command.py, launchers/node/).

How `poll` decides a job's state, in order:

1. the run dir: a status.json plus exit.json whose status is not a mere "a signal came" is final (no query);
2. otherwise the scheduler (one batched query; Slurm's is rate-limited): pending or running as it says;
3. a job the scheduler says has ended: once the node had `settle_s` to write its files, `rundir.resolve_state`
   decides from status, exit and the scheduler's word (`rundir.SchedulerWord`: TIMEOUT → timeout, CANCELLED →
   cancelled with its reason, a rank failure that made srun stop the others → failed, ...); a status record the
   resolution calls for is written with `rundir.settle` (writer `rundir.SCHEDULER`);
4. a job the scheduler no longer knows: the run dir's status after `settle_s`, else failed after `gone_after_s`
   (accounting disabled: squeue forgets finished jobs after MinJobAge).

A job that is one part of a scheduler's job (a packed point: `part`) is asked about through that job
(`scheduler_id`); once the part's own end is known, its word stands in for the scheduler's.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from launchers.base import JobState, Launcher, Submitted
from launchers.node.attempt import tail
from trainer import rundir

# Slurm job states (squeue %T / sacct State) → mbx job states.
PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED",
           "RESIZING", "SIGNALING", "SPECIAL_EXIT", "STOPPED"}  # fmt: skip
FINAL = {
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


@dataclass
class SchedulerState:
    """What the scheduler last said about one job."""

    state: str  # Slurm's word, e.g. RUNNING, TIMEOUT, CANCELLED
    reason: str = ""
    source: str = ""  # sacct | squeue | mbx | nemo-run | pack
    seen_at: float = 0.0


class Scheduler(Protocol):
    """What a scheduled launcher asks of its scheduler (Slurm's queries; NeMo-Run's local executor has its own)."""

    states: dict[str, SchedulerState]
    queries: int

    def refresh(self, job_ids: list[str], force: bool = False) -> bool: ...

    def cancel(self, job_ids: list[str]) -> None: ...


@dataclass(frozen=True)
class Part:
    """A job that is one part of a scheduler's job (a packed point): whether it has started, how it ended."""

    started: bool
    ended: SchedulerState | None = None  # its own word once it ended (None: not ended, or not known)


def as_job_state(state: Any) -> JobState:
    """A run's final state (rundir.STATES) as a JobState; anything else is failed."""
    return JobState(state) if state in rundir.STATES else JobState.FAILED


@dataclass(frozen=True)
class RunFacts:
    """What one attempt's run dir says right now."""

    run_dir: Path
    status: dict[str, Any] | None
    exit_info: dict[str, Any] | None

    @classmethod
    def of(cls, job: Submitted) -> RunFacts:
        run_dir = Path(job.info.get("run_dir", "."))
        return cls(run_dir, rundir.read_status(run_dir), rundir.read_exit(run_dir))

    @property
    def final(self) -> bool:
        """The node recorded the end and no scheduler knows better (not a mere "a signal came")."""
        return self.status is not None and self.exit_info is not None and not rundir.interrupted(self.status)

    @property
    def state(self) -> JobState:
        return as_job_state(self.status.get("state") if self.status else None)


def scheduler_word(sched: SchedulerState, job: Submitted, has_status: bool) -> rundir.SchedulerWord | None:
    """What the scheduler's final state means for the run (None: it says COMPLETED and the run's status stands)."""
    label = "NeMo-Run" if sched.source == "nemo-run" else "Slurm"
    state = FINAL.get(sched.state, JobState.FAILED).value
    detail = f" ({sched.reason})" if sched.reason else ""
    ident = f"job {job.job_id} {sched.state}{detail}"
    if sched.state in ("TIMEOUT", "DEADLINE"):
        minutes = job.info.get("time_min")
        limit = f" of {minutes} min" if minutes else ""
        reason = f"{label} time limit{limit} reached: {ident} (DUE TO TIME LIMIT)"
    elif sched.state in ("CANCELLED", "REVOKED"):
        reason = f"cancelled in {label} (scancel or an administrator): {ident}"
    elif sched.state == "PREEMPTED":
        reason = f"preempted by {label}: job {job.job_id}{detail}"
    elif sched.state == "COMPLETED":
        if has_status:
            return None
        state, reason = "failed", f"{label} job {job.job_id} COMPLETED but the run dir has no {rundir.STATUS}"
    else:
        reason = f"{label} job {job.job_id} ended {sched.state}{detail}"
    return rundir.SchedulerWord(
        state, reason, sched.state, failed_as=f"{label} job {job.job_id} {sched.state}"
    )


class ScheduledLauncher(Launcher):
    """Base of the backends whose jobs a scheduler runs: `poll` in the order of trust above, `cancel` through the
    scheduler. A subclass makes its scheduler (`make_scheduler`); one whose jobs may be parts of a scheduler's job
    says so through `scheduler_id` and `part`."""

    settle_s: float = 5.0  # how long the node may take to write its files once the scheduler says it ended
    gone_after_s: float = 120.0  # a job the scheduler no longer knows, with no status file, fails after this

    def __init__(self, settings: Any, workspace: Path, profile: Any = None):
        super().__init__(settings, workspace, profile)
        self.query: Scheduler = self.make_scheduler()
        self._missing_since: dict[str, float] = {}
        self._final_since: dict[str, float] = {}
        self._last: dict[str, JobState] = {}

    @abc.abstractmethod
    def make_scheduler(self) -> Scheduler:
        """The scheduler this launcher asks about its jobs and cancels them through."""

    def scheduler_id(self, job: Submitted) -> str:
        """The id to ask the scheduler about (a part's: the job it is part of)."""
        return job.job_id

    def part(self, job: Submitted) -> Part | None:
        """None: the job is a scheduler's job of its own; else what is known of it as a part of one."""
        return None

    def cancel(self, jobs: list[Submitted]) -> None:
        self.query.cancel([job.job_id for job in jobs])

    def poll(self, jobs: list[Submitted]) -> dict[str, JobState]:
        facts = {job.job_id: RunFacts.of(job) for job in jobs}
        ask = sorted({self.scheduler_id(job) for job in jobs if not facts[job.job_id].final})
        if ask:
            self.query.refresh(ask)
        states: dict[str, JobState] = {}
        for job in jobs:
            run = facts[job.job_id]
            states[job.job_id] = run.state if run.final else self._with_scheduler(job, run)
        self._last.update(states)
        return states

    def _with_scheduler(self, job: Submitted, run: RunFacts) -> JobState:
        now = time.time()
        part = self.part(job)
        if part is not None and part.ended is not None:  # a part that ended: its own word, not its job's
            return self._settle(job, run, part.ended)
        sched = self.query.states.get(self.scheduler_id(job))
        if sched is None:
            return self._unknown(job, run, now)
        self._missing_since.pop(job.job_id, None)
        if sched.state in PENDING:
            return JobState.PENDING
        waiting = part is not None and not part.started  # a packed point waiting for its turn
        if sched.state not in FINAL:
            return JobState.PENDING if waiting else JobState.RUNNING
        if waiting:
            sched = dataclasses.replace(
                sched, reason=f"{sched.reason}; the pack ended before this point started".lstrip("; ")
            )
        if run.status is None or run.exit_info is None:  # the node may still be writing its files
            first = self._final_since.setdefault(job.job_id, now)
            if now - first < self.settle_s:
                return JobState.RUNNING
        return self._settle(job, run, sched)

    def _unknown(self, job: Submitted, run: RunFacts, now: float) -> JobState:
        """A job the scheduler does not know (yet, or any more)."""
        if run.status is not None and run.exit_info is not None:
            return run.state  # a status written after a signal, and nobody left to say why
        if self.query.queries == 0:
            return JobState.PENDING
        first = self._missing_since.setdefault(job.job_id, now)
        if run.status is not None and now - first > self.settle_s:
            return run.state
        if now - first > self.gone_after_s:
            return self._settle(job, run, SchedulerState("FAILED", "no longer known to squeue/sacct", "mbx"))
        return self._last.get(job.job_id, JobState.RUNNING)

    def _settle(self, job: Submitted, run: RunFacts, sched: SchedulerState) -> JobState:
        """The final state from the run's facts and the scheduler's word; write the status it calls for."""
        word = scheduler_word(sched, job, has_status=run.status is not None)
        resolution = rundir.resolve_state(run.status, run.exit_info, scheduler=word)
        if resolution.writer == rundir.SCHEDULER and resolution.write is not None and run.run_dir.exists():
            record = {**resolution.write, "job_id": job.job_id}
            if run.status is None:
                record["log_tail"] = self._log_tail(job)
            rundir.settle(run.run_dir, dataclasses.replace(resolution, write=record))
        return as_job_state(resolution.state)

    def _log_tail(self, job: Submitted) -> str:
        tails = [
            tail(Path(job.info[key]), lines=15)
            for key in ("slurm_error", "slurm_output")
            if job.info.get(key)
        ]
        return "\n".join(t for t in tails if t)
