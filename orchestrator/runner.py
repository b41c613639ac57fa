"""Glue between the CLI and the engine: store sync, live progress, W&B logging, report pages, exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from orchestrator.campaign import Campaign
from orchestrator.collect import campaign_view, cell_view
from orchestrator.engine import Engine, Event, Outcome, baseline_summaries, make_launcher
from orchestrator.errors import UsageError
from orchestrator.store import CellRow, Store
from orchestrator.sweep import Point
from reports.views import CampaignView, CellView

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def _cell_rows(campaign: str, points: list[Point]) -> list[CellRow]:
    return [
        CellRow(
            campaign,
            p.cell_id,
            p.point_id,
            p.repeat,
            i,
            p.label,
            p.params,
            p.recipe,
            p.resources,
            p.env,
            True,
        )
        for i, p in enumerate(points)
    ]


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


class ProgressReporter:
    """Live rich progress bar plus one line per finished cell."""

    def __init__(self, total: int, name: str, skipped_note: bool = True):
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task(name, total=total, detail="")
        self.running = 0
        self.failed = 0
        self.steps: dict[str, str] = {}  # cell id → "step 12/50" of running command attempts

    def __enter__(self) -> ProgressReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def _detail(self) -> None:
        detail = f"running {self.running}" + (f", failed {self.failed}" if self.failed else "")
        if self.steps:
            detail += (
                " (" + ", ".join(list(self.steps.values())[:4]) + (", …" if len(self.steps) > 4 else "") + ")"
            )
        self.progress.update(self.task, detail=detail)

    def __call__(self, event: Event) -> None:
        cell = event.cell
        if event.kind == "submitted":
            self.running += 1
        elif event.kind == "adopted":
            self.running += 1
            self.progress.console.print(
                f"  adopted running attempt {event.attempt} of {cell.cell_id} [{cell.label}]"
            )
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
            self.running -= 1
            self.steps.pop(cell.cell_id, None)
            collected = event.collected
            assert collected is not None
            self.progress.console.print(
                Text.assemble(("  ↻ ", "bold yellow"), f"{cell.cell_id} [{cell.label}] attempt {event.attempt} "
                              f"{collected.state} ({collected.failure_class}): ",
                              (collected.reason or "no reason", "yellow"), f" — retrying ({event.note})")
            )  # fmt: skip
        elif event.kind == "finished":
            self.running -= 1
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
        f"{_fmt(s.tflops_per_gpu)} TFLOP/s/GPU, {_fmt(s.step_time_ms)} ms/step, loss {_fmt(s.first_loss)}→{_fmt(s.last_loss)}"
        if s
        else "no metrics"
    )
    failed = "; ".join(c.message for c in collected.gate.failed)
    return Text.assemble((mark, style), f"{cell.cell_id} [{cell.label}] {figures} ", (verdict, style),
                         (f" — {failed}" if failed else "", "red"))  # fmt: skip


def _apply_parallel(campaign: Campaign, launcher: str, parallel: int | None) -> Campaign:
    if parallel is None:
        return campaign
    key = launcher if launcher in campaign.launchers else launcher.replace("-", "_")
    settings = dict(campaign.launchers.get(key, {}))
    settings["parallel"] = parallel
    return campaign.model_copy(update={"launchers": {**campaign.launchers, key: settings}})


def run_campaign(
    workspace: Path,
    campaign: Campaign,
    points: list[Point],
    source_file: Path | None,
    launcher: str | None = None,
    parallel: int | None = None,
    make_report: bool = True,
    log_wandb: bool = True,
) -> Outcome:
    """Register a campaign's cells in the store and drive them to completion."""
    launcher_name = launcher or campaign.launcher
    campaign = _apply_parallel(campaign, launcher_name, parallel)
    backend = make_launcher(campaign, launcher_name, Path(workspace))  # before any state is written
    store = Store(workspace)
    try:
        store.upsert_campaign(
            campaign.name,
            str(source_file) if source_file else None,
            campaign.model_dump(mode="json"),
            launcher_name,
        )
        cells = _cell_rows(campaign.name, points)
        store.sync_cells(campaign.name, cells)
        return _drive(store, campaign, backend, cells, make_report, log_wandb)
    finally:
        store.close()


def resume_campaign(
    workspace: Path, name: str, parallel: int | None = None, make_report: bool = True, log_wandb: bool = True
) -> Outcome:
    """Continue a campaign recorded in the store, with the launcher it was started with."""
    store = Store(workspace)
    try:
        record = _record(store, name)
        if record["launcher"] == "ingest":
            raise UsageError(
                f"campaign {name!r} holds logs ingested with `mbx ingest`: there is nothing to resume"
            )
        campaign = _apply_parallel(Campaign.model_validate(record["spec"]), record["launcher"], parallel)
        backend = make_launcher(campaign, record["launcher"], store.workspace)
        return _drive(store, campaign, backend, store.cells(name), make_report, log_wandb)
    finally:
        store.close()


def _record(store: Store, name: str) -> dict[str, Any]:
    record = store.campaign(name)
    if record is None:
        known = ", ".join(store.campaign_names()) or "none yet"
        raise UsageError(f"no campaign named {name!r} in workspace {store.workspace} (known: {known})")
    return record


def _drive(
    store: Store, campaign: Campaign, backend: Any, cells: list[CellRow], make_report: bool, log_wandb: bool
) -> Outcome:
    console.print(
        f"[bold]{campaign.name}[/]: {len(cells)} cell(s) with launcher [bold]{backend.name}[/], workspace {store.workspace}"
    )
    if getattr(backend, "dry_run", False):
        engine = Engine(store, campaign, backend)
        outcome = engine.dry_run(cells)
        console.print(f"dry run: nothing submitted ({outcome.total - outcome.skipped} attempt(s) rendered)")
        return outcome
    logger = _WandbLogger(store, campaign) if log_wandb else None
    with ProgressReporter(len(cells), campaign.name) as progress:

        def on_event(event: Event) -> None:
            progress(event)
            if logger is not None and event.kind == "finished":
                logger.log(event.cell, event.attempt)

        engine = Engine(store, campaign, backend, on_event, baseline_summaries(store, campaign))
        try:
            outcome = engine.run(cells)
        except KeyboardInterrupt:
            progress.progress.stop()
            err_console.print(
                f"interrupted: attempts already started keep running; `mbx campaign resume {campaign.name}` "
                f"collects them and runs the rest, `mbx campaign cancel {campaign.name}` stops them"
            )
            raise SystemExit(130) from None
    if logger is not None:
        logger.report_warnings()
    if make_report:
        page = write_report(store.workspace, campaign_view(store, campaign.name), None)
        console.print(f"report: {page}")
    _print_outcome(outcome)
    return outcome


class _WandbLogger:
    """Logs each finished attempt to W&B; failures become one warning, never a crash."""

    def __init__(self, store: Store, campaign: Campaign):
        self.store = store
        self.campaign = campaign
        self.warnings: list[str] = []

    def log(self, cell: CellRow, attempt: int) -> None:
        if self.campaign.wandb.mode == "disabled":
            return
        from reports.wandb_log import log_attempt

        record = self.store.attempt(self.campaign.name, cell.cell_id, attempt)
        view = cell_view(self.store, self.campaign.name, cell, record)
        config = {
            "campaign": self.campaign.name,
            "cell_id": cell.cell_id,
            "attempt": attempt,
            "params": cell.params,
            "recipe": cell.recipe,
            "resources": cell.resources,
        }
        try:
            log_attempt(
                self.campaign.wandb,
                self.campaign.name,
                view,
                config,
                self.store.workspace,
                on_warning=self.warnings.append,
            )
        except Exception as err:  # W&B must never break a campaign
            self.warnings.append(f"W&B logging of {cell.cell_id} failed: {err}")

    def report_warnings(self) -> None:
        for warning in dict.fromkeys(self.warnings):
            err_console.print(f"warning: {warning}")


def _print_outcome(outcome: Outcome) -> None:
    done = f"{outcome.completed}/{outcome.total} completed"
    if outcome.skipped:
        done += f" ({outcome.skipped} skipped: already completed)"
    for cell, note in outcome.warnings:
        console.print(Text(f"  note: {cell.cell_id} [{cell.label}] {note}", style="yellow"))
    if outcome.ok:
        console.print(Text.assemble(("PASS ", "bold green"), done + ", every gate passed"))
        return
    console.print(Text.assemble(("FAIL ", "bold red"), done))
    for cell, why in outcome.failed:
        console.print(Text(f"  {cell.cell_id} [{cell.label}] did not complete: {why}"))
    for cell, messages in outcome.gate_failures:
        console.print(Text(f"  {cell.cell_id} [{cell.label}] failed gates: " + "; ".join(messages)))


def exit_code(outcome: Outcome) -> int:
    return 0 if outcome.ok else 1


def view(workspace: Path, name: str, with_rows: bool = True) -> CampaignView:
    store = Store(workspace)
    try:
        _record(store, name)
        return campaign_view(store, name, with_rows=with_rows)
    finally:
        store.close()


def write_report(workspace: Path, campaign: CampaignView, out: Path | None) -> Path:
    """Write the HTML report (and its Markdown twin, summary.md) and return the page's path."""
    from reports.markdown import markdown_summary
    from reports.page import write_report as write_page

    out_dir = Path(out) if out else Path(workspace) / campaign.name / "report"
    page = write_page(campaign, out_dir)
    (out_dir / "summary.md").write_text(markdown_summary(campaign))
    return page


def status_payload(view: CampaignView) -> list[dict[str, Any]]:
    return [
        {
            "cell_id": c.cell_id,
            "label": c.label,
            "params": c.params,
            "state": c.state,
            "attempt": c.attempt,
            "reason": c.reason,
            "failure_class": c.failure_class,
            "verdict": c.gate.verdict if c.gate else None,
            "summary": c.summary.to_dict() if c.summary else None,
            "run_dir": c.run_dir,
        }
        for c in view.cells
    ]


def status_table(view: CampaignView) -> Table:
    """Cells with their window figures; the swept values go under the cell id so it fits 80 columns."""
    table = Table(title=f"{view.name}: {len(view.cells)} cell(s), window {view.window}", title_justify="left")
    table.add_column("cell / params", min_width=14, overflow="fold")
    table.add_column("state")
    for column in ("try", "TFLOP/s", "ms/step", "GiB"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("loss", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for cell in view.cells:
        table.add_row(*_status_cells(cell))
    return table


def _status_cells(cell: CellView) -> list[Any]:
    s = cell.summary
    verdict = cell.gate.verdict if cell.gate else "—"
    style = {"pass": "green", "fail": "red", "inconclusive": "yellow"}.get(verdict, "")
    state = cell.state + (f" ({cell.failure_class})" if cell.failure_class else "")
    return [
        Text.assemble(cell.cell_id, "\n", (cell.label, "dim")),
        Text(state, style="red" if cell.state in ("failed", "timeout", "cancelled") else ""),
        str(cell.attempt or "—"),
        _fmt(s.tflops_per_gpu if s else None),
        _fmt(s.step_time_ms if s else None, 4),
        _fmt(s.peak_alloc_gib if s else None),
        f"{_fmt(s.first_loss)}→{_fmt(s.last_loss)}" if s else "—",
        Text(verdict, style=style),
    ]


def cancel_campaign(workspace: Path, name: str) -> int:
    """Cancel the active attempts of a campaign through the launcher that started them."""
    from launchers.base import Submitted

    store = Store(workspace)
    try:
        record = _record(store, name)
        campaign = Campaign.model_validate(record["spec"])
        if record["launcher"] == "ingest":
            return 0
        active = [a for a in store.attempts(name) if a.state in ("submitted", "running") and a.job_id]
        by_launcher: dict[str, list[Any]] = {}
        for attempt in active:
            by_launcher.setdefault(attempt.launcher, []).append(attempt)
        for launcher_name, attempts in by_launcher.items():
            backend = make_launcher(campaign, launcher_name, store.workspace)
            backend.cancel([Submitted(a.cell_id, a.attempt, a.job_id, a.job_info) for a in attempts])
            for a in attempts:
                store.set_state(name, a.cell_id, a.attempt, "cancelled", "cancelled by `mbx campaign cancel`")
        return len(active)
    finally:
        store.close()


def campaign_names(workspace: Path) -> list[str]:
    if not (Path(workspace) / "mbx.sqlite").exists():
        return []
    store = Store(workspace)
    try:
        return store.campaign_names()
    finally:
        store.close()
