"""submitit backend: a sweep as Slurm job arrays (one per resource shape), sbatch text from submitit, one srun task per GPU."""

from __future__ import annotations

import dataclasses
import shlex
import time
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from launchers.base import LaunchSpec, Rendered, Submitted
from launchers.command import node_entry_argv, node_python
from launchers.registry import register
from launchers.safety import check_value, refuse_control
from launchers.slurm.launcher import SlurmLauncher
from launchers.slurm.pack import (
    PACK_FILE,
    PackLayout,
    describe,
    pack_file,
    pack_minutes,
    packs,
    point_info,
    point_job_id,
    runner_argv,
    runner_python,
)
from launchers.slurm.query import parse_parsable
from launchers.slurm.render import (
    SCRIPT_FILE,
    TASKS_FILE,
    JobRequest,
    batch_dir,
    batch_key,
    group_by_shape,
    job_request,
    safe_name,
    shape_label,
    shape_of,
    task_table,
)
from launchers.slurm.settings import SlurmSettings

# sbatch parameters mbx sets itself from the profile and resources: not settable in sbatch_parameters.
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

    @field_validator("wckey")
    @classmethod
    def _wckey_no_control(cls, value: str | None) -> str | None:
        return refuse_control(value)

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


def srun_line(request: JobRequest, rank_argv: list[str]) -> list[str]:
    """The one srun of an array task that runs one point: every rank runs the per-rank entry."""
    return ["srun", "--unbuffered", "--kill-on-bad-exit=1", *request.container_flags(), *request.srun_args,
            *rank_argv]  # fmt: skip


def sbatch_text(
    specs: list[LaunchSpec],
    folder: Path,
    request: JobRequest,
    command: list[str],
    settings: SubmititSettings,
    map_count: int | None = None,
) -> str:
    """The array job script of one group of same-shape attempts, rendered by submitit's `_make_sbatch_string`:
    `command` is what each array task execs (one point's srun, or the pack runner of `map_count` packs)."""
    from submitit.slurm.slurm import _make_sbatch_string

    setup = ["# every value reaches the ranks through the task table, never through this shell",
             f"# task table: {shlex.quote(str(folder / TASKS_FILE))}"]  # fmt: skip
    if map_count is not None:
        setup.append(
            f"# pack file (one srun step per point, back to back): {shlex.quote(str(folder / PACK_FILE))}"
        )
    env_pass = sorted({name for s in specs for name in s.env_pass})
    if env_pass:
        setup.append("# passed by name from the submitting environment (--export=ALL): " + " ".join(env_pass))
    text = _make_sbatch_string(
        command="exec " + shlex.join(command),
        folder=folder,
        map_count=len(specs) if map_count is None else map_count,
        array_parallelism=settings.array_parallelism,
        job_name=safe_name(f"mbx-{specs[0].campaign}-{shape_label(specs[0])}"),
        nodes=request.nodes,
        ntasks_per_node=request.ntasks_per_node,
        gpus_per_node=request.gpus_per_node,
        time=request.time_min,  # None: no --time line (the partition's limit)
        wckey=settings.wckey,
        use_srun=False,
        setup=setup,
        additional_parameters=request.extra,
        **request.cluster,
        **settings.sbatch_parameters,
    )
    # submitit asks for USR2 before the limit (its checkpoint hook); the ranks here would die of it: drop it.
    return "\n".join(line for line in text.split("\n") if not line.startswith("#SBATCH --signal=")) + "\n"


@register
class SubmititLauncher(SlurmLauncher):
    """Submits each group of same-shape attempts as one Slurm job array through sbatch --parsable."""

    name = "submitit"
    Settings = SubmititSettings
    settings: SubmititSettings

    def render(self, specs: list[LaunchSpec]) -> list[Rendered]:
        self.check_specs(specs)
        rendered = []
        for group in group_by_shape(specs):
            folder = batch_dir(self.workspace, group[0], batch_key(group))
            table, script = folder / TASKS_FILE, folder / SCRIPT_FILE
            request = job_request(group, self.profile, self.settings, self.workspace)
            python = node_python(self.profile)
            files = {table: task_table(group, self.profile, self.settings, python)}
            notes: list[str] = []
            if self.settings.pack > 1:
                text = self._packed_script(group, folder, request, python, files, notes)
            else:
                rank = node_entry_argv(python, table, self.settings.master_port_base)
                text = sbatch_text(group, folder, request, srun_line(request, rank), self.settings)
            files[script] = text
            commands = [["sbatch", "--parsable", str(script)]]
            rendered.append(Rendered(group, files, {script: text}, commands, notes))
        return rendered

    def _packed_script(
        self, group: list[LaunchSpec], folder: Path, request: JobRequest, python: str,
        files: dict[Path, str], notes: list[str],
    ) -> str:  # fmt: skip
        """Packs of `pack` points: one array task per pack runs the pack runner (launchers/node/pack.py)."""
        cut = packs(group, self.settings.pack)
        minutes = [pack_minutes(chunk, self.settings) for chunk in cut]
        request = dataclasses.replace(
            request, time_min=None if None in minutes else max(m or 0 for m in minutes)
        )
        layout = PackLayout(folder)
        requests = [request] * len(cut)
        files[layout.file] = pack_file(cut, layout, folder / TASKS_FILE, requests, python, self.settings)
        runner = runner_argv(runner_python(self.profile, self.settings, request.container_image), layout.file)
        notes.append(describe(cut, request.time_min))
        return sbatch_text(group, folder, request, runner, self.settings, map_count=len(cut))

    def launch(self, rendered: Rendered) -> list[Submitted]:
        out = self.scheduler_command(rendered.submit_argv or [])
        if out.returncode != 0:
            raise RuntimeError(f"sbatch failed ({out.returncode}): {(out.stderr or out.stdout).strip()}")
        array_id = parse_parsable(out.stdout)
        folder = next(iter(rendered.scripts)).parent
        common = {"argv": rendered.submit_argv, "script": str(folder / SCRIPT_FILE), "tasks": str(folder / TASKS_FILE),
                  "array_job_id": array_id, "time_min": shape_of(rendered.specs[0])[2], "submitted_at": time.time()}  # fmt: skip
        if self.settings.pack > 1:
            return self._packed_jobs(rendered.specs, folder, array_id, common)
        return [
            Submitted(
                spec.cell_id,
                spec.attempt,
                f"{array_id}_{index}",
                {
                    "run_dir": str(spec.run_dir),
                    "index": index,
                    **common,
                    **task_logs(folder, array_id, index),
                },
            )
            for index, spec in enumerate(rendered.specs)
        ]

    def _packed_jobs(
        self, specs: list[LaunchSpec], folder: Path, array_id: str, common: dict[str, Any]
    ) -> list[Submitted]:
        """One Submitted per point, `<array>_<pack>#<position>`: the engine follows each point as its own job."""
        submitted, index, layout = [], 0, PackLayout(folder)
        cut = packs(specs, self.settings.pack)
        for number, chunk in enumerate(cut):
            allocation = f"{array_id}_{number}"
            for pos, spec in enumerate(chunk):
                info = {"run_dir": str(spec.run_dir), "index": index, **common,
                        **task_logs(folder, array_id, number), **point_info(layout, allocation, number, pos, len(chunk))}  # fmt: skip
                submitted.append(Submitted(spec.cell_id, spec.attempt, point_job_id(allocation, pos), info))
                index += 1
        return submitted


def task_logs(folder: Path, array_id: str, index: int) -> dict[str, str]:
    """Where submitit's job script sends an array task's stdout and stderr."""
    return {"slurm_output": str(folder / f"{array_id}_{index}_0_log.out"),
            "slurm_error": str(folder / f"{array_id}_{index}_0_log.err")}  # fmt: skip
