"""The one campaign lifecycle: `prepare` a campaign into a Plan, then `execute` it (or `render` it: a dry run).

`prepare`: load → parity axes → expand → feasibility and headroom → cells → launcher → attempt numbers;
`execute`: lock → register → engine → regate → report → W&B. Every command that runs a campaign goes
through these two: `mbx campaign run|resume` (`regate` is execute's judging step alone), `mbx compare --run`
(its A B A B loop executes each side's cells, a round at a time), a search (each rung's points prepared and
executed), `mbx bisect` (each batch of versions). A dry run is `prepare` + `render`: it reads the store
read-only (store.read_only) and writes nothing anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.text import Text

from launchers.base import GpuNeed, Launcher, LaunchSpec
from orchestrator.errors import ConfigError, MbxError, UsageError, printable
from orchestrator.flow.extra_repeats import kept_repeats
from orchestrator.flow.runner import (
    Finished,
    check_baseline,
    console,
    err_console,
    make_launcher,
    record_parity,
    show,
    stored_record,
    write_report,
)
from orchestrator.judge.closing import print_closing, run_outcome
from orchestrator.judge.outcome import Outcome as Judged
from orchestrator.judge.outcome import campaign_outcome
from orchestrator.judge.views import campaign_view, cell_view
from orchestrator.run.baseline import baseline_summaries
from orchestrator.run.engine import Engine, Event, Outcome, adoptable
from orchestrator.run.feasibility import (
    Assessment,
    Card,
    check_points,
    gpu_needs,
    limits_of,
    summary_lines,
    with_gpu_memory,
)
from orchestrator.run.lock import CampaignLock
from orchestrator.run.plan_view import estimate_text
from orchestrator.run.progress import ProgressReporter, print_changes
from orchestrator.run.regate import Regated, regate
from orchestrator.run.store import (
    INGEST_LAUNCHER,
    AttemptRow,
    CellRow,
    Store,
    cell_rows,
    check_workspace,
    read_only,
)
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.sweep import Point


@dataclass
class Options:
    """How to prepare and execute a campaign (the command line's options)."""

    workspace: Path = Path("mbx-workspace")
    launcher: str | None = None  # None: the campaign's own (a resumed one: the launcher it was started with)
    parallel: int | None = None  # the local backend's `parallel`
    gpu: str | Card | None = None  # the GPU of the memory estimate and the headroom gate (else resources.gpu)
    strict: bool = False  # refuse the campaign when a point is infeasible, instead of skipping it
    max_cells: int | None = None
    repeats: int | None = None  # sweep.repeats overridden (`mbx compare --run --repeats`)
    make_report: bool = True
    log_wandb: bool = True
    resume_hint: bool = True  # the closing line may name `mbx campaign resume` (not for a search's or bisect's batch)


@dataclass
class Plan:
    """A campaign ready to run: its cells, its launcher and what a run would submit now (nothing written)."""

    workspace: Path
    campaign: Campaign
    source: Path | None
    launcher: Launcher
    cells: list[CellRow]  # the runnable cells, as they are registered
    options: Options
    points: list[Point] = field(default_factory=list)  # every expanded point (infeasible ones too)
    assessment: Assessment | None = None  # None: a stored campaign's cells (resume), not assessed again
    latest: dict[str, AttemptRow] = field(default_factory=dict)  # each cell's highest stored attempt
    specs: list[LaunchSpec] = field(default_factory=list)  # the cells not completed, numbered as a run would
    registered: bool = False  # in the store already (a resumed campaign, or executed once)
    gpu_needs: dict[str, GpuNeed] = field(default_factory=dict)  # point id → checked on the node (feasibility)
    notes: list[str] = field(default_factory=list)  # said when registered: extra repeats kept, cells set aside

    @property
    def attempts(self) -> dict[str, int]:
        """Cell id → the attempt number a run would give it now (cells not yet completed)."""
        return {spec.cell_id: spec.attempt for spec in self.specs}


def load(file: Path, options: Options) -> tuple[Campaign, list[Point]]:
    """A campaign file validated, its parity sides added as sweep factors, its points expanded."""
    from orchestrator.spec.loader import load_campaign
    from orchestrator.trainers import expand, with_parity_axes

    campaign = load_campaign(file)
    if options.repeats is not None:
        campaign = campaign.model_copy(update={"sweep": campaign.sweep.model_copy(update={"repeats": options.repeats})})
    campaign = with_parity_axes(campaign, file)
    return campaign, expand(campaign, file, options.max_cells, strict=options.strict)


def prepare(file: Path, options: Options) -> Plan:
    """A campaign file as a Plan: load, parity axes, expand, then `prepare_file`. Writes nothing."""
    campaign, points = load(file, options)
    return prepare_file(campaign, points, file, options)


def prepare_file(campaign: Campaign, points: list[Point], file: Path, options: Options) -> Plan:
    """`prepare_points` of a campaign file's points (`mbx campaign run`, `compare --run`), with the stored extra
    repeats of its points kept and the cells it sets aside named (orchestrator/flow/extra_repeats.py)."""
    plan = prepare_points(campaign, points, file, options)
    cells, plan.notes = kept_repeats(plan.workspace, campaign.name, plan.cells, campaign.sweep.repeats)
    if len(cells) > len(plan.cells):
        plan.cells = cells
        _numbered(plan)
    return plan


def prepare_points(campaign: Campaign, points: list[Point], source: Path | None, options: Options) -> Plan:
    """The Plan of these points of `campaign` (a file's, a search rung's, a bisect batch's): the headroom gate's
    GPU memory, each point's feasibility (infeasible points skipped; `strict` refuses), the cell rows, the
    launcher, and the specs a run would submit now, numbered from the store read read-only. Writes nothing."""
    workspace = Path(options.workspace).expanduser().resolve()
    campaign = with_gpu_memory(campaign, options.gpu)  # the headroom gate's GPU memory, stored with the campaign
    backend = make_launcher(campaign, options.launcher or campaign.launcher, workspace, options.parallel)
    file = str(source) if source else None
    assessment = check_points(points, options.gpu, options.strict, file, limits_of(campaign))
    cells = cell_rows(campaign, assessment.runnable)
    plan = Plan(workspace, campaign, source, backend, cells, options, points, assessment)
    plan.gpu_needs = gpu_needs(assessment.records())
    return _numbered(plan)


def prepare_stored(workspace: Path, name: str, options: Options) -> Plan:
    """The Plan of a campaign recorded in the store (`mbx campaign resume`, more repeats of `compare --run`):
    its stored spec and active cells, with the launcher it was started with (or `options.launcher`)."""
    workspace = check_workspace(workspace, create=False)  # no workspace or store: one line, nothing made
    with read_only(workspace) as store:
        if store is None:  # removed since the line above
            raise UsageError(f"no run store in workspace {workspace}")
        record = stored_record(store, name)
        if record["launcher"] == INGEST_LAUNCHER:
            raise UsageError(f"campaign {name!r} holds logs ingested with `mbx ingest`: there is nothing to resume")
        cells = store.cells(name)
        needs = gpu_needs(store.estimates(name))
    campaign = Campaign.model_validate(record["spec"])
    backend = make_launcher(campaign, options.launcher or record["launcher"], workspace, options.parallel)
    source = Path(record["source_file"]) if record.get("source_file") else None
    plan = Plan(workspace, campaign, source, backend, cells, options, registered=True, gpu_needs=needs)
    return _numbered(plan)


def _numbered(plan: Plan) -> Plan:
    """The plan with the specs a run would submit now: each cell not completed, numbered by the store's one
    rule (store.next_attempt_number) from the store read read-only; a value the launcher cannot put in a
    script or pass to a process (a NUL, a control character in a name) is refused here (exit 2)."""
    from launchers.safety import UnsafeValue

    with read_only(plan.workspace) as store:
        plan.latest = store.latest_attempts(plan.campaign.name) if store is not None else {}
    plan.specs = Engine(plan.campaign, plan.launcher, plan.workspace, gpu_needs=plan.gpu_needs).plan(plan.cells,
                                                                                                     plan.latest)
    try:
        plan.launcher.check_specs(plan.specs)
    except UnsafeValue as err:
        raise ConfigError([f"launchers.{plan.launcher.name}: {err}"]) from None
    return plan


def render(plan: Plan) -> Finished:
    """The dry run: print what a real run would submit now, rendered by the campaign's own launcher, and each
    point's memory estimate, headroom and feasibility. Nothing is written."""
    rendered = plan.launcher.render(plan.specs) if plan.specs else []
    outcome = Outcome(plan.campaign.name, total=len(plan.cells))
    outcome.skipped = len(plan.cells) - sum(len(item.specs) for item in rendered)
    console.print(Text.assemble((plan.campaign.name, "bold"), ": dry run with launcher ", (plan.launcher.name, "bold")))
    for item in rendered:
        print(item.describe(), flush=True)
    if plan.assessment is not None:
        print(estimate_text(plan.assessment), flush=True)
    for line in plan.notes:
        console.print(Text(printable(line)), soft_wrap=True)
    console.print(Text(f"dry run: nothing submitted ({outcome.total - outcome.skipped} attempt(s) rendered)"
                       f"{skipped_text(plan)}"), soft_wrap=True)  # fmt: skip
    return Finished(outcome)


def skipped_text(plan: Plan) -> str:
    """Why cells have no script in a dry run: completed, or running (a real run adopts them)."""
    states = [plan.latest[c.cell_id] for c in plan.cells if c.cell_id in plan.latest]
    done = sum(a.state == "completed" for a in states)
    running = sum(adoptable(a) for a in states)
    return (f"; {done} cell(s) already completed" if done else "") + (
        f"; {running} cell(s) running (a real run follows them)" if running else "")


def execute(plan: Plan, cells: list[CellRow] | None = None, on_event: Callable[[Event], None] | None = None,
            max_in_flight: int | None = None, closing: bool = True) -> Finished:  # fmt: skip
    """Run a plan: the campaign lock, its registration in the store (once: cells, estimates), the engine over
    `cells` (default: all the plan's cells), then every stored result judged again with the current gates and,
    with `closing`, the report, the parity pairs and the closing lines. A caller that runs the cells a few at a
    time (`mbx compare --run`) passes its own `on_event` (its progress display, its interrupt) and
    `closing=False`; `cells=[]` registers the plan and runs nothing."""
    workspace = plan.workspace
    if not plan.registered:
        workspace = check_workspace(workspace)  # a workspace of the wrong kind: one line, before the lock
        check_baseline(workspace, plan.campaign, plan.source)
    name = plan.campaign.name
    with CampaignLock(workspace / name), Store(workspace, create=not plan.registered) as store:  # refused before any write
        if not plan.registered:
            source = str(plan.source) if plan.source else None
            store.register_campaign(name, source, plan.campaign.model_dump(mode="json"), plan.launcher.name, plan.cells)
            if plan.assessment is not None:
                store.record_estimates(name, plan.assessment.records())
                for line in summary_lines(plan.assessment, limit=20):
                    console.print(Text(printable(line)), soft_wrap=True)
            for line in plan.notes:
                console.print(Text(printable(line), style="yellow"), soft_wrap=True)
            plan.registered = True
        run = plan.cells if cells is None else cells
        if on_event is not None:
            outcome = _engine(store, plan, on_event, max_in_flight).run(run)
            return _judged(store, plan, outcome, closing)
        return _drive(store, plan, run, closing)


def _engine(store: Store, plan: Plan, on_event: Callable[[Event], None], max_in_flight: int | None) -> Engine:
    """The engine over the plan's campaign, at most `max_in_flight` (else --parallel) attempts at once."""
    baseline = baseline_summaries(store, plan.campaign.baseline)
    max_in_flight = max_in_flight if max_in_flight is not None else plan.options.parallel
    return Engine(plan.campaign, plan.launcher, store.workspace, store, on_event, baseline, max_in_flight,
                  plan.gpu_needs)


def _drive(store: Store, plan: Plan, cells: list[CellRow], closing: bool) -> Finished:
    """The engine over `cells` with the terminal's progress display and W&B logging of each finished attempt."""
    campaign, backend = plan.campaign, plan.launcher
    console.print(Text.assemble((campaign.name, "bold"), f": {len(cells)} cell(s) with launcher ",
                                (backend.name, "bold"), f", workspace {store.workspace}"))  # fmt: skip
    logger = WandbLogger(store, campaign) if plan.options.log_wandb else None
    with ProgressReporter(len(cells), campaign.name) as progress:

        def on_event(event: Event) -> None:
            show(progress, event)
            if logger is not None and event.kind == "finished":
                logger.log(event.cell, event.attempt)

        try:
            outcome = _engine(store, plan, on_event, None).run(cells)
        except KeyboardInterrupt:
            progress.progress.stop()
            err_console.print(
                f"interrupted: attempts already started keep running; `mbx campaign resume {campaign.name}` "
                f"collects them and runs the rest, `mbx campaign cancel {campaign.name}` stops them"
            )
            raise SystemExit(130) from None
    if logger is not None:
        logger.report_warnings()
    return _judged(store, plan, outcome, closing)


def _judged(store: Store, plan: Plan, outcome: Outcome, closing: bool) -> Finished:
    """Every stored result judged again with the current gates (cells skipped as completed too); with
    `closing`: the changes printed, the parity pairs judged and stored, the report written, the outcome logged
    to W&B and the closing lines, all saying the one outcome (orchestrator/judge/outcome.py)."""
    campaign = plan.campaign
    regated = regate(store, campaign.name)
    points = regated.judged.points
    infeasible = regated.judged.infeasible
    if not closing:
        return Finished(outcome, points, judged=run_outcome(outcome, points, [], infeasible))
    print_changes(regated.changes, "re-judged with the current gates")
    regated.parity = record_parity(store, campaign)
    judged = run_outcome(outcome, points, regated.parity, infeasible)
    if plan.options.make_report:
        try:
            page = write_report(store.workspace, campaign_view(store, campaign.name), None, judged)
            console.print(Text(f"report: {page}"))
        except MbxError as err:  # every cell is stored: the verdicts below still stand
            err_console.print(Text(f"warning: {err}"), soft_wrap=True)
    if plan.options.log_wandb and campaign.wandb.mode != "disabled":
        log_outcome(store.workspace, campaign, judged)
    print_closing(outcome, points, regated.parity, plan.options.resume_hint, infeasible)
    return Finished(outcome, points, regated.parity, judged)


def log_outcome(workspace: Path, campaign: Campaign, judged: Judged) -> None:
    """The campaign's outcome as a W&B run of its group (reports/wandb_log.py); a failure is one warning."""
    from reports.wandb_log import log_outcome as log

    warnings: list[str] = []
    log(campaign.wandb, campaign.name, judged.to_dict(), workspace, on_warning=warnings.append)
    for warning in warnings:
        err_console.print(Text(f"warning: {warning}"))


def regate_campaign(workspace: Path, name: str, file: Path | None = None) -> Regated:
    """`mbx campaign regate`: execute's judging step alone, on a stored campaign: every stored result judged
    again with its gates, or with the gates of campaign file `file` (of the same name; with the headroom gate's
    GPU memory as prepare sets it; they are stored as the campaign's gates), and its parity pairs again from
    their run dirs. Holds the campaign lock."""
    gates = None
    if file is not None:
        from orchestrator.spec.loader import load_campaign

        loaded = load_campaign(file)
        if loaded.name != name:
            raise UsageError(f"name: the file defines campaign {loaded.name!r}, not {name!r}", file=str(file))
        gates = with_gpu_memory(loaded, None).gates  # headroom_gib_min: the GPU memory of resources.gpu
    workspace = check_workspace(workspace, create=False)
    with Store(workspace, create=False) as store:
        record = stored_record(store, name)  # before the lock: an unknown name makes no directory
        with CampaignLock(workspace / name):
            done = regate(store, name, gates)
            if record["spec"].get("parity"):  # the pairs judged again from their run dirs, and stored
                done.parity = record_parity(store, Campaign.model_validate(record["spec"]), quiet=True)
            done.trials = store.trials(name)  # a search: its outcome is its answer, as status says it
            return done


def regated_outcome(done: Regated) -> Judged:
    """The outcome `mbx campaign regate` closes with: orchestrator/judge/outcome.py's, as status says it."""
    verdicts = [p.verdict for p in done.judged.points]
    return campaign_outcome(verdicts, done.parity, infeasible=done.judged.infeasible, trials=done.trials)


def run_points(workspace: Path, campaign: Campaign, points: list[Point], file: Path | None, *,
               make_report: bool = True, dry_run: bool = False, **options: Any) -> Finished:  # fmt: skip
    """`prepare_points` then `execute` (or `render` for a dry run): a search's rung, a bisect's batch of
    versions, judged without a closing line of its own (the search or the bisect says the outcome once, at its
    end). `options`: Options' launcher, parallel, gpu, strict, log_wandb."""
    opts = Options(workspace, make_report=make_report, resume_hint=False, **options)
    plan = prepare_points(campaign, points, file, opts)
    return render(plan) if dry_run else execute(plan, closing=False)


class WandbLogger:
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
        config = {"campaign": self.campaign.name, "cell_id": cell.cell_id, "attempt": attempt, "params": cell.params,
                  "recipe": cell.recipe, "resources": cell.resources}  # fmt: skip
        try:
            log_attempt(self.campaign.wandb, self.campaign.name, view, config, self.store.workspace,
                        on_warning=self.warnings.append)  # fmt: skip
        except Exception as err:  # W&B must never break a campaign
            self.warnings.append(f"W&B logging of {cell.cell_id} failed: {err}")

    def report_warnings(self) -> None:
        for warning in dict.fromkeys(self.warnings):
            err_console.print(Text(f"warning: {warning}"))
