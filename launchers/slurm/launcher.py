"""The Slurm base class: owns scheduler queries, job states (through `rundir.resolve_state`), poll and cancel.

A Slurm backend (submitit, NeMo-Run) subclasses `SlurmLauncher` and writes only `render` and `launch`.

How `poll` decides a job's state, in order:

1. the run dir: a status.json plus exit.json whose status is not a mere "a signal came" is final (no query);
2. otherwise the scheduler (one batched sacct, squeue for the rest; rate-limited): pending or running as it says;
3. a job the scheduler says has ended: once the node had `settle_s` to write its files, `rundir.resolve_state`
   decides from status, exit and the scheduler's word (`rundir.SchedulerWord`: TIMEOUT → timeout, CANCELLED →
   cancelled with its reason, a rank failure that made srun stop the others → failed, ...); a status record the
   resolution calls for is written with `rundir.settle` (writer `rundir.SCHEDULER`);
4. a job the scheduler no longer knows: the run dir's status after `settle_s`, else failed after `gone_after_s`
   (accounting disabled: squeue forgets finished jobs after MinJobAge).

A packed point (launchers/slurm/pack.py) is asked about through its allocation's job id; once its runner
recorded the end of its srun step, the step's word (completed, failed, stopped by mbx, past its deadline) stands
in for Slurm's, so one point of a pack ends, is collected and retried exactly as one job per point would be.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from launchers.base import JobState, Launcher, Submitted
from launchers.node.attempt import tail
from launchers.profile import SlurmProfile
from launchers.slurm.pack import ALLOCATION, cancel_points, read_record, scheduler_id, step_state
from launchers.slurm.query import Scheduler, SchedulerState, SlurmQuery, run_local
from launchers.slurm.render import check_profile
from launchers.slurm.settings import SlurmSettings
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
    """What Slurm's final state means for the run (None: Slurm says COMPLETED and the run's status stands)."""
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


class SlurmLauncher(Launcher):
    """Base of the Slurm backends: checks the profile, polls through one scheduler query, cancels; subclasses
    implement `render` and `launch` only (and `scheduler_command` when Slurm is reached another way)."""

    Settings: ClassVar[type[SlurmSettings]] = SlurmSettings
    settings: SlurmSettings
    settle_s: float = 5.0  # how long the node may take to write its files after Slurm says the job ended

    def __init__(
        self,
        settings: SlurmSettings | dict[str, Any] | None,
        workspace: Path,
        profile: SlurmProfile | None = None,
    ):
        super().__init__(settings, workspace, profile)
        check_profile(self.profile, self.settings, self.workspace)
        self.query: Scheduler = self.make_scheduler()
        self._missing_since: dict[str, float] = {}
        self._final_since: dict[str, float] = {}
        self._last: dict[str, JobState] = {}

    def make_scheduler(self) -> Scheduler:
        s = self.settings
        return SlurmQuery(self.scheduler_command, s.poll_interval_s, s.poll_max_interval_s)

    def scheduler_command(self, argv: list[str]) -> Any:
        """Run a Slurm command (sbatch, sacct, squeue, scancel) where Slurm is: here, by default."""
        return run_local(argv)

    def cancel(self, jobs: list[Submitted]) -> None:
        """scancel the jobs; a packed point is stopped alone (its runner goes on), its allocation once no
        other point of it is left to run."""
        self.query.cancel([job.job_id for job in jobs if ALLOCATION not in job.info] + cancel_points(jobs))

    def poll(self, jobs: list[Submitted]) -> dict[str, JobState]:
        facts = {job.job_id: RunFacts.of(job) for job in jobs}
        ask = sorted({scheduler_id(job) for job in jobs if not facts[job.job_id].final})
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
        record = read_record(job)
        step = step_state(record)
        if step is not None:  # a packed point whose step ended: the step's word, not the allocation's
            return self._settle(job, run, step)
        sched = self.query.states.get(scheduler_id(job))
        if sched is None:
            return self._unknown(job, run, now)
        self._missing_since.pop(job.job_id, None)
        if sched.state in PENDING:
            return JobState.PENDING
        if sched.state not in FINAL:
            waiting = ALLOCATION in job.info and record is None  # a packed point waiting for its turn
            return JobState.PENDING if waiting else JobState.RUNNING
        if ALLOCATION in job.info and record is None:
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
        if now - first > self.settings.gone_after_s:
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
