"""Glue between the CLI and the engine: the campaign lock, the store, the launcher, W&B, reports, exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from launchers.base import Launcher
from orchestrator.baseline import baseline_summaries
from orchestrator.campaign import Campaign
from orchestrator.collect import campaign_view, cell_view
from orchestrator.engine import Engine, Event, Outcome
from orchestrator.errors import ConfigError, UsageError
from orchestrator.lock import CampaignLock
from orchestrator.progress import ProgressReporter, print_outcome
from orchestrator.store import ACTIVE_STATES, STORE_FILE, CellRow, Store, manifest_path
from orchestrator.sweep import Point
from reports.views import CampaignView

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def cell_rows(campaign: Campaign, points: list[Point]) -> list[CellRow]:
    """The store rows of a campaign's expanded points, in order."""
    return [
        CellRow(campaign=campaign.name, cell_id=p.cell_id, point_id=p.point_id, repeat=p.repeat, ordinal=i,
                label=p.label, params=p.params, recipe=p.recipe, resources=p.resources, env=p.env, active=True,
                trainer_kind=p.trainer_kind)  # fmt: skip
        for i, p in enumerate(points)
    ]


def make_launcher(campaign: Campaign, name: str, workspace: Path, parallel: int | None = None) -> Launcher:
    """Backend `name` with the campaign's `launchers.<name>` settings and its Slurm profile (built once).

    `parallel` (the CLI's --parallel) sets the local backend's `parallel`; the engine caps any backend with it.
    """
    from pydantic import ValidationError

    from launchers import registry
    from launchers.profile import SlurmProfile
    from orchestrator.fingerprint import project_git_sha
    from orchestrator.loader import validation_problems

    try:
        backend = registry.get(name)
    except KeyError as err:
        raise UsageError(str(err.args[0])) from None
    model = registry.settings_model(name)
    raw = dict(campaign.launchers.get(name, campaign.launchers.get(name.replace("-", "_"), {})))
    if parallel is not None and "parallel" in model.model_fields:
        raw["parallel"] = parallel
    try:
        settings = model.model_validate(raw)
    except ValidationError as err:
        raise ConfigError([f"launchers.{name}.{line}" for line in validation_problems(err)]) from None
    profile = SlurmProfile(cluster=campaign.cluster, container=campaign.container, git_sha=project_git_sha())
    try:
        return backend(settings, workspace, profile)
    except (ValueError, RuntimeError) as err:  # e.g. a newline in cluster.partition, NeMo-Run not installed
        raise ConfigError([f"launchers.{name}: {err}"]) from None


def run_campaign(
    workspace: Path,
    campaign: Campaign,
    points: list[Point],
    source_file: Path | None,
    launcher: str | None = None,
    parallel: int | None = None,
    make_report: bool = True,
    log_wandb: bool = True,
    dry_run: bool = False,
) -> Outcome:
    """Register a campaign's cells in the store and drive them to completion (a dry run records nothing)."""
    workspace = Path(workspace).expanduser().resolve()
    launcher_name = launcher or campaign.launcher
    backend = make_launcher(campaign, launcher_name, workspace, parallel)  # before any state is written
    cells = cell_rows(campaign, points)
    if dry_run:
        return _dry_run(workspace, campaign, backend, cells)
    with CampaignLock(workspace / campaign.name), Store(workspace) as store:  # refused before any write
        source = str(source_file) if source_file else None
        store.register_campaign(campaign.name, source, campaign.model_dump(mode="json"), launcher_name, cells)
        return _drive(store, campaign, backend, cells, make_report, log_wandb, parallel)


def _dry_run(workspace: Path, campaign: Campaign, backend: Launcher, cells: list[CellRow]) -> Outcome:
    """Print what a real run would submit now, rendered by the campaign's own launcher; write nothing."""
    latest = {}
    if (workspace / STORE_FILE).exists():
        with Store(workspace) as store:
            latest = store.latest_attempts(campaign.name)
    rendered = Engine(campaign, backend, workspace).render(cells, latest)
    outcome = Outcome(campaign.name, total=len(cells))
    outcome.skipped = len(cells) - sum(len(item.specs) for item in rendered)
    console.print(f"[bold]{campaign.name}[/]: dry run with launcher [bold]{backend.name}[/]")
    for item in rendered:
        print(item.describe(), flush=True)
    skipped = f"; {outcome.skipped} cell(s) already completed" if outcome.skipped else ""
    console.print(f"dry run: nothing submitted ({outcome.total - outcome.skipped} attempt(s) rendered){skipped}")
    return outcome


def resume_campaign(
    workspace: Path, name: str, parallel: int | None = None, make_report: bool = True, log_wandb: bool = True
) -> Outcome:
    """Continue a campaign recorded in the store, with the launcher it was started with."""
    workspace = Path(workspace).expanduser().resolve()
    with CampaignLock(workspace / name), Store(workspace) as store:
        record = _record(store, name)
        if record["launcher"] == "ingest":
            raise UsageError(
                f"campaign {name!r} holds logs ingested with `mbx ingest`: there is nothing to resume"
            )
        campaign = Campaign.model_validate(record["spec"])
        backend = make_launcher(campaign, record["launcher"], store.workspace, parallel)
        return _drive(store, campaign, backend, store.cells(name), make_report, log_wandb, parallel)


def _record(store: Store, name: str) -> dict[str, Any]:
    record = store.campaign(name)
    if record is None:
        known = ", ".join(store.campaign_names()) or "none yet"
        hint = ""
        if manifest_path(store.workspace, name).exists():
            hint = f"; its run directories are there: `mbx store rebuild --workspace {store.workspace}` restores it"
        raise UsageError(f"no campaign named {name!r} in workspace {store.workspace} (known: {known}){hint}")
    return record


def _drive(
    store: Store,
    campaign: Campaign,
    backend: Launcher,
    cells: list[CellRow],
    make_report: bool,
    log_wandb: bool,
    parallel: int | None = None,
) -> Outcome:
    console.print(
        f"[bold]{campaign.name}[/]: {len(cells)} cell(s) with launcher [bold]{backend.name}[/], workspace {store.workspace}"
    )
    logger = _WandbLogger(store, campaign) if log_wandb else None
    with ProgressReporter(len(cells), campaign.name) as progress:

        def on_event(event: Event) -> None:
            progress(event)
            if logger is not None and event.kind == "finished":
                logger.log(event.cell, event.attempt)

        engine = Engine(campaign, backend, store.workspace, store, on_event, baseline_summaries(store, campaign.baseline))
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
    print_outcome(outcome)
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


def exit_code(outcome: Outcome) -> int:
    return 0 if outcome.ok else 1


def view(workspace: Path, name: str, with_rows: bool = True) -> CampaignView:
    with Store(workspace) as store:
        _record(store, name)
        return campaign_view(store, name, with_rows=with_rows)


def write_report(workspace: Path, campaign: CampaignView, out: Path | None) -> Path:
    """Write the HTML report (and its Markdown twin, summary.md) and return the page's path."""
    from reports.markdown import markdown_summary
    from reports.page import write_report as write_page

    out_dir = Path(out) if out else Path(workspace) / campaign.name / "report"
    page = write_page(campaign, out_dir)
    (out_dir / "summary.md").write_text(markdown_summary(campaign))
    return page


def cancel_campaign(workspace: Path, name: str) -> int:
    """Cancel the active attempts of a campaign through the launcher that started them."""
    from launchers.base import Submitted

    with Store(workspace) as store:
        record = _record(store, name)
        campaign = Campaign.model_validate(record["spec"])
        if record["launcher"] == "ingest":
            return 0
        active = [a for a in store.attempts(name) if a.state in ACTIVE_STATES and a.job_id]
        by_launcher: dict[str, list[Any]] = {}
        for attempt in active:
            by_launcher.setdefault(attempt.launcher, []).append(attempt)
        for launcher_name, attempts in by_launcher.items():
            backend = make_launcher(campaign, launcher_name, store.workspace)
            backend.cancel([Submitted(a.cell_id, a.attempt, a.job_id, a.job_info) for a in attempts])
            for a in attempts:
                store.set_state(name, a.cell_id, a.attempt, "cancelled", "cancelled by `mbx campaign cancel`")
        return len(active)


def campaign_names(workspace: Path) -> list[str]:
    if not (Path(workspace) / STORE_FILE).exists():
        return []
    with Store(workspace) as store:
        return store.campaign_names()
