"""Software versions per point: a git ref of a repository on disk (a worktree per ref), pip pins (an overlay per
pin set) and container images, addressable as sweep axes and bisected by `mbx bisect`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Software(BaseModel):
    """The `software:` section of a campaign (filled in by the versions work)."""

    model_config = ConfigDict(extra="forbid")
