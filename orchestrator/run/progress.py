"""What a campaign run shows while it runs: a live progress bar, a line per finished cell, verdicts that changed
(the closing lines are orchestrator/judge/closing.py's)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from orchestrator.run.engine import Event
from orchestrator.run.store import CellRow

console = Console(highlight=False, markup=False, emoji=False)


def fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


class ProgressReporter:
    """Live rich progress bar plus one line per finished cell."""

    def __init__(self, total: int, name: str, skipped_note: bool = True):
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", style="bold", markup=False),  # the campaign name is user text
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}", markup=False),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task(name, total=total, detail="")
        self.running: set[str] = set()  # cells with an attempt out (one that fails before submission never is)
        self.failed = 0
        self.steps: dict[str, str] = {}  # cell id → "step 12/50" of running command attempts

    def __enter__(self) -> ProgressReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def _detail(self) -> None:
        detail = f"running {len(self.running)}" + (f", failed {self.failed}" if self.failed else "")
        if self.steps:
            detail += (
                " (" + ", ".join(list(self.steps.values())[:4]) + (", …" if len(self.steps) > 4 else "") + ")"
            )
        self.progress.update(self.task, detail=detail)

    def __call__(self, event: Event) -> None:
        cell = event.cell
        if event.kind == "submitted":
            self.running.add(cell.cell_id)
        elif event.kind == "adopted":
            self.running.add(cell.cell_id)
            line = f"  adopted running attempt {event.attempt} of {cell.cell_id} [{cell.label}]"
            self.progress.console.print(Text(line))
        elif event.kind == "skipped":
            self.progress.advance(self.task)
            self.progress.console.print(
                Text(f"  = {cell.cell_id} [{cell.label}] already completed", style="dim")
            )
        elif event.kind == "progress" and event.progress:
            last, planned = event.progress
            self.steps[cell.cell_id] = f"step {last}" + (f"/{planned}" if planned else "")
        elif event.kind == "hung":
            self.progress.console.print(
                Text.assemble(("  ! ", "bold yellow"), f"{cell.cell_id} [{cell.label}] hung after finishing: ",
                              (f"{event.note}; cancelling it (results kept)", "yellow"))
            )  # fmt: skip
        elif event.kind == "requeued":
            self.progress.console.print(
                Text.assemble(("  ↻ ", "bold yellow"), f"{cell.cell_id} [{cell.label}] requeued by Slurm: ",
                              (f"{event.note}; the rerun is attempt {event.attempt}", "yellow"))
            )  # fmt: skip
        elif event.kind == "retrying":
            self.running.discard(cell.cell_id)
            self.steps.pop(cell.cell_id, None)
            collected = event.collected
            assert collected is not None
            self.progress.console.print(
                Text.assemble(("  ↻ ", "bold yellow"), f"{cell.cell_id} [{cell.label}] attempt {event.attempt} "
                              f"{collected.state} ({collected.failure_class}): ",
                              (collected.reason or "no reason", "yellow"), f" — retrying ({event.note})")
            )  # fmt: skip
        elif event.kind == "infeasible":  # refused on its node before the trainer started: not a failure
            self.running.discard(cell.cell_id)
            self.progress.advance(self.task)
            self.progress.console.print(Text.assemble(("  ⊘ ", "bold yellow"), f"{cell.cell_id} [{cell.label}] "
                                                      "infeasible, not run: ", (event.note or "", "yellow")))  # fmt: skip
        elif event.kind == "finished":
            self.running.discard(cell.cell_id)
            self.steps.pop(cell.cell_id, None)
            self.progress.advance(self.task)
            self.progress.console.print(_finished_line(cell, event))
            if event.collected and (
                event.collected.state != "completed" or event.collected.gate.verdict == "fail"
            ):
                self.failed += 1
        self._detail()


def _finished_line(cell: CellRow, event: Event) -> Text:
    collected = event.collected
    assert collected is not None
    if collected.state != "completed":
        cls = f" ({collected.failure_class})" if collected.failure_class else ""
        return Text.assemble(("  ✗ ", "bold red"), f"{cell.cell_id} [{cell.label}] {collected.state}{cls}: ",
                             (collected.reason or "no reason", "red"))  # fmt: skip
    s = collected.summary
    verdict = collected.gate.verdict
    style = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow"}[verdict]
    mark = {"pass": "  ✓ ", "fail": "  ✗ ", "inconclusive": "  ? "}[verdict]
    figures = (
        f"{fmt(s.tflops_per_gpu)} TFLOP/s/GPU, {fmt(s.step_time_ms)} ms/step, loss {fmt(s.first_loss)}→{fmt(s.last_loss)}"
        if s
        else "no metrics"
    )
    failed = "; ".join(c.message for c in collected.gate.failed)
    return Text.assemble((mark, style), f"{cell.cell_id} [{cell.label}] {figures} ", (verdict, style),
                         (f" — {failed}" if failed else "", "red"))  # fmt: skip


def print_changes(changes: list[str], title: str) -> None:
    """One line per verdict that changed, under a title line (nothing when nothing changed)."""
    if changes:
        console.print(Text(f"{len(changes)} verdict(s) changed, {title}:", style="yellow"), soft_wrap=True)
    for line in changes:
        console.print(Text(f"  {line}"), soft_wrap=True)
