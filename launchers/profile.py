"""The Slurm profile a campaign gives its launcher: the `cluster` and `container` sections, typed and frozen.

`Cluster` and `Container` are the campaign file's sections (orchestrator/campaign.py imports them from here);
`SlurmProfile` is built once by the orchestrator and passed to the launcher instead of the whole campaign::

    SlurmProfile(cluster=campaign.cluster, container=campaign.container, git_sha=project_git_sha())
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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


class Container(_Strict):
    """Container the trainer runs in (pyxis/enroot srun flags)."""

    image: str | None = Field(None, description="Container image (pyxis --container-image).")
    mounts: list[str] = Field(
        default_factory=list, description="SRC:DST[:FLAGS] mounts (pyxis --container-mounts)."
    )
    workdir: str | None = Field(None, description="Working directory inside the container.")


class SlurmProfile(BaseModel):
    """Where a campaign's points run on Slurm: cluster, container, and the mbx commit the ranks run from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: Cluster = Field(default_factory=Cluster, description="The campaign's `cluster` section.")
    container: Container = Field(default_factory=Container, description="The campaign's `container` section.")
    git_sha: str | None = Field(
        None,
        description="Commit of the mbx checkout (orchestrator.fingerprint.project_git_sha); into node.json.",
    )
