"""submitit backend: a sweep as Slurm job arrays (one per resource shape), sbatch text from submitit, one srun task per GPU."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from launchers.base import JobState, Launcher, LaunchSpec, Submitted
from launchers.registry import register
from launchers.slurm_common import (
    SCRIPT_FILE,
    TASKS_FILE,
    SlurmQuery,
    SlurmRendered,
    SlurmSettings,
    StateResolver,
    batch_dir,
    batch_key,
    cancel_jobs,
    check_campaign,
    check_value,
    container_flags,
    describe,
    group_by_shape,
    parse_parsable,
    project_git_sha,
    rank_command,
    run_local,
    safe_name,
    sbatch_cluster_parameters,
    sbatch_extra,
    shape_label,
    shape_of,
    task_table,
)

# sbatch parameters mbx sets itself from the campaign (resources, cluster, container): not settable here.
_OWN_PARAMETERS = {"job_name", "nodes", "ntasks_per_node", "time", "gpus_per_node", "setup", "teardown", "srun_args",
                   "use_srun", "array_parallelism", "additional_parameters", "partition", "account", "qos",
                   "constraint", "exclusive", "cpus_per_task", "mem", "wckey", "signal_delay_s"}  # fmt: skip


def _submitit_parameters() -> dict[str, Any]:
    from submitit.slurm.slurm import _get_default_parameters

    return dict(_get_default_parameters())


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

    @field_validator("sbatch_parameters")
    @classmethod
    def _known(cls, value: dict[str, Any]) -> dict[str, Any]:
        valid = sorted(set(_submitit_parameters()) - _OWN_PARAMETERS)
        for key, item in value.items():
            if key in _OWN_PARAMETERS:
                raise ValueError(f"{key!r} is set by mbx from the campaign (resources/cluster), not here")
            if key not in valid:
                raise ValueError(f"unknown sbatch parameter {key!r}; valid: {', '.join(valid)}")
            check_value(f"sbatch_parameters.{key}", item)
        return value


def sbatch_text(
    specs: list[LaunchSpec],
    folder: Path,
    table: Path,
    campaign: Any,
    settings: SubmititSettings,
    workspace: Path,
) -> str:
    """The array job script of one group of same-shape attempts, rendered by submitit's `_make_sbatch_string`."""
    from submitit.slurm.slurm import _make_sbatch_string

    spec = specs[0]
    nodes, ranks, minutes = shape_of(spec)
    gpus = getattr(getattr(campaign, "cluster", None), "gpus", True)
    env_pass = sorted({name for s in specs for name in s.env_pass})
    srun = ["srun", "--unbuffered", "--kill-on-bad-exit=1", *container_flags(campaign, settings, workspace, env_pass),
            *settings.srun_args, *rank_command(campaign, table, settings)]  # fmt: skip
    setup = ["# every value reaches the ranks through the task table, never through this shell",
             f"# task table: {shlex.quote(str(table))}"]  # fmt: skip
    if env_pass:
        setup.append("# passed by name from the submitting environment (--export=ALL): " + " ".join(env_pass))
    text = _make_sbatch_string(
        command="exec " + shlex.join(srun),
        folder=folder,
        map_count=len(specs),
        array_parallelism=settings.array_parallelism,
        job_name=safe_name(f"mbx-{spec.campaign}-{shape_label(spec)}"),
        nodes=nodes,
        ntasks_per_node=ranks,
        gpus_per_node=ranks if gpus else None,
        time=minutes,  # None: no --time line (the partition's limit)
        wckey=settings.wckey,
        use_srun=False,
        setup=setup,
        additional_parameters=sbatch_extra(campaign, settings),
        **sbatch_cluster_parameters(campaign, settings),
        **settings.sbatch_parameters,
    )
    # submitit asks for USR2 before the limit (its checkpoint hook); the ranks here would die of it: drop it.
    return "\n".join(line for line in text.split("\n") if not line.startswith("#SBATCH --signal=")) + "\n"


@register
class SubmititLauncher(Launcher):
    """Submits each group of same-shape attempts as one Slurm job array through sbatch --parsable."""

    name = "submitit"
    Settings = SubmititSettings

    def __init__(self, settings: SubmititSettings | None, workspace: Path, cluster: Any = None):
        super().__init__(settings, workspace, cluster)
        s = self.settings
        check_campaign(cluster, s, workspace)
        self.query = SlurmQuery(run_local, s.poll_interval_s, s.poll_max_interval_s)
        self.resolver = StateResolver(self.query, gone_after_s=s.gone_after_s)

    def render(self, specs: list[LaunchSpec]) -> list[SlurmRendered]:
        rendered = []
        sha = project_git_sha()
        for group in group_by_shape(specs):
            folder = batch_dir(self.workspace, group[0], batch_key(group))
            table, script = folder / TASKS_FILE, folder / SCRIPT_FILE
            text = sbatch_text(group, folder, table, self.cluster, self.settings, self.workspace)
            argv = ["sbatch", "--parsable", str(script)]
            files = {table: task_table(group, self.cluster, self.settings, sha), script: text}
            item = SlurmRendered(group, files, argv, scripts={script: text}, submit_commands=[argv])
            item.description = describe(item)
            rendered.append(item)
        return rendered

    def launch(self, rendered: SlurmRendered) -> list[Submitted]:
        out = run_local(rendered.submit_argv or [])
        if out.returncode != 0:
            raise RuntimeError(f"sbatch failed ({out.returncode}): {(out.stderr or out.stdout).strip()}")
        array_id = parse_parsable(out.stdout)
        script = next(iter(rendered.scripts))
        folder = script.parent
        minutes = shape_of(rendered.specs[0])[2]
        now = time.time()
        return [
            Submitted(
                spec.cell_id,
                spec.attempt,
                f"{array_id}_{index}",
                {
                    "run_dir": str(spec.run_dir),
                    "argv": rendered.submit_argv,
                    "script": str(script),
                    "tasks": str(folder / TASKS_FILE),
                    "index": index,
                    "array_job_id": array_id,
                    "time_min": minutes,
                    "slurm_output": str(folder / f"{array_id}_{index}_0_log.out"),
                    "slurm_error": str(folder / f"{array_id}_{index}_0_log.err"),
                    "submitted_at": now,
                },
            )  # fmt: skip
            for index, spec in enumerate(rendered.specs)
        ]

    def poll(self, jobs: list[Submitted]) -> dict[str, JobState]:
        return self.resolver.resolve(jobs)

    def cancel(self, jobs: list[Submitted]) -> None:
        cancel_jobs([job.job_id for job in jobs])

    def exit_info(self, job: Submitted) -> dict[str, Any]:
        return self.resolver.exit_info(job)
