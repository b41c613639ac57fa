"""The names of the failure classes: what a campaign's `retry.on` may list and what reports/failures.py decides."""

from __future__ import annotations

from typing import Literal, get_args

FailureClass = Literal[
    "infra", "oom", "nan", "config", "timeout", "preempted", "hung_after_finish", "unknown"
]
FAILURE_CLASSES: tuple[str, ...] = get_args(FailureClass)
RETRYABLE_BY_DEFAULT: frozenset[str] = frozenset({"infra", "preempted"})
