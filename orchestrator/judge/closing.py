"""The closing lines of a run, `regate` and `status`: the campaign's outcome (orchestrator/judge/outcome.py: its
gates and its verdict kinds' parts, in one word) and the lines that say what failed or is undecided, and why."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.text import Text

from orchestrator.errors import printable
from orchestrator.judge import verdict_kinds
from orchestrator.judge.outcome import FAIL, PASS, Outcome, campaign_outcome
from orchestrator.judge.verdict_kinds import Records
from orchestrator.run.engine import Outcome as RunOutcome
from orchestrator.run.regate import PointVerdict

console = Console(highlight=False, markup=False, emoji=False)
WORD_STYLE = {PASS: "bold green", FAIL: "bold red"}  # anything else: bold yellow


def closing_text(outcome: Outcome, inconclusive_ok: bool = False) -> Text:
    """The closing line, its word styled (`inconclusive_ok`: the command was given --inconclusive-ok)."""
    word, _, rest = outcome.closing(inconclusive_ok).partition(" ")
    return Text.assemble((word + " ", WORD_STYLE.get(outcome.verdict, "bold yellow")), rest)


def verdict_lines(verdicts: Mapping[str, Records]) -> list[Text]:
    """Under the closing line, every verdict kind's lines (kind name → its records): what did not pass, and why
    (run, resume, regate, status)."""
    return [Text(line) for name in verdict_kinds.names() if verdicts.get(name)
            for line in verdict_kinds.get(name).closing_lines(verdicts[name])]  # fmt: skip


def run_outcome(outcome: RunOutcome, points: list[PointVerdict], verdicts: Mapping[str, Records],
                infeasible: int = 0) -> Outcome:  # fmt: skip
    """The outcome of a run (run, resume): every point's verdict, the cells that did not complete, the verdict
    kinds' records (kind name → records), and how many points are recorded infeasible (every point infeasible:
    nothing ran, a failure)."""
    return campaign_outcome([p.verdict for p in points], verdicts, completed=outcome.completed, total=outcome.total,
                            not_completed=len(outcome.failed), skipped=outcome.skipped, infeasible=infeasible)  # fmt: skip


def print_closing(outcome: RunOutcome, points: list[PointVerdict], verdicts: Mapping[str, Records],
                  resume_hint: bool = True, infeasible: int = 0, inconclusive_ok: bool = False) -> Outcome:  # fmt: skip
    """Print the closing line and what stands behind it: cells that did not complete (with `resume_hint`, that
    `mbx campaign resume` runs the retryable ones again), points refused on their node's GPU, points that
    failed or are undecided and why, the verdict kinds' records that did not pass (parity pairs). Returns the
    outcome the exit code comes from (`infeasible`: points recorded infeasible, as run_outcome takes it; `inconclusive_ok`: the command was
    given --inconclusive-ok, which the closing line says)."""
    judged = run_outcome(outcome, points, verdicts, infeasible)
    for cell, note in outcome.warnings:
        console.print(Text(f"  note: {cell.cell_id} [{cell.label}] {note}", style="yellow"), soft_wrap=True)
    console.print(closing_text(judged, inconclusive_ok), soft_wrap=True)
    for line in infeasible_lines(outcome):
        console.print(Text(printable(line)), soft_wrap=True)
    for cell, why in outcome.failed:
        console.print(Text(f"  {cell.cell_id} [{cell.label}] did not complete: {why}"), soft_wrap=True)
    if outcome.retryable and resume_hint:
        classes = ", ".join(sorted(set(outcome.retryable)))
        console.print(Text(f"  {len(outcome.retryable)} of them failed for a reason worth another attempt ({classes}): "
                           f"once it is fixed, `mbx campaign resume {outcome.campaign}` runs them again"), soft_wrap=True)  # fmt: skip
    for line in point_lines(points):
        console.print(line, soft_wrap=True)
    for line in verdict_lines(verdicts):
        console.print(line, soft_wrap=True)
    return judged


def infeasible_lines(outcome: RunOutcome) -> list[str]:
    """The points this run's GPU check refused on their nodes (their allocation's GPU too small), one line each."""
    points = {cell.point_id: (cell, why) for cell, why in outcome.infeasible}
    if not points:
        return []
    head = (f"  {len(points)} point(s) infeasible on the allocation's GPU, not run (recorded with the reason; "
            "`mbx campaign plan FILE --gpu auto` on such a node shows them before a run):")  # fmt: skip
    return [head, *(f"    point [{cell.label}]: {why}" for cell, why in points.values())]


def point_lines(points: list[PointVerdict]) -> list[Text]:
    """One line per point that failed (unless only for cells that did not complete, named above) or is
    undecided, with why."""
    lines = []
    for point in points:
        if point.verdict == PASS:
            continue
        if point.verdict == FAIL:
            if point.gate is not None and all(c.gate == "completed" for c in point.gate.failed):
                continue  # its cells that did not complete are named above
            lines.append(Text(f"  {_point_name(point)} failed: {point.why()}"))
        else:
            lines.append(Text(f"  {_point_name(point)} {point.verdict}: {point.why()}"))
    return lines


def _point_name(point: PointVerdict) -> str:
    """A one-repeat point by its cell id (as the lines above name it), else the point id and its repeats."""
    if len(point.cells) == 1:
        return f"{point.cells[0].cell_id} [{point.label}]"
    return f"point {point.point_id} [{point.label}; {point.finished}/{len(point.cells)} repeats judged]"
