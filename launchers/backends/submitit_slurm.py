"""submitit backend: each group of same-shape attempts is one `submitit.SlurmExecutor` batch (a Slurm job array),
every task a `submitit.helpers.CommandFunction` that starts the srun line of one point (or the pack runner).

Only submitit's public API is used: `SlurmExecutor(folder, python=)`, `update_parameters(...)`, `batch()` +
`submit(CommandFunction(argv))`, the returned `SlurmJob`s (`job_id`, `paths`), and `SlurmJob(folder, job_id)`
with its shared `watcher` for state (sacct). So a batch folder is a submitit folder: `<id>_submission.sh`,
`<id>_<i>_submitted.pkl`, `<id>_<i>_0_log.out|err`, `<id>_<i>_0_result.pkl`, and `submitit.SlurmJob(folder, id)`
works on it. submitit writes the job script itself and has no public way to print it before submitting, so
`render()` spells the same parameters in submitit 1.5's sbatch layout (`sbatch_text`); the real-Slurm test checks
that the file submitit wrote is byte for byte what the dry run printed.

What runs on the node: the batch shell starts submitit's job entry (`PYTHON -u -m submitit.core._submit FOLDER`,
PYTHON = `cluster.python`, or `pack_python` with a container image: it runs outside the container and must import
submitit); it runs the pickled CommandFunction, i.e. `srun --unbuffered --kill-on-bad-exit=1 [container flags]
[srun_args] PYTHON -u launchers/node/rank.py --tasks TABLE --port-base P` (the same srun line as before, so
containers need nothing of submitit inside the image), or with `pack: N` the pack runner (launchers/node/pack.py),
which starts one srun step per point. Hence `use_srun=False`: submitit's own srun would run its entry on every
task, inside the container.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from launchers.base import JobState, LaunchSpec, Rendered, Submitted
from launchers.registry import register
from launchers.safety import check_value, refuse_control
from launchers.scheduler import Scheduler, SchedulerState
from launchers.slurm.launcher import Batch, JobFile, Launched, SlurmLauncher
from launchers.slurm.query import SlurmQuery
from launchers.slurm.render import JobRequest, batch_dir, batch_key, safe_name, shape_label
from launchers.slurm.settings import SlurmSettings

SUBMISSION_FILE = "%j_submission.sh"  # submitit's name for the job script (%j: the job id, an array's own id)
# Slurm signals before the time limit: submitit asks USR2 (its checkpoint-and-requeue hook, which would requeue
# or kill the point); the attempt wrapper stops the trainer on its own clock, so the signal goes to the batch
# shell as SIGCONT, which stops nothing.
SIGNAL = "B:CONT@90"
# submitit 1.5's `SlurmExecutor.update_parameters` names (its ValueError lists them; tests/test_submitit_public_api.py
# checks this list against it): those mbx sets from the campaign are not settable in sbatch_parameters.
SUBMITIT_PARAMETERS = (
    "account", "additional_parameters", "array_parallelism", "comment", "constraint", "cpus_per_gpu",
    "cpus_per_task", "dependency", "exclude", "exclusive", "gpus_per_node", "gpus_per_task", "gres", "job_name",
    "mail_type", "mail_user", "mem", "mem_per_cpu", "mem_per_gpu", "nodelist", "nodes", "ntasks_per_node",
    "num_gpus", "partition", "qos", "setup", "signal_delay_s", "srun_args", "stderr_to_stdout", "teardown", "time",
    "use_srun", "wckey",
)  # fmt: skip
# (num_gpus: submitit's legacy name of gpus_per_node)
_OWN_PARAMETERS = {"job_name", "nodes", "ntasks_per_node", "time", "gpus_per_node", "setup", "teardown", "srun_args",
                   "use_srun", "array_parallelism", "additional_parameters", "partition", "account", "qos",
                   "constraint", "exclusive", "cpus_per_task", "mem", "wckey", "signal_delay_s",
                   "num_gpus"}  # fmt: skip
# Parameters that are not #SBATCH lines (submitit's own switches).
_NOT_SBATCH = {"setup", "teardown", "srun_args", "use_srun", "array_parallelism", "additional_parameters",
               "signal_delay_s", "stderr_to_stdout"}  # fmt: skip


class SubmititSettings(SlurmSettings):
    """Settings of the submitit backend (`launchers.submitit` in a campaign)."""

    array_parallelism: int = Field(
        256, ge=1, description="Array tasks of one shape running at once (--array=0-N%P)."
    )
    wckey: str | None = Field(None, description="sbatch --wckey (submitit's default 'submitit' is not used).")
    sbatch_parameters: dict[str, Any] = Field(
        default_factory=dict,
        description="More sbatch parameters by submitit's names (gres, exclude, mem_per_gpu, comment, ...).",
    )

    @field_validator("wckey")
    @classmethod
    def _wckey_no_control(cls, value: str | None) -> str | None:
        return refuse_control(value)

    @field_validator("sbatch_parameters")
    @classmethod
    def _known(cls, value: dict[str, Any]) -> dict[str, Any]:
        valid = sorted(set(SUBMITIT_PARAMETERS) - _OWN_PARAMETERS)
        for key, item in value.items():
            if key in _OWN_PARAMETERS:
                raise ValueError(f"{key!r} is set by mbx from the campaign (resources/cluster), not here")
            if key not in valid:
                raise ValueError(f"unknown sbatch parameter {key!r}; valid: {', '.join(valid)}")
            check_value(f"sbatch_parameters.{key}", item)
        return value


def srun_line(request: JobRequest, rank_argv: list[str]) -> list[str]:
    """The one srun of an array task that runs one point: every rank runs the per-rank entry."""
    return ["srun", "--unbuffered", "--kill-on-bad-exit=1", *request.container_flags(), *request.srun_args,
            *rank_argv]  # fmt: skip


@dataclass(frozen=True)
class JobPlan:
    """One submitit batch: where, with which executor parameters, which command each of `count` tasks runs."""

    folder: Path
    python: str  # submitit's job entry runs with this interpreter, in the batch shell
    parameters: dict[str, Any]  # for SlurmExecutor.update_parameters
    command: list[str]  # the CommandFunction's argv (the same for every task: the task picks its point)
    count: int  # tasks: one per point, or one per pack

    @property
    def entry(self) -> str:
        """The batch shell's command line: submitit's job entry (`SlurmExecutor._submitit_command_str`'s form)."""
        return " ".join([shlex.quote(self.python), "-u -m submitit.core._submit", shlex.quote(str(self.folder))])


def plan_parameters(
    specs: list[LaunchSpec], request: JobRequest, settings: SubmititSettings, setup: list[str]
) -> dict[str, Any]:
    """The executor's parameters, in submitit's names (`update_parameters`)."""
    params: dict[str, Any] = {
        "job_name": safe_name(f"mbx-{specs[0].campaign}-{shape_label(specs[0])}"),
        "nodes": request.nodes,
        "ntasks_per_node": request.ntasks_per_node,
        "gpus_per_node": request.gpus_per_node,
        "time": request.time_min,  # None: no --time line (the partition's limit)
        "wckey": settings.wckey,
        "array_parallelism": settings.array_parallelism,
        "use_srun": False,
        "setup": setup,
        "additional_parameters": {**request.extra, "signal": SIGNAL},
        **request.cluster,
        **settings.sbatch_parameters,
    }
    return params  # None (time, wckey, gpus_per_node) overrides submitit's default: no such line


def sbatch_flag(key: str, value: Any) -> str:
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def sbatch_text(plan: JobPlan) -> str:
    """The job script submitit 1.5 writes for `plan` (its layout: sorted #SBATCH lines, setup, the command)."""
    params = dict(plan.parameters)
    lines = {k: v for k, v in params.items() if k not in _NOT_SBATCH and v is not None}
    stdout, stderr = str(plan.folder / "%j_%t_log.out"), str(plan.folder / "%j_%t_log.err")
    if plan.count > 1:
        lines["array"] = f"0-{plan.count - 1}%{min(plan.count, params['array_parallelism'])}"
        stdout, stderr = stdout.replace("%j", "%A_%a"), stderr.replace("%j", "%A_%a")
    lines["output"] = stdout.replace("%t", "0")
    if not params.get("stderr_to_stdout"):
        lines["error"] = stderr.replace("%t", "0")
    lines["open-mode"] = "append"
    lines.update(params["additional_parameters"])
    out = ["#!/bin/bash", "", "# Parameters", *(sbatch_flag(k, lines[k]) for k in sorted(lines))]
    out += ["", "# setup", *params["setup"]]
    out += ["", "# command", "export SUBMITIT_EXECUTOR=slurm", plan.entry, ""]
    return "\n".join(out)


def setup_lines(batch: Batch, command: list[str]) -> list[str]:
    """Comments for the batch shell (nothing runs): where the values are, what each task runs."""
    setup = ["# every value reaches the ranks through the task table, never through this shell",
             f"# task table: {shlex.quote(str(batch.table))}"]  # fmt: skip
    if batch.packed:
        setup.append(
            f"# pack file (one srun step per point, back to back): {shlex.quote(str(batch.layout.file))}"
        )
    env_pass = sorted({name for s in batch.specs for name in s.env_pass})
    if env_pass:
        setup.append("# passed by name from the submitting environment (--export=ALL): " + " ".join(env_pass))
    setup.append("# each task runs (a submitit.helpers.CommandFunction): " + shlex.join(command))
    return setup


def sacct_word(state: str) -> tuple[str, str]:
    """submitit's sacct State (`CANCELLED by 0`, `RUNNING`, `COMPLETED+`) → (Slurm's word, the rest)."""
    words = state.split()
    return (words[0].rstrip("+") if words else "UNKNOWN"), " ".join(words[1:])


class SubmititQuery(SlurmQuery):
    """Job states through submitit: one `SlurmJob` per job id (those submitted here, or rebuilt from folder + id
    after a restart), all asked at once through `SlurmJob.watcher` (sacct). Ids it cannot answer go to squeue
    (SlurmQuery); once the watcher answered nothing `SACCT_GIVE_UP` times in a row while squeue did (accounting
    disabled: submitit only logs "Bypassing sacct error"), squeue alone is asked. Cancel stays one batched scancel."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.jobs: dict[str, Any] = {}  # job id → submitit.SlurmJob
        self.silent = 0  # watcher rounds in a row that answered nothing

    def adopt(self, job_id: str, folder: str | Path | None) -> None:
        """Follow `job_id` through a submitit job object (rebuilt from its folder when not submitted here)."""
        if job_id not in self.jobs:
            import submitit

            self.jobs[job_id] = submitit.SlurmJob(folder=folder or ".", job_id=job_id)

    def _sacct(self, job_ids: list[str], answered: dict[str, SchedulerState]) -> bool:
        for job_id in job_ids:
            self.adopt(job_id, None)
        watcher = self.jobs[job_ids[0]].watcher
        watcher.update()
        for job_id in job_ids:
            state = self.jobs[job_id].get_info(mode="cache").get("State")
            if state:
                word, reason = sacct_word(state)
                answered[job_id] = SchedulerState(word, reason, "sacct")
        self.silent = 0 if any(j in answered for j in job_ids) else self.silent + 1
        return True

    def refresh(self, job_ids: list[str], force: bool = False) -> bool:
        asked = super().refresh(job_ids, force)
        if asked and self.sacct_enabled and self.silent >= 3 and any(j in self.states for j in job_ids):
            self.sacct_enabled = False
            self.errors.append("submitit's sacct watcher answered nothing 3 times in a row: asking squeue only")
        return asked


@register
class SubmititLauncher(SlurmLauncher):
    """Submits each group of same-shape attempts as one submitit batch (a Slurm job array)."""

    name = "submitit"
    Settings = SubmititSettings
    settings: SubmititSettings
    query: SubmititQuery

    def make_scheduler(self) -> Scheduler:
        s = self.settings
        return SubmititQuery(self.scheduler_command, s.poll_interval_s, s.poll_max_interval_s)

    def job_folder(self, specs: list[LaunchSpec]) -> Path:
        return batch_dir(self.workspace, specs[0], batch_key(specs))

    def plan(self, batch: Batch) -> JobPlan:
        """The submitit batch: one array task per point (srun of the rank entry) or per pack (the pack runner)."""
        request = self.request(batch.specs)
        if batch.packed:
            request = dataclasses.replace(request, time_min=self.pack_minutes(batch))
            command = self.runner_argv(batch, request.container_image)
        else:
            command = srun_line(request, self.rank_argv(batch))
        setup = setup_lines(batch, command)
        entry_python = self.outside_python(request.container_image)
        parameters = plan_parameters(batch.specs, request, self.settings, setup)
        return JobPlan(batch.folder, entry_python, parameters, command, len(batch.tasks))

    def render_job(self, batch: Batch) -> JobFile:
        plan = self.plan(batch)
        folder = shlex.quote(str(plan.folder))
        note = f"submitit: {plan.count} task(s) of one SlurmExecutor(folder={folder}).batch()"
        # submitit writes the script itself: a script of the job, not one of the files mbx writes
        return JobFile({plan.folder / SUBMISSION_FILE: sbatch_text(plan)}, [], [note])

    def submit_job(self, batch: Batch, rendered: Rendered) -> list[Launched]:
        plan = self.plan(batch)
        if {plan.folder / SUBMISSION_FILE: sbatch_text(plan)} != rendered.scripts:
            raise RuntimeError(f"the job in {plan.folder} is no longer what was rendered")
        jobs = submit(plan)
        common = {"argv": plan.command, "folder": str(plan.folder), "tasks": str(batch.table),
                  "script": str(jobs[0].paths.submission_file), "array_job_id": jobs[0].job_id.split("_")[0],
                  "submitted_at": time.time()}  # fmt: skip
        if isinstance(self.query, SubmititQuery):  # (a test may ask Slurm through a plain SlurmQuery)
            self.query.jobs.update((job.job_id, job) for job in jobs)
        return [Launched(job.job_id, {**common, **task_logs(job)}) for job in jobs]

    def poll(self, jobs: list[Submitted]) -> dict[str, JobState]:
        if isinstance(self.query, SubmititQuery):
            for job in jobs:
                self.query.adopt(self.scheduler_id(job), job.info.get("folder"))
        return super().poll(jobs)


def submit(plan: JobPlan) -> list[Any]:
    """Submit `plan.count` CommandFunctions in one `executor.batch()` (submitit makes it an array when > 1)."""
    import submitit

    executor = submitit.SlurmExecutor(folder=plan.folder, python=shlex.quote(plan.python))
    executor.update_parameters(**plan.parameters)
    function = submitit.helpers.CommandFunction(plan.command)
    delayed = []
    try:
        with executor.batch():
            for _ in range(plan.count):
                delayed.append(executor.submit(function))
    except (submitit.core.utils.FailedJobError, OSError) as err:
        raise RuntimeError(f"sbatch failed: {str(err).strip()}") from err
    return delayed


def task_logs(job: Any) -> dict[str, str]:
    """Where submitit's job script sends a task's stdout and stderr (the batch shell's)."""
    return {"slurm_output": str(job.paths.stdout), "slurm_error": str(job.paths.stderr)}
