"""The Slurm profile a campaign gives its launcher: the `cluster` and `container` sections, typed and frozen.

`Cluster` and `Container` are the campaign file's sections (orchestrator/spec/campaign.py imports them from here);
`SlurmProfile` is built once by the orchestrator and passed to the launcher instead of the whole campaign::

    SlurmProfile(cluster=campaign.cluster, container=campaign.container, git_sha=project_git_sha())
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from launchers.safety import refuse_control, shown

SBATCH_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
IMAGE_ENV = "MBX_CONTAINER_IMAGE"  # a point's own image (sweep key container.image), in its env; wins over the profile's


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Cluster(_Strict):
    """Slurm cluster profile, used by the Slurm backends (submitit, nemo-run)."""

    partition: str | None = Field(None, description="Slurm partition.")
    account: str | None = Field(None, description="Slurm account.")
    qos: str | None = Field(None, description="Slurm QoS.")
    constraint: str | None = Field(None, description="Slurm node constraint.")
    exclusive: bool = Field(False, description="Ask for whole nodes.")
    sbatch_extra: dict[str, str | int | bool] = Field(
        default_factory=dict, description="Extra sbatch parameters (name without dashes → value)."
    )
    python: str = Field("python3", description="Python interpreter on the compute nodes.")
    gpus: bool = Field(True, description="Request GPUs (--gpus-per-node); false for CPU-only partitions.")

    @field_validator("partition", "account", "qos", "constraint", "python", "sbatch_extra")
    @classmethod
    def _no_control(cls, value: Any) -> Any:
        return refuse_control(value)

    @field_validator("sbatch_extra")
    @classmethod
    def _option_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not SBATCH_KEY.fullmatch(key):
                raise ValueError(f"{shown(key)} is not an sbatch option name (letters, digits, _ and -)")
        return value


class Container(_Strict):
    """Container the trainer runs in (pyxis/enroot srun flags)."""

    image: str | None = Field(
        None,
        description=(
            "Container image (pyxis --container-image); sweepable as container.image (Slurm launchers only: each "
            "point's job runs its own image)."
        ),
    )
    mounts: list[str] = Field(
        default_factory=list, description="SRC:DST[:FLAGS] mounts (pyxis --container-mounts)."
    )
    workdir: str | None = Field(None, description="Working directory inside the container.")

    @field_validator("image", "mounts", "workdir")
    @classmethod
    def _no_control(cls, value: Any) -> Any:
        return refuse_control(value)

    @field_validator("mounts")
    @classmethod
    def _no_comma(cls, value: list[str]) -> list[str]:
        for mount in value:
            if "," in mount:
                raise ValueError(f"{shown(mount)} contains a comma (pyxis separates mounts with commas)")
        return value


def point_image(env: dict[str, str], container: Container) -> str | None:
    """The image a point runs in: its own (swept container.image, IMAGE_ENV in its env), else the profile's."""
    return env.get(IMAGE_ENV) or container.image


class SlurmProfile(BaseModel):
    """Where a campaign's points run on Slurm: cluster, container, and the mbx commit the ranks run from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: Cluster = Field(default_factory=Cluster, description="The campaign's `cluster` section.")
    container: Container = Field(default_factory=Container, description="The campaign's `container` section.")
    git_sha: str | None = Field(
        None,
        description="Commit of the mbx checkout (orchestrator.run.fingerprint.project_git_sha); into node.json.",
    )
