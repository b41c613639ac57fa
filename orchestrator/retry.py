"""Bounded retries: whether a failed attempt gets another attempt of the same cell, and why (not)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.campaign import Retry


@dataclass(frozen=True)
class Decision:
    """Retry or not, with the reason shown to the user (None when there is nothing to say)."""

    retry: bool
    why: str | None = None


def decide(
    policy: Retry,
    state: str,
    failure_class: str | None,
    attempts_made: int,
    steps_now: int | None,
    steps_before: int | None,
) -> Decision:
    """Another attempt when the attempt failed with a class in `retry.on`, fewer than `max_attempts`
    attempts were made in this campaign run, and (for a retry) it got further than the attempt before."""
    if state in ("completed", "cancelled"):
        return Decision(False)
    if failure_class not in policy.on:
        return Decision(False)
    if attempts_made >= policy.max_attempts:
        if policy.max_attempts == 1:
            return Decision(False)
        return Decision(
            False, f"not retried: {attempts_made} of retry.max_attempts={policy.max_attempts} used"
        )
    if steps_before is not None and (steps_now or 0) <= steps_before:
        return Decision(
            False,
            f"not retried: the retry made no progress (last step {steps_now or 0}, "
            f"previous attempt {steps_before}), so this is a real failure",
        )
    return Decision(
        True, f"{failure_class} is retryable: attempt {attempts_made + 1} of {policy.max_attempts}"
    )
