"""Pure Slurm rendering: groups of attempts, task tables, and the one mapping of profile + settings to a job request.

Both Slurm backends ask Slurm through `job_request(...)` (a `JobRequest` in Slurm's own terms); each backend only
spells that request in its tool's names (submitit's `SlurmExecutor.update_parameters`, NeMo-Run's `SlurmExecutor`).
Nothing here writes a file or runs a command.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launchers.base import LaunchSpec
from launchers.command import ROOT, program_argv, runtime_env
from launchers.profile import IMAGE_ENV, SBATCH_KEY, SlurmProfile, point_image
from launchers.safety import check_value, shown
from launchers.slurm.settings import SlurmSettings

TASKS_FILE = "tasks.json"
SCRIPT_FILE = "job.sbatch"
CLUSTER_KEYS = ("partition", "account", "qos", "constraint")


# ---- groups of attempts ----------------------------------------------------------------------------------
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
    """Attempts that can share one job: the same shape and the same per-point container image (if any)."""
    groups: dict[tuple[Any, ...], list[LaunchSpec]] = {}
    for spec in specs:
        groups.setdefault((*shape_of(spec), spec.env.get(IMAGE_ENV)), []).append(spec)
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


# ---- the task table (what launchers/node/rank.py reads) --------------------------------------------------
def task_entry(spec: LaunchSpec, profile: SlurmProfile, stop_margin_s: float, python: str) -> dict[str, Any]:
    """One attempt as the rank entry reads it: run dir, argv (run with `python`: see launchers.command),
    environment values (never pass-through values), the wrapper's time limit (`stop_margin_s` before the
    scheduler's whole minutes) and what its GPU must hold (`gpu_need`, when known)."""
    entry = {
        "cell_id": spec.cell_id,
        "attempt": spec.attempt,
        "run_dir": str(spec.run_dir),
        "argv": program_argv(spec, python),
        "env": runtime_env(spec),
        "env_passed_by_name": sorted(spec.env_pass),
        "time_limit_s": wrapper_limit_s(spec.resources.time_limit_min, stop_margin_s),
        "container_image": point_image(spec.env, profile.container),
        "git_sha": profile.git_sha,
    }
    if spec.gpu_need is not None:
        entry["gpu_need"] = spec.gpu_need.entry()
    return entry


def task_table(specs: list[LaunchSpec], profile: SlurmProfile, stop_margin_s: float, python: str) -> str:
    """The task table launchers/node/rank.py reads (NeMo-Run's local executor starts the same entry)."""
    return json.dumps([task_entry(s, profile, stop_margin_s, python) for s in specs], indent=1) + "\n"


# ---- the job request -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobRequest:
    """What one Slurm job asks for, in Slurm's terms (checked: every value fits in a job script as one token)."""

    nodes: int
    ntasks_per_node: int
    gpus_per_node: int | None
    time_min: int | None
    cluster: dict[str, Any]  # partition, account, qos, constraint, exclusive, cpus_per_task, mem (those set)
    extra: dict[str, Any]  # more sbatch options by dashed name: export, (no-)requeue, cluster.sbatch_extra
    srun_args: list[str]
    container_image: str | None = None
    container_mounts: list[str] = field(default_factory=list)
    container_workdir: str | None = None
    container_env: list[str] = field(default_factory=list)  # names passed through from the submitting side

    def container_flags(self) -> list[str]:
        """pyxis srun flags (none without an image)."""
        if not self.container_image:
            return []
        flags = [f"--container-image={self.container_image}"]
        if self.container_mounts:
            flags.append("--container-mounts=" + ",".join(self.container_mounts))
        if self.container_workdir:
            flags.append(f"--container-workdir={self.container_workdir}")
        if self.container_env:
            flags.append("--container-env=" + ",".join(self.container_env))
        return flags


def cluster_parameters(profile: SlurmProfile, settings: SlurmSettings) -> dict[str, Any]:
    """partition/account/qos/constraint/exclusive from the profile, cpus_per_task/mem from the settings."""
    cluster = profile.cluster
    params: dict[str, Any] = {}
    for key in CLUSTER_KEYS:
        value = getattr(cluster, key)
        if value:
            params[key] = check_value(f"cluster.{key}", value)
    if cluster.exclusive:
        params["exclusive"] = True
    if settings.cpus_per_task:
        params["cpus_per_task"] = settings.cpus_per_task
    if settings.mem:
        params["mem"] = settings.mem
    return params


def sbatch_extra(profile: SlurmProfile, settings: SlurmSettings) -> dict[str, Any]:
    """`cluster.sbatch_extra` (validated names and values) plus --requeue/--no-requeue and --export=ALL."""
    extra: dict[str, Any] = {"export": "ALL"}
    if settings.requeue is not None:
        extra["requeue" if settings.requeue else "no-requeue"] = True
    for key, value in profile.cluster.sbatch_extra.items():
        if not SBATCH_KEY.fullmatch(key):
            raise ValueError(f"cluster.sbatch_extra: {shown(key)} is not an sbatch option name")
        if value is False:
            continue
        extra[key.replace("_", "-")] = (
            True if value is True else check_value(f"cluster.sbatch_extra.{key}", value)
        )
    return extra


def container_mounts(profile: SlurmProfile, settings: SlurmSettings, workspace: Path) -> list[str]:
    """The container's mounts, plus the mbx checkout and the workspace at their own paths (auto mounts)."""
    mounts = [check_value("container.mounts", m) for m in profile.container.mounts]
    for mount in mounts:
        if "," in mount:
            raise ValueError(
                f"container.mounts: {shown(mount)} contains a comma (pyxis separates mounts with commas)"
            )
    if settings.container_auto_mounts:
        for path in (str(ROOT), str(Path(workspace).resolve())):
            if "," in path or ":" in path:
                raise ValueError(
                    f"cannot mount {shown(path)} into the container (comma or colon in the path)"
                )
            if not any(m.split(":")[0] == path for m in mounts):
                mounts.append(f"{path}:{path}")
    return mounts


def job_request(
    specs: list[LaunchSpec], profile: SlurmProfile, settings: SlurmSettings, workspace: Path
) -> JobRequest:
    """The Slurm job of a group of same-shape attempts (one array, or one NeMo-Run task)."""
    nodes, ranks, minutes = shape_of(specs[0])
    container = profile.container
    own = point_image(specs[0].env, container)  # group_by_shape: one image per group
    image = check_value("container.image", own) if own else None
    return JobRequest(
        nodes=nodes,
        ntasks_per_node=ranks,
        gpus_per_node=ranks if profile.cluster.gpus else None,
        time_min=minutes,
        cluster=cluster_parameters(profile, settings),
        extra=sbatch_extra(profile, settings),
        srun_args=list(settings.srun_args),
        container_image=image,
        container_mounts=container_mounts(profile, settings, workspace) if image else [],
        container_workdir=check_value("container.workdir", container.workdir)
        if image and container.workdir
        else None,
        container_env=sorted({name for s in specs for name in s.env_pass}) if image else [],
    )


def check_profile(profile: SlurmProfile, settings: SlurmSettings, workspace: Path) -> None:
    """Refuse, before anything is written, profile values that cannot go into a job script as one token."""
    check_value("cluster.python", profile.cluster.python)
    cluster_parameters(profile, settings)
    sbatch_extra(profile, settings)
    if profile.container.image:
        check_value("container.image", profile.container.image)
        container_mounts(profile, settings, workspace)
        if profile.container.workdir:
            check_value("container.workdir", profile.container.workdir)
