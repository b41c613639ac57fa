"""The one campaign lifecycle: `prepare` a campaign into a Plan, then `execute` it (or `render` it: a dry run).

`prepare`: load → parity axes → expand → feasibility and headroom → cells → launcher → attempt numbers;
`execute`: lock → register → engine → regate → report → W&B. Every command that runs a campaign goes
through these two: `mbx campaign run|resume` (`regate` is execute's judging step alone; `mbx campaign plan`
shows what `prepare` found), `mbx compare --run` (its A B A B loop executes each side's cells, a round at a
time), a search (its Plan's rungs are plans of their points, prepared and executed in turn, under the
search's lock; the search registers, reports and closes once, in `execute`), `mbx bisect` (each batch of
versions). A dry run is `prepare` + `render`: it reads the store read-only (store.read_only) and writes
nothing anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text

from launchers.base import GpuNeed, Launcher, LaunchSpec
from orchestrator.errors import ConfigError, MbxError, UsageError, printable
from orchestrator.flow.extra_repeats import kept_repeats
from orchestrator.flow.options import Options
from orchestrator.flow.runner import (
    Finished,
    check_baseline,
    console,
    err_console,
    make_launcher,
    record_verdicts,
    show,
    stored_record,
    write_report,
)
from orchestrator.judge import verdict_kinds
from orchestrator.judge.closing import closing_text, print_closing, run_outcome
from orchestrator.judge.outcome import Outcome as Judged
from orchestrator.judge.outcome import campaign_outcome
from orchestrator.judge.views import campaign_view, cell_view
from orchestrator.run.baseline import baseline_summaries
from orchestrator.run.disk import DiskFull, nearly_full
from orchestrator.run.engine import Engine, Event, Outcome, adoptable
from orchestrator.run.feasibility import (
    Assessment,
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

if TYPE_CHECKING:
    from orchestrator.flow.search_run import Searching

__all__ = ["Options", "Plan", "execute", "prepare", "prepare_points", "prepare_stored", "render"]


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
    stored: bool = False  # the campaign as the store holds it (resume, more repeats): no baseline check
    registered: bool = False  # registered by `execute` already (a plan executed a few cells at a time)
    stored_cells: frozenset[str] = frozenset()  # a stored plan: the cell ids the store holds (same: no register)
    gpu_needs: dict[str, GpuNeed] = field(default_factory=dict)  # point id → checked on the node (feasibility)
    notes: list[str] = field(default_factory=list)  # said when registered: extra repeats kept, cells set aside
    searched: Campaign | None = None  # a search: the campaign as loaded (its rungs are expanded from it)
    trials: list[dict[str, Any]] = field(default_factory=list)  # a search: its stored trial rows

    @property
    def attempts(self) -> dict[str, int]:
        """Cell id → the attempt number a run would give it now (cells not yet completed)."""
        return {spec.cell_id: spec.attempt for spec in self.specs}

    @cached_property
    def search(self) -> Searching | None:
        """A search's part of its plan (orchestrator/flow/search_run.py: its candidates, the points its estimate
        rules out recorded, the trials an earlier run found infeasible or failed read back), made on first use
        (its modules load numpy, which `mbx campaign plan` does not need); None without `sweep.search`."""
        if self.searched is None or self.assessment is None:
            return None
        from orchestrator.flow.search_run import prepare_search

        return prepare_search(self.searched, self.points, self.source, self.options, self.assessment, self.trials)


def load(file: Path, options: Options) -> tuple[Campaign, list[Point]]:
    """A campaign file validated, its parity sides added as sweep factors, its points expanded."""
    from orchestrator.spec.loader import load_campaign
    from orchestrator.trainers import expand, with_parity_axes, with_steps_key

    campaign = with_steps_key(load_campaign(file))  # a search's steps key: its trainer kind's unless set
    if options.repeats is not None:
        campaign = campaign.model_copy(update={"sweep": campaign.sweep.model_copy(update={"repeats": options.repeats})})
    campaign = with_parity_axes(campaign, file)
    return campaign, expand(campaign, file, options.max_cells, strict=options.strict)


def prepare(file: Path, options: Options) -> Plan:
    """A campaign file as a Plan: load, parity axes, expand, then `prepare_loaded`. Writes nothing."""
    campaign, points = load(file, options)
    return prepare_loaded(campaign, points, file, options)


def prepare_loaded(campaign: Campaign, points: list[Point], file: Path | None, options: Options) -> Plan:
    """The Plan of a loaded campaign file (`mbx campaign run`, its dry run and `mbx campaign plan`: the same
    estimates, the same numbering): a search's (`prepare_search`) or every point's (`prepare_file`)."""
    if campaign.sweep.search is not None:
        return prepare_search(campaign, points, file, options)
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
    return _numbered(_assessed(campaign, points, source, options))


def _assessed(campaign: Campaign, points: list[Point], source: Path | None, options: Options) -> Plan:
    """prepare_points before numbering: the GPU memory, the feasibility, the cells, the launcher."""
    workspace = Path(options.workspace).expanduser().resolve()
    options = replace(options, workspace=workspace)
    campaign = with_gpu_memory(campaign, options.gpu)  # the headroom gate's GPU memory, stored with the campaign
    backend = make_launcher(campaign, options.launcher or campaign.launcher, workspace, options.parallel)
    file = str(source) if source else None
    assessment = check_points(points, options.gpu, options.strict, file, limits_of(campaign))
    cells = cell_rows(campaign, assessment.runnable)
    plan = Plan(workspace, campaign, source, backend, cells, options, points, assessment)
    plan.gpu_needs = gpu_needs(assessment.records())
    return plan


def prepare_search(campaign: Campaign, points: list[Point], source: Path | None, options: Options) -> Plan:
    """The Plan of a search (`sweep.search`): every point assessed as `prepare_points` does (what `mbx campaign
    plan` shows), no cells of its own (each rung is a plan of the points the search picks, prepared when the
    rung runs), its stored trial rows read read-only; a steps key that cannot set a shorter trial's length is
    refused here (flow/search_length.py), before anything is written. Writes nothing."""
    from orchestrator.flow.search_length import check_steps_key

    check_steps_key(campaign, points, source)
    plan = _assessed(campaign, points, source, options)
    plan.cells, plan.searched = [], campaign
    with read_only(plan.workspace) as store:
        plan.trials = store.trials(campaign.name) if store is not None else []
    return plan


def prepare_stored(workspace: Path, name: str, options: Options) -> Plan:
    """The Plan of a campaign recorded in the store, to go on with (`mbx campaign resume`): its stored spec and
    active cells, with the launcher it was started with (or `options.launcher`); a search's Plan for a search
    (its finished trials read back, not rerun)."""
    plan = prepare_stored_cells(workspace, name, options)
    if plan.campaign.sweep.search is None:
        return plan
    from orchestrator.trainers import expand

    campaign, source = plan.campaign, plan.source
    file = source if source is not None and source.exists() else None  # a recipe_file is relative to it
    searched = prepare_search(campaign, expand(campaign, file, None, strict=False), file, plan.options)
    searched.stored = True
    return searched


def prepare_stored_cells(workspace: Path, name: str, options: Options) -> Plan:
    """The Plan of a campaign's stored active cells (a search's too: more repeats of `compare --run`), with
    the launcher it was started with (or `options.launcher`)."""
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
    source = Path(record["source_file"]) if record.get("source_file") else None
    options = replace(options, workspace=workspace, launcher=options.launcher or record["launcher"])
    backend = make_launcher(campaign, options.launcher, workspace, options.parallel)
    plan = Plan(workspace, campaign, source, backend, cells, options, stored=True, gpu_needs=needs,
                stored_cells=frozenset(c.cell_id for c in cells))  # fmt: skip
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
    point's memory estimate, headroom and feasibility (a search: its first rung). Nothing is written."""
    if plan.search is not None:
        return _render_search(plan)
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
    `closing=False`; `cells=[]` registers the plan and runs nothing. A search's plan runs its rungs
    (`_execute_search`)."""
    if plan.search is not None:
        return _execute_search(plan)
    workspace = plan.workspace
    if plan.stored and {c.cell_id for c in plan.cells} == plan.stored_cells:
        plan.registered = True  # a resume of the cells the store holds: nothing to write before the engine
    if not plan.registered:
        workspace = check_workspace(workspace, create=not plan.stored)  # one line, before the lock
        if not plan.stored:
            check_baseline(workspace, plan.campaign, plan.source)
    name = plan.campaign.name
    with CampaignLock(workspace / name), Store(workspace, create=not plan.stored) as store:  # refused before any write
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
    `closing`: the changes printed, the verdict kinds judged and stored (parity pairs), the report written, the outcome logged
    to W&B and the closing lines, all saying the one outcome (orchestrator/judge/outcome.py)."""
    campaign = plan.campaign
    regated = regate(store, campaign.name)
    points = regated.judged.points
    infeasible = regated.judged.infeasible
    if not closing:
        return Finished(outcome, points, judged=run_outcome(outcome, points, {}, infeasible))
    print_changes(regated.changes, "re-judged with the current gates")
    regated.verdicts = record_verdicts(store, campaign)
    judged = run_outcome(outcome, points, regated.verdicts, infeasible)
    unwritten = _publish(store, campaign, judged, plan.options)
    print_closing(outcome, points, regated.verdicts, plan.options.resume_hint, infeasible,
                  plan.options.inconclusive_ok)  # fmt: skip
    say_unwritten(unwritten)
    return Finished(outcome, points, regated.verdicts, judged)


def _publish(store: Store, campaign: Campaign, judged: Judged, options: Options, report: bool = True
             ) -> dict[str, Path]:  # fmt: skip
    """The outcome said beyond the terminal, under the campaign lock: the report (with `options.make_report` and
    `report`) and the W&B outcome run (with `options.log_wandb`; its exit code the command's, as
    `options.inconclusive_ok` makes it). Returns what a full disk kept from being written, and where
    (`say_unwritten` says it in one line after the closing)."""
    unwritten: dict[str, Path] = {}
    if options.make_report and report:
        try:
            page = write_report(store.workspace, campaign_view(store, campaign.name), None, judged)
            console.print(Text(f"report: {page}"))
        except DiskFull as err:
            unwritten[f"the report (`mbx report {campaign.name}` writes it)"] = err.path
        except MbxError as err:  # every cell is stored: the verdicts below still stand
            err_console.print(Text(f"warning: {err}"), soft_wrap=True)
    if options.log_wandb and campaign.wandb.mode != "disabled":
        if not log_outcome(store.workspace, campaign, judged, options.inconclusive_ok, quiet_when_full=True):
            unwritten["the W&B outcome run"] = Path(campaign.wandb.dir or store.workspace) / "wandb"
    return unwritten


def say_unwritten(unwritten: dict[str, Path]) -> None:
    """Every result is stored and the verdicts printed stand; outputs a full disk kept out: one line, exit 1."""
    if unwritten:
        were = "were" if len(unwritten) > 1 else "was"
        raise DiskFull(next(iter(unwritten.values())), f"{' and '.join(unwritten)} {were} not written (every "
                       "result is stored)")  # fmt: skip


def _rung_options(plan: Plan) -> Options:
    """How a search's rung runs: as its search, without a report or a closing line of its own."""
    return replace(plan.options, workspace=plan.workspace, make_report=False, resume_hint=False)


def _execute_search(plan: Plan) -> Finished:
    """A search's plan executed under its campaign lock, from the first rung to the closing line: each rung's
    points a plan prepared and executed in turn (registered, run and judged, no closing line of its own), the
    trial rows stored as they are decided; then every cell the search ran registered as the campaign's active
    cells (status, report, freeze), judged again, and the report, the W&B outcome and the closing lines, all
    saying the search's outcome (orchestrator/judge/outcome.py)."""
    from orchestrator.flow.search_run import outcome_lines, run_search

    searching, name = plan.search, plan.campaign.name
    assert searching is not None
    plan.workspace = workspace = check_workspace(plan.workspace, create=not plan.stored)
    if not plan.stored:
        check_baseline(workspace, plan.campaign, plan.source)

    def rung(campaign: Campaign, points: list[Point]) -> Finished:
        return execute(prepare_points(campaign, points, plan.source, _rung_options(plan)), closing=False)

    def save(rows: list[dict[str, Any]]) -> None:
        with Store(workspace) as store:
            store.record_trials(name, rows, replace=True)

    with CampaignLock(workspace / name):
        found = run_search(searching, rung, save)
        judged, ran = found.outcome(), searching.ran
        with Store(workspace) as store:
            if ran:
                spec = plan.campaign.model_dump(mode="json")
                source = str(plan.source) if plan.source else None
                store.register_campaign(name, source, spec, plan.launcher.name, cell_rows(plan.campaign, ran))
            points = regate(store, name).judged.points if store.campaign(name) else []
            unwritten = _publish(store, plan.campaign, judged, plan.options, report=bool(ran))
        for line in outcome_lines(found):
            console.print(Text(printable(line)), soft_wrap=True)
        console.print(closing_text(judged, plan.options.inconclusive_ok), soft_wrap=True)
    say_unwritten(unwritten)
    return Finished(Outcome(name, total=len(ran)), points, judged=judged, search=found)


def _render_search(plan: Plan) -> Finished:
    """A search's dry run: its first rung rendered as the lifecycle's dry run renders a plan. Nothing written."""
    from orchestrator.flow.search_run import run_search

    def rung(campaign: Campaign, points: list[Point]) -> Finished:
        return render(prepare_points(campaign, points, plan.source, _rung_options(plan)))

    assert plan.search is not None
    found = run_search(plan.search, rung, lambda rows: None, dry_run=True)
    return Finished(Outcome(plan.campaign.name, total=0), search=found)


def log_outcome(workspace: Path, campaign: Campaign, judged: Judged, inconclusive_ok: bool = False,
                quiet_when_full: bool = False) -> bool:  # fmt: skip
    """The campaign's outcome as a W&B run of its group (reports/wandb_log.py): its statement (no exit hint: a
    W&B run outlives the command) and the exit code of the command that logs it (`inconclusive_ok`: given
    --inconclusive-ok); a failure is one warning. With `quiet_when_full`, a failure on a full disk is no warning
    but False: the caller says so in its one line."""
    from reports.wandb_log import log_outcome as log

    warnings: list[str] = []
    outcome = judged.to_dict(inconclusive_ok, exit_hint=False)
    log(campaign.wandb, campaign.name, outcome, workspace, on_warning=warnings.append)
    if warnings and quiet_when_full and nearly_full(Path(campaign.wandb.dir or workspace)):
        return False
    for warning in warnings:
        err_console.print(Text(f"warning: {warning}"))
    return True


def regate_campaign(
    workspace: Path, name: str, file: Path | None = None, options: Options | None = None
) -> Regated:
    """`mbx campaign regate`: execute's judging step alone, on a stored campaign: every stored result judged
    again with its gates, or with the gates of campaign file `file` (of the same name; with the headroom gate's
    GPU memory as prepare sets it; they are stored as the campaign's gates), its verdict kinds (parity pairs)
    again from their run dirs and a search's answer again (orchestrator/judge/search_answer.py); then the outcome
    written as run writes it (`options`: the report unless make_report is off, the W&B outcome unless log_wandb
    is off; what a full disk kept out is in `unwritten`, for `say_unwritten` after the closing line). Holds the
    campaign lock."""
    from orchestrator.judge.search_answer import search_answer

    options = options or Options(workspace)
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
            if verdict_kinds.asked_in_spec(record["spec"]):  # judged again from their run dirs, and stored
                done.verdicts = record_verdicts(store, Campaign.model_validate(record["spec"]), quiet=True)
            done.trials = store.trials(name)  # a search: its outcome is its answer, judged again
            done.searched = search_answer(workspace, name, done.trials)
            done.outcome = regated_outcome(done)
            campaign = Campaign.model_validate(store.campaign(name)["spec"])  # its gates as now stored
            done.unwritten = _publish(store, campaign, done.outcome, options)
            return done


def regated_outcome(done: Regated) -> Judged:
    """The outcome `mbx campaign regate` closes with: orchestrator/judge/outcome.py's, as status says it."""
    verdicts = [p.verdict for p in done.judged.points]
    return campaign_outcome(verdicts, done.verdicts, infeasible=done.judged.infeasible, searched=done.searched)


def run_points(campaign: Campaign, points: list[Point], file: Path | None, options: Options) -> Finished:
    """`prepare_points` then `execute`: a bisect's batch of versions, judged without a closing line of its own
    (the bisect says the outcome once, at its end)."""
    plan = prepare_points(campaign, points, file, replace(options, resume_hint=False))
    return execute(plan, closing=False)


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
