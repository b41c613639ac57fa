"""The engine's records of work in progress: a cell waiting for its next attempt, an attempt being followed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchers.base import Submitted
from orchestrator.run.store import AttemptRow, CellRow


@dataclass
class Pending:
    """A cell waiting for its next attempt, with the retry budget it carries (which try, the steps before)."""

    cell: CellRow
    try_number: int = 1
    steps_before: int | None = None


@dataclass
class InFlight:
    """One submitted attempt, followed until it is collected."""

    cell: CellRow
    attempt: AttemptRow
    job: Submitted
    kind: Any  # the cell's trainer kind (orchestrator.trainers)
    follower: Any = None  # what follows the attempt's output while it runs (command trainers), else None
    followed_at: float = 0.0  # when the follower last read the logs
    all_logged_since: float | None = None  # when every planned step was first seen logged
    cancelled_at: float | None = None  # when the engine cancelled it as hung after finishing
    requeues_seen: int = 0  # requeue archives of its job already recorded as attempts
    adopted: bool = False  # started by an earlier orchestrator, taken over by a resume (orchestrator/run/retry.py)

    @property
    def run_dir(self) -> Path:
        return Path(self.attempt.run_dir)
