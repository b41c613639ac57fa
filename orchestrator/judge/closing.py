"""The closing line of a run, `regate` and `status`: the gates' verdict and, for a `parity:` campaign, its pairs'
(PASS only when every gate and every pair passed; the exit code says the same, orchestrator/flow/runner.py)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from orchestrator.run.engine import Outcome
from orchestrator.run.progress import print_outcome
from orchestrator.run.regate import PointVerdict

console = Console(highlight=False, markup=False, emoji=False)


def parity_head(pairs: list[dict[str, Any]]) -> tuple[str, str]:
    """(verdict, text) of a campaign's parity pairs: fail when one failed, pass when all passed, else
    inconclusive; the text counts them ("parity FAIL: 1 of 2 pair(s) failed, 1 passed")."""
    failed = sum(p["verdict"] == "fail" for p in pairs)
    passed = sum(p["verdict"] == "pass" for p in pairs)
    verdict = "fail" if failed else "pass" if passed == len(pairs) else "inconclusive"
    parts = [f"{failed} of {len(pairs)} pair(s) failed" if failed else f"{passed} of {len(pairs)} pair(s) passed"]
    if failed and passed:
        parts.append(f"{passed} passed")
    undecided = len(pairs) - failed - passed
    if undecided:
        parts.append(f"{undecided} inconclusive")
    return verdict, f"parity {verdict.upper()}: " + ", ".join(parts)


def parity_lines(pairs: list[dict[str, Any]]) -> list[Text]:
    """The parity head line and one line per pair that did not pass (regate, status)."""
    verdict, text = parity_head(pairs)
    style = {"pass": "bold green", "fail": "bold red"}.get(verdict, "bold yellow")
    lines = [Text(text, style=style)]
    for pair in pairs:
        if pair["verdict"] != "pass":
            lines.append(Text(f"  parity {pair['verdict']}: {pair['title']} [{pair['label']}, repeat "
                              f"{pair['repeat']}]: {pair['reason']}"))  # fmt: skip
    return lines


def print_closing(outcome: Outcome, points: list[PointVerdict], pairs: list[dict[str, Any]],
                  resume_hint: bool = True) -> None:  # fmt: skip
    """The closing verdict: the gates' (orchestrator/run/progress.py's lines, unless all passed), then for a parity
    campaign the last line joins both: PASS only when every gate and every pair passed. `resume_hint`: failed cells
    of a retryable class are said to be run again by `mbx campaign resume`."""
    gates_ok = not outcome.failed and all(p.verdict == "pass" for p in points)
    if not pairs or not gates_ok:
        print_outcome(outcome, points, resume_hint)
    if not pairs:
        return
    for cell, note in outcome.warnings if gates_ok else []:
        console.print(Text(f"  note: {cell.cell_id} [{cell.label}] {note}", style="yellow"))
    gates_fail = bool(outcome.failed) or any(p.verdict == "fail" for p in points)
    verdict, text = parity_head(pairs)
    if verdict == "fail" or gates_fail:
        head, style = "FAIL ", "bold red"
    elif verdict == "pass" and gates_ok:
        head, style = "PASS ", "bold green"
    else:
        head, style = "INCONCLUSIVE ", "bold yellow"
    gates = "every gate passed" if gates_ok else "a gate failed" if gates_fail else "gates inconclusive"
    done = f"{outcome.completed}/{outcome.total} completed, {len(points)} point(s), {gates}"
    console.print(Text.assemble((head, style), f"{done}; {text}"), soft_wrap=True)
    for line in parity_lines(pairs)[1:]:
        console.print(line, soft_wrap=True)
