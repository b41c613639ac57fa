"""The names of the failure classes: what a campaign's `retry.on` may list and what reports/failures.py decides."""

from __future__ import annotations

from typing import Literal

FailureClass = Literal[
    "infra", "oom", "nan", "config", "timeout", "preempted", "hung_after_finish", "unknown"
]
FAILURE_CLASSES: tuple[str, ...] = ("infra", "oom", "nan", "config", "timeout", "preempted", "hung_after_finish",
                                    "unknown")  # fmt: skip
RETRYABLE_BY_DEFAULT: frozenset[str] = frozenset({"infra", "preempted"})
