"""Numerics parity in a campaign: the `parity:` section (a toggle or explicit pairs) and its pairing of points."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Parity(BaseModel):
    """The `parity:` section of a campaign (filled in by the parity work)."""

    model_config = ConfigDict(extra="forbid")
