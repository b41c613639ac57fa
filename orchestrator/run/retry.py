"""Bounded retries: whether a failed attempt gets another attempt of the same cell, and why (not).

An attempt that a resume adopted (it ran on while no orchestrator watched it, e.g. after the run store's disk
filled) and that failed for a retryable reason (infra: ENOSPC, node failure, NCCL; preempted) is never final: it
gets one more attempt even when the budget is spent, so `mbx campaign resume` re-runs what the outage broke.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.spec.campaign import Retry


@dataclass(frozen=True)
class Decision:
    """Retry or not, with the reason shown to the user (None when there is nothing to say)."""

    retry: bool
    why: str | None = None
    real_failure: bool = False  # a retry that got no further: not worth another attempt, by resume either


def decide(
    policy: Retry,
    state: str,
    failure_class: str | None,
    attempts_made: int,
    steps_now: int | None,
    steps_before: int | None,
    adopted: bool = False,
) -> Decision:
    """Another attempt when the attempt failed with a class in `retry.on`, fewer than `max_attempts`
    attempts were made in this campaign run (or it was `adopted` by a resume), and (for a retry) it got further
    than the attempt before."""
    if state in ("completed", "cancelled"):
        return Decision(False)
    if failure_class not in policy.on:
        return Decision(False)
    spent = attempts_made >= policy.max_attempts
    if spent and adopted and not _no_progress(steps_now, steps_before):
        return Decision(True, f"{failure_class} is retryable: attempt {attempts_made} failed while no "
                              "orchestrator followed it, so the resume runs it again")  # fmt: skip
    if spent:
        if policy.max_attempts == 1:
            return Decision(False)
        return Decision(
            False, f"not retried: {attempts_made} of retry.max_attempts={policy.max_attempts} used"
        )
    if _no_progress(steps_now, steps_before):
        return Decision(
            False,
            f"not retried: the retry made no progress (last step {steps_now or 0}, "
            f"previous attempt {steps_before}), so this is a real failure",
            real_failure=True,
        )
    return Decision(
        True, f"{failure_class} is retryable: attempt {attempts_made + 1} of {policy.max_attempts}"
    )


def _no_progress(steps_now: int | None, steps_before: int | None) -> bool:
    """A retry that got no further than the attempt before it."""
    return steps_before is not None and (steps_now or 0) <= steps_before
