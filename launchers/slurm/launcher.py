"""The Slurm base class: the common Slurm path once (task table, packing, the rank entry or pack runner each task
runs, point info), a backend's hooks (render the job, submit it, its scheduler), polling and cancelling packed points.

A Slurm backend is one module of hooks (ARCHITECTURE.md, "Where a new part goes"): `job_folder` (where a job's
task table and pack file go), `render_job` (its job script(s) and submit commands, from a `Batch`), `submit_job`
(submit it: one `Launched` per scheduler task), and `make_scheduler` / `scheduler_command` when Slurm is asked
another way. `job_groups` says which attempts share one job file (default: one per shape).

`poll` is the scheduled launcher's (launchers/scheduler.py: the run dir first, then Slurm's word). A packed point
(launchers/slurm/pack.py) is a part of its allocation: asked about through the allocation's job id; once its
runner recorded the end of its srun step, the step's word (completed, failed, stopped by mbx, past its deadline)
stands in for Slurm's, so one point of a pack ends, is collected and retried exactly as one job per point would be.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from launchers.base import LaunchSpec, Rendered, Submitted
from launchers.command import node_entry_argv, node_python
from launchers.profile import SlurmProfile
from launchers.scheduler import Part, ScheduledLauncher, Scheduler
from launchers.slurm import pack
from launchers.slurm.query import SlurmQuery, run_local
from launchers.slurm.render import (
    TASKS_FILE,
    JobRequest,
    check_profile,
    group_by_shape,
    job_request,
    shape_of,
    task_table,
)
from launchers.slurm.settings import SlurmSettings


@dataclass(frozen=True)
class Batch:
    """The attempts of one job file (a submitit batch, a NeMo-Run Experiment): the folder of their task table and
    pack file, and the scheduler's tasks in task-table order (one point each, or the points of one pack)."""

    folder: Path
    tasks: list[list[LaunchSpec]]
    packed: bool

    @property
    def specs(self) -> list[LaunchSpec]:
        return [spec for task in self.tasks for spec in task]

    @property
    def table(self) -> Path:
        return self.folder / TASKS_FILE

    @property
    def layout(self) -> pack.PackLayout:
        return pack.PackLayout(self.folder)


@dataclass
class JobFile:
    """What a backend renders for a batch: the job scripts a shell reads, the submit commands, notes."""

    scripts: dict[Path, str] = field(default_factory=dict)
    commands: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Launched:
    """One scheduler task as submitted: its Slurm job id and what its points' Submitted.info carries."""

    job_id: str
    info: dict[str, Any]


class SlurmLauncher(ScheduledLauncher):
    """Base of the Slurm backends: `render` and `launch` run the common path and call the backend's hooks;
    `poll` and `cancel` go through one scheduler query."""

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

    # the backend's hooks --------------------------------------------------------------------------------------
    def job_groups(self, specs: list[LaunchSpec]) -> list[list[LaunchSpec]]:
        """The attempts that share one job file (default: one per shape, e.g. one job array each)."""
        return group_by_shape(specs)

    @abc.abstractmethod
    def job_folder(self, specs: list[LaunchSpec]) -> Path:
        """Where the task table and pack file of these attempts (in task-table order) go."""

    @abc.abstractmethod
    def render_job(self, batch: Batch) -> JobFile:
        """Pure: the job script(s) and submit commands of a batch (its task table and pack file are the base's)."""

    @abc.abstractmethod
    def submit_job(self, batch: Batch, rendered: Rendered) -> list[Launched]:
        """Submit a batch exactly as rendered: one Launched per task of `batch.tasks`, in order."""

    def scheduler_command(self, argv: list[str]) -> Any:
        """Run a Slurm command (sbatch, sacct, squeue, scancel) where Slurm is: here, by default."""
        return run_local(argv)

    def make_scheduler(self) -> Scheduler:
        s = self.settings
        return SlurmQuery(self.scheduler_command, s.poll_interval_s, s.poll_max_interval_s)

    # the common path ------------------------------------------------------------------------------------------
    def batch(self, group: list[LaunchSpec]) -> Batch:
        """A job file's attempts cut into tasks: packs of `pack` same-shape points, or one point each."""
        size = self.settings.pack
        if size > 1:
            tasks = [chunk for same in group_by_shape(group) for chunk in pack.packs(same, size)]
        else:
            tasks = [[spec] for spec in group]
        return Batch(self.job_folder([spec for task in tasks for spec in task]), tasks, size > 1)

    def request(self, specs: list[LaunchSpec]) -> JobRequest:
        """The Slurm job of same-shape attempts (launchers/slurm/render.py)."""
        return job_request(specs, self.profile, self.settings, self.workspace)

    def pack_minutes(self, batch: Batch) -> int | None:
        """The longest allocation time of a packed batch (None: any point has no limit)."""
        minutes = [pack.pack_minutes(task, self.settings) for task in batch.tasks]
        return None if None in minutes else max(m or 0 for m in minutes)

    def runner_request(self, task: list[LaunchSpec]) -> JobRequest:
        """The job of one pack's runner started as a task of its own (NeMo-Run): the pack's time, no container
        (it starts the points' srun steps), one task on the first node overlapping its steps."""
        request = self.request(task)
        minutes = pack.pack_minutes(task, self.settings)
        return replace(request, time_min=minutes, container_image=None, srun_args=list(pack.OVERLAP_ARGS))

    def outside_python(self, image: str | None) -> str:
        """The interpreter on the node outside any container (the pack runner's, a batch shell's entry):
        cluster.python, or pack_python with an image."""
        return pack.runner_python(self.profile, self.settings, image)

    def rank_argv(self, batch: Batch, index: int | None = None) -> list[str]:
        """The per-rank entry (launchers/node/rank.py) on point `index` of the task table (None: the array task)."""
        return node_entry_argv(node_python(self.profile), batch.table, self.settings.master_port_base, index)

    def runner_argv(self, batch: Batch, image: str | None, number: int | None = None) -> list[str]:
        """The pack runner (launchers/node/pack.py) of allocation `number` (None: the array task), outside any
        container (`outside_python`)."""
        return pack.runner_argv(self.outside_python(image), batch.layout.file, number)

    def batch_files(self, batch: Batch) -> dict[Path, str]:
        """What mbx writes for a batch: its task table, and with packing the pack file (one request per pack)."""
        python = node_python(self.profile)
        files = {batch.table: task_table(batch.specs, self.profile, self.settings.stop_margin_s, python)}
        if batch.packed:
            requests = [self.request(task) for task in batch.tasks]
            files[batch.layout.file] = pack.pack_file(
                batch.tasks, batch.layout, batch.table, requests, python, self.settings
            )
        return files

    def render(self, specs: list[LaunchSpec]) -> list[Rendered]:
        self.check_specs(specs)
        rendered = []
        for group in self.job_groups(specs) if specs else []:
            batch = self.batch(group)
            job = self.render_job(batch)
            notes = [pack.describe(batch.tasks, self.pack_minutes(batch))] if batch.packed else []
            rendered.append(Rendered(batch.specs, self.batch_files(batch), job.scripts, job.commands,
                                     notes + job.notes))  # fmt: skip
        return rendered

    def launch(self, rendered: Rendered) -> list[Submitted]:
        """Submit through the backend, then one Submitted per point (a packed point: `<allocation>#<position>`,
        so the engine follows each point as its own job)."""
        batch = self.batch(rendered.specs)
        launched_tasks = self.submit_job(batch, rendered)
        submitted: list[Submitted] = []
        for number, (task, launched) in enumerate(zip(batch.tasks, launched_tasks, strict=True)):
            for pos, spec in enumerate(task):
                info = {"run_dir": str(spec.run_dir), "index": len(submitted), "time_min": shape_of(spec)[2],
                        **launched.info}  # fmt: skip
                job_id = launched.job_id
                if batch.packed:
                    info.update(pack.point_info(batch.layout, launched.job_id, number, pos, len(task)))
                    job_id = pack.point_job_id(launched.job_id, pos)
                submitted.append(Submitted(spec.cell_id, spec.attempt, job_id, info))
        return submitted

    # polling and cancelling packed points ---------------------------------------------------------------------
    @property
    def gone_after_s(self) -> float:  # type: ignore[override]
        return self.settings.gone_after_s

    def scheduler_id(self, job: Submitted) -> str:
        return pack.scheduler_id(job)

    def part(self, job: Submitted) -> Part | None:
        if pack.ALLOCATION not in job.info:
            return None
        record = pack.read_record(job)
        return Part(started=record is not None, ended=pack.step_state(record))

    def cancel(self, jobs: list[Submitted]) -> None:
        """scancel the jobs; a packed point is stopped alone (its runner goes on), its allocation once no
        other point of it is left to run."""
        plain = [job.job_id for job in jobs if pack.ALLOCATION not in job.info]
        self.query.cancel(plain + pack.cancel_points(jobs))
