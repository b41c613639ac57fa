"""Settings both Slurm backends share (the cluster itself is the profile); values checked by launchers.safety."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from launchers.base import LauncherSettings
from launchers.safety import refuse_control


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
    pack: int = Field(
        1,
        ge=1,
        description="Points per allocation: each allocation runs its points back to back, one srun step per point "
        "(warm JIT caches, a per-point time limit, a crashed point does not stop the others); 1: one job per point.",
    )
    pack_python: str = Field(
        "python3",
        description="With a container image: the interpreter on the node, outside the container, that runs the pack "
        "runner (pack > 1; it starts one srun step per point) and, for submitit, submitit's job entry (it must "
        "import submitit).",
    )
    gone_after_s: float = Field(
        120.0,
        gt=0,
        description="A job Slurm no longer knows, with no status file for this long, counts as failed.",
    )

    @field_validator("mem", "srun_args", "pack_python")
    @classmethod
    def _no_control(cls, value: Any) -> Any:
        return refuse_control(value)
