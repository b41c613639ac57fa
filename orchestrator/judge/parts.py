"""A verdict's words (PASS / FAIL / INCONCLUSIVE), how several combine, and `Part`, one thing an outcome rests on:
below both orchestrator/judge/outcome.py and the verdict kinds (orchestrator/judge/verdict_kinds.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
VERDICTS = (PASS, FAIL, INCONCLUSIVE)


def combine(verdicts: Iterable[str]) -> str:
    """FAIL when any verdict failed; PASS when there is at least one and every one passed; else INCONCLUSIVE
    (an undecided verdict, one not judged yet, or nothing judged at all)."""
    seen = list(verdicts)
    if FAIL in seen:
        return FAIL
    return PASS if seen and all(v == PASS for v in seen) else INCONCLUSIVE


@dataclass(frozen=True)
class Part:
    """One thing an outcome rests on (the gates, the parity pairs, a search's answer): its verdict, the text that
    says it, and a shorter text for when the whole outcome passed ("every gate passed")."""

    name: str
    verdict: str
    text: str
    brief: str = ""
