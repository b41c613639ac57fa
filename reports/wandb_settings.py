"""A campaign's `wandb` section: where and how its attempts are logged to Weights & Biases (reports/wandb_log.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class WandbSettings(BaseModel):
    """Where and how attempts are logged to Weights & Biases."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["offline", "online", "disabled"] = Field(
        "offline",
        description=(
            "offline: write runs under <dir>/wandb/ to upload later with `wandb sync`; online: send them "
            "now (the API key comes from the WANDB_API_KEY environment variable, never from a file "
            "mbx writes); disabled: log nothing."
        ),
    )
    project: str = Field("mbx", description="W&B project the runs go to.")
    entity: str | None = Field(None, description="W&B entity (user or team); None: the account's default.")
    dir: str | None = Field(
        None, description="Folder wandb writes under (it adds wandb/); None: the campaign's workspace folder."
    )
    tags: list[str] = Field(default_factory=list, description="Tags added to every run.")

    @field_validator("project")
    @classmethod
    def _project_name(cls, value: str) -> str:
        bad = sorted(set(value) & set("/\\#?%:"))
        if not value or len(value) > 128 or bad:
            raise ValueError(
                "a W&B project name is 1-128 characters without / \\ # ? % :"
                + (f" (found {' '.join(bad)})" if bad else "")
            )
        return value
