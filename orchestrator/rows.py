"""The store's row types: a cell, an attempt, a result (plain dataclasses, below every layer that passes them on;
orchestrator/run/store.py owns their tables)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_KIND = "bundled"  # the trainer kind of a campaign whose `trainer:` section names none
INGESTED = "ingested"  # the trainer kind of a cell `mbx ingest` made from past logs: never launched


@dataclass(kw_only=True)
class CellRow:
    """One cell: a point of the sweep and its repeat index, with everything needed to launch it."""

    campaign: str
    cell_id: str
    point_id: str
    repeat: int
    ordinal: int
    label: str
    params: dict[str, Any]
    recipe: dict[str, Any]
    resources: dict[str, Any]
    env: dict[str, str]
    trainer_kind: str = DEFAULT_KIND  # a trainer kind's name (orchestrator/trainers/kinds/), or INGESTED
    active: bool = True


@dataclass(kw_only=True)
class AttemptRow:
    """One attempt of a cell: one run dir, at most one scheduler job."""

    campaign: str
    cell_id: str
    attempt: int
    launcher: str
    run_dir: str
    state: str
    job_id: str | None = None
    job_info: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    failure_class: str | None = None
    try_number: int = 1  # which try of its cell this attempt is (the retry budget), 1-based
    steps_before: int | None = None  # steps the previous try of the cell made (retry without progress stops)
    submitted_at: float | None = None
    ended_at: float | None = None


@dataclass(kw_only=True)
class ResultRow:
    """What collection made of one finished attempt: window summary and gate verdict."""

    campaign: str
    cell_id: str
    attempt: int
    summary: dict[str, Any] | None
    gate: dict[str, Any] | None
    verdict: str | None = None
