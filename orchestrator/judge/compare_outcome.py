"""The outcome of `mbx compare`: the comparison's verdict and the cells a `--run` could not complete, in
orchestrator/judge/outcome.py's words (one closing line, one exit code for the terminal and `--json` alike)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.judge.compare import METRICS, Comparison, threshold_text
from orchestrator.judge.outcome import FAIL, INCONCLUSIVE, PASS, Outcome, Part

WORDS = {PASS: "SAME", FAIL: "WORSE", INCONCLUSIVE: "UNKNOWN"}  # a comparison's verdict as compare says it


def _metrics(names: Sequence[str]) -> str:
    """Metric labels in METRICS order, each once: 'step time (ms), TFLOP/s/GPU'."""
    labels = {m.name: m.label for m in METRICS}
    return ", ".join(
        labels.get(n, n) for n in dict.fromkeys(n for m in METRICS for n in names if n == m.name)
    )


def compare_part(comparison: Comparison) -> Part:
    """`compare WORSE: step time (ms) DIFFERENT in the bad direction`, SAME or UNKNOWN likewise (of the pairs
    compared; none compared: undecided)."""
    verdict = comparison.metrics_verdict
    if not comparison.pairs:
        return Part("compare", INCONCLUSIVE, "compare: no matched point has a completed repeat on both sides")
    if verdict == FAIL:
        worse = _metrics([n for p in comparison.pairs for n in p.worse()])
        return Part("compare", FAIL, f"compare WORSE: {worse} DIFFERENT in the bad direction")
    if verdict == INCONCLUSIVE:
        unknown = _metrics([n for p in comparison.pairs for n in p.unknown()])
        return Part("compare", INCONCLUSIVE, f"compare UNKNOWN: {unknown} undecided (more repeats needed)")
    return Part("compare", PASS, "compare SAME: every metric SAME, below the threshold or better")


def compare_outcome(comparison: Comparison, not_completed: Sequence[str] = ()) -> Outcome:
    """The comparison's outcome; matched points with no completed repeat (not compared) and `not_completed`
    ("cell id: why" of cells a `--run` ran that did not complete) fail it, as they fail `campaign run`."""
    parts = [compare_part(comparison)]
    if comparison.not_compared:
        parts.append(Part("points", FAIL, f"{len(comparison.not_compared)} matched point(s) not compared: "
                          + "; ".join(comparison.not_compared)))  # fmt: skip
    if not_completed:
        parts.append(
            Part("cells", FAIL, f"{len(not_completed)} cell(s) did not complete: " + "; ".join(not_completed))
        )
    head = f"{comparison.a} → {comparison.b} (practical threshold {threshold_text(comparison)})"
    return Outcome(head, tuple(parts))
