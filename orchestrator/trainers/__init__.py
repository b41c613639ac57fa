"""Trainer kinds by name (`trainer.kind` of a campaign, `trainer_kind` of a cell): one module each in kinds/."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.spec import parity
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.sweep import Point
from orchestrator.trainers.base import Follower, TrainerKind
from orchestrator.trainers.registry import every_kind, get, names

if TYPE_CHECKING:
    from trainer.memory import MemoryEstimate

__all__ = ["Follower", "TrainerKind", "every_kind", "expand", "for_campaign", "get", "memory_estimate", "names",
           "with_parity_axes", "with_steps_key"]  # fmt: skip


def for_campaign(campaign: Campaign) -> TrainerKind:
    """The kind of a campaign's `trainer:` section."""
    return get(campaign.trainer.kind)


def expand(
    campaign: Campaign, campaign_file: Path | None = None, max_cells: int | None = None, strict: bool = True
) -> list[Point]:
    """All cells of a campaign (its kind resolves each point). Raises ConfigError listing every invalid point,
    and for a sweep of more than `max_cells` cells (counted before anything is expanded); without `strict`,
    points with layout problems are kept, marked `infeasible` (orchestrator/run/feasibility.py skips them)."""
    return for_campaign(campaign).expand(campaign, campaign_file, max_cells, strict)


def memory_estimate(point: Point, on_gpu: bool) -> MemoryEstimate | None:
    """The memory estimate of one point by its trainer kind (orchestrator/run/feasibility.py's estimator)."""
    return get(point.trainer_kind).memory_estimate(point, on_gpu)


def with_parity_axes(campaign: Campaign, campaign_file: Path | None = None) -> Campaign:
    """The campaign with its parity sides as sweep factors (orchestrator/spec/parity.py), the checks that depend
    on the trainer kind (eval_check, checkpoint) on the keys its kind gives (`TrainerKind.parity_axes`)."""
    axes = for_campaign(campaign).parity_axes(campaign, campaign_file) if campaign.parity else None
    return parity.with_parity_axes(campaign, campaign_file, axes)


def with_steps_key(campaign: Campaign) -> Campaign:
    """A search's `sweep.search.steps_key`, when the file leaves it unset, as the trainer kind sets a run's length
    (`TrainerKind.steps_key`: training.steps for the bundled trainer, params.train_iters for a Megatron-LM
    command); the campaign as it is otherwise."""
    search = campaign.sweep.search
    if search is None or "steps_key" in search.model_fields_set:
        return campaign
    key = for_campaign(campaign).steps_key(campaign)
    if key is None or key == search.steps_key:
        return campaign
    search = search.model_copy(update={"steps_key": key})
    return campaign.model_copy(update={"sweep": campaign.sweep.model_copy(update={"search": search})})
