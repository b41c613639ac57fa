"""The Slurm base class: checks the profile, asks Slurm (one rate-limited query), polls and cancels packed points.

A Slurm backend (submitit, NeMo-Run) subclasses `SlurmLauncher` and writes only `render` and `launch`.

`poll` is the scheduled launcher's (launchers/scheduler.py: the run dir first, then Slurm's word). A packed point
(launchers/slurm/pack.py) is a part of its allocation: asked about through the allocation's job id; once its
runner recorded the end of its srun step, the step's word (completed, failed, stopped by mbx, past its deadline)
stands in for Slurm's, so one point of a pack ends, is collected and retried exactly as one job per point would be.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from launchers.base import Submitted
from launchers.profile import SlurmProfile
from launchers.scheduler import Part, ScheduledLauncher, Scheduler
from launchers.slurm.pack import ALLOCATION, cancel_points, read_record, scheduler_id, step_state
from launchers.slurm.query import SlurmQuery, run_local
from launchers.slurm.render import check_profile
from launchers.slurm.settings import SlurmSettings


class SlurmLauncher(ScheduledLauncher):
    """Base of the Slurm backends: checks the profile, polls through one scheduler query, cancels; subclasses
    implement `render` and `launch` only (and `scheduler_command` when Slurm is reached another way)."""

    Settings: ClassVar[type[SlurmSettings]] = SlurmSettings
    settings: SlurmSettings

    def __init__(
        self,
        settings: SlurmSettings | dict[str, Any] | None,
        workspace: Path,
        profile: SlurmProfile | None = None,
    ):
        super().__init__(settings, workspace, profile)
        check_profile(self.profile, self.settings, self.workspace)

    @property
    def gone_after_s(self) -> float:  # type: ignore[override]
        return self.settings.gone_after_s

    def make_scheduler(self) -> Scheduler:
        s = self.settings
        return SlurmQuery(self.scheduler_command, s.poll_interval_s, s.poll_max_interval_s)

    def scheduler_command(self, argv: list[str]) -> Any:
        """Run a Slurm command (sbatch, sacct, squeue, scancel) where Slurm is: here, by default."""
        return run_local(argv)

    def scheduler_id(self, job: Submitted) -> str:
        return scheduler_id(job)

    def part(self, job: Submitted) -> Part | None:
        if ALLOCATION not in job.info:
            return None
        record = read_record(job)
        return Part(started=record is not None, ended=step_state(record))

    def cancel(self, jobs: list[Submitted]) -> None:
        """scancel the jobs; a packed point is stopped alone (its runner goes on), its allocation once no
        other point of it is left to run."""
        self.query.cancel([job.job_id for job in jobs if ALLOCATION not in job.info] + cancel_points(jobs))
