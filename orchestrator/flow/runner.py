"""Glue between the CLI and the engine: the campaign lock, the store, the launcher, W&B, reports, exit codes."""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from launchers.base import Launcher
from orchestrator.errors import ConfigError, MbxError, RunError, UsageError, printable
from orchestrator.judge.closing import print_closing
from orchestrator.judge.views import campaign_view, cell_view, parity_verdicts
from orchestrator.run.baseline import baseline_summaries
from orchestrator.run.engine import Engine, Event, Outcome
from orchestrator.run.feasibility import Assessment, check_points, limits_of, summary_lines, with_gpu_memory
from orchestrator.run.lock import CampaignLock
from orchestrator.run.plan_view import estimate_text
from orchestrator.run.progress import ProgressReporter, print_changes
from orchestrator.run.regate import PointVerdict, Regated, regate
from orchestrator.run.store import (
    ACTIVE_STATES,
    STORE_FILE,
    CellRow,
    Store,
    cell_rows,
    check_workspace,
    manifest_path,
)
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.sweep import Point
from reports.views import CampaignView

# markup and emoji off: campaign names, labels, paths and reasons are user text, printed as they are
console = Console(highlight=False, markup=False, emoji=False)
err_console = Console(stderr=True, highlight=False, markup=False, emoji=False)

EXIT_PASS, EXIT_FAIL, EXIT_INCONCLUSIVE = 0, 1, 3


@dataclass
class Finished:
    """How a run ended: the engine's outcome and every point's verdict from all its repeats (None: a dry run)."""

    outcome: Outcome
    points: list[PointVerdict] | None = None
    # on/off pair verdicts (orchestrator/judge/parity_verdicts.py)
    parity: list[dict[str, Any]] = field(default_factory=list)


def make_launcher(campaign: Campaign, name: str, workspace: Path, parallel: int | None = None) -> Launcher:
    """Backend `name` with the campaign's `launchers.<name>` settings and its Slurm profile (built once).

    `parallel` (the CLI's --parallel) sets the local backend's `parallel`; the engine caps any backend with it.
    """
    from pydantic import ValidationError

    from launchers import registry
    from launchers.profile import SlurmProfile
    from orchestrator.run.fingerprint import project_git_sha
    from orchestrator.spec.loader import validation_problems

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
    gpu: str | None = None,
    strict: bool = False,
) -> Finished:
    """Register a campaign's cells in the store and drive them to completion (a dry run records nothing).

    Feasibility first (orchestrator/run/feasibility.py): points with layout problems (`Point.infeasible`) or whose
    memory estimate exceeds `gpu` (else each point's resources.gpu) are recorded in the store's `estimates`
    table and skipped; `strict` refuses the campaign instead (exit 2, nothing written)."""
    workspace = Path(workspace).expanduser().resolve()
    launcher_name = launcher or campaign.launcher
    campaign = with_gpu_memory(campaign, gpu)  # the headroom gate's GPU memory, stored with the campaign
    backend = make_launcher(campaign, launcher_name, workspace, parallel)  # before any state is written
    assessment = check_points(points, gpu, strict, str(source_file) if source_file else None, limits_of(campaign))
    cells = cell_rows(campaign, assessment.runnable)
    check_plan(campaign, backend, workspace, cells)
    if dry_run:
        return Finished(_dry_run(workspace, campaign, backend, cells, assessment))
    workspace = check_workspace(workspace)  # a workspace of the wrong kind: one line, before the lock
    check_baseline(workspace, campaign, source_file)
    with CampaignLock(workspace / campaign.name), Store(workspace) as store:  # refused before any write
        source = str(source_file) if source_file else None
        store.register_campaign(campaign.name, source, campaign.model_dump(mode="json"), launcher_name, cells)
        store.record_estimates(campaign.name, assessment.records())
        for line in summary_lines(assessment, limit=20):
            console.print(Text(printable(line)), soft_wrap=True)
        return _drive(store, campaign, backend, cells, make_report, log_wandb, parallel)


def check_baseline(workspace: Path, campaign: Campaign, source_file: Path | None) -> None:
    """Refuse (exit 2), before anything is written, a baseline campaign that is not in the workspace's store:
    its relative gates could never be checked."""
    if not campaign.baseline:
        return
    workspace = Path(workspace).expanduser().resolve()
    known: list[str] = []
    if (workspace / STORE_FILE).exists():
        with Store(workspace, create=False) as store:
            known = store.campaign_names()
    if campaign.baseline not in known:
        listed = ", ".join(repr(n) for n in known) or "none yet"
        raise ConfigError([f"baseline: no campaign named {campaign.baseline!r} in workspace {workspace} "
                           f"(known: {listed})"], file=str(source_file) if source_file else campaign.name)  # fmt: skip


def check_plan(campaign: Campaign, backend: Launcher, workspace: Path, cells: list[CellRow]) -> None:
    """Refuse (exit 2), before anything is recorded, a value the launcher cannot put in a script or pass to a
    process (a NUL in an environment value or argument, a control character in a name)."""
    from launchers.safety import UnsafeValue

    try:
        backend.check_specs(Engine(campaign, backend, workspace).plan(cells, {}))
    except UnsafeValue as err:
        raise ConfigError([f"launchers.{backend.name}: {err}"]) from None


def _dry_run(
    workspace: Path, campaign: Campaign, backend: Launcher, cells: list[CellRow], assessment: Assessment | None = None
) -> Outcome:
    """Print what a real run would submit now, rendered by the campaign's own launcher, and each point's
    memory estimate, headroom and feasibility; write nothing."""
    latest = {}
    if (workspace / STORE_FILE).exists():
        with Store(workspace) as store:
            latest = store.latest_attempts(campaign.name)
    rendered = Engine(campaign, backend, workspace).render(cells, latest)
    outcome = Outcome(campaign.name, total=len(cells))
    outcome.skipped = len(cells) - sum(len(item.specs) for item in rendered)
    console.print(Text.assemble((campaign.name, "bold"), ": dry run with launcher ", (backend.name, "bold")))
    for item in rendered:
        print(item.describe(), flush=True)
    if assessment is not None:
        print(estimate_text(assessment), flush=True)
    skipped = f"; {outcome.skipped} cell(s) already completed" if outcome.skipped else ""
    console.print(Text(f"dry run: nothing submitted ({outcome.total - outcome.skipped} attempt(s) rendered){skipped}"))
    return outcome


def resume_campaign(
    workspace: Path, name: str, parallel: int | None = None, make_report: bool = True, log_wandb: bool = True
) -> Finished:
    """Continue a campaign recorded in the store, with the launcher it was started with."""
    workspace = check_workspace(workspace, create=False)  # nothing is made for a workspace that is not there
    with CampaignLock(workspace / name), Store(workspace, create=False) as store:
        record = _record(store, name)
        if record["launcher"] == "ingest":
            raise UsageError(
                f"campaign {name!r} holds logs ingested with `mbx ingest`: there is nothing to resume"
            )
        campaign = Campaign.model_validate(record["spec"])
        backend = make_launcher(campaign, record["launcher"], store.workspace, parallel)
        cells = store.cells(name)
        check_plan(campaign, backend, store.workspace, cells)
        return _drive(store, campaign, backend, cells, make_report, log_wandb, parallel)


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
) -> Finished:
    console.print(Text.assemble((campaign.name, "bold"), f": {len(cells)} cell(s) with launcher ",
                                (backend.name, "bold"), f", workspace {store.workspace}"))  # fmt: skip
    logger = _WandbLogger(store, campaign) if log_wandb else None
    with ProgressReporter(len(cells), campaign.name) as progress:

        def on_event(event: Event) -> None:
            show(progress, event)
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
    regated = regate(store, campaign.name)  # cells skipped as completed: judged again with the current gates
    print_changes(regated.changes, "re-judged with the current gates")
    if make_report:
        try:
            page = write_report(store.workspace, campaign_view(store, campaign.name), None)
            console.print(Text(f"report: {page}"))
        except MbxError as err:  # every cell is stored: the verdicts below still stand
            err_console.print(Text(f"warning: {err}"), soft_wrap=True)
    pairs = record_parity(store, campaign)
    print_closing(outcome, regated.judged.points, pairs)
    return Finished(outcome, regated.judged.points, pairs)


def record_parity(store: Store, campaign: Campaign, quiet: bool = False) -> list[dict[str, Any]]:
    """Judge the campaign's parity pairs from their run dirs, store them (the `parity` table) and print one
    line per pair (unless `quiet`)."""
    if campaign.parity is None:
        return []
    pairs = [v.to_dict() for v in parity_verdicts(store, campaign.name, campaign)]
    store.record_parity(campaign.name, pairs)
    if not quiet:
        for pair in pairs:
            style = {"pass": "green", "fail": "bold red"}.get(pair["verdict"], "yellow")
            console.print(Text.assemble("parity ", (pair["verdict"].upper(), style),
                                        f" {pair['title']} [{pair['label']}, repeat {pair['repeat']}]: {pair['reason']}"),
                          soft_wrap=True)  # fmt: skip
    return pairs


def show(progress: ProgressReporter, event: Event) -> None:
    """Show an event; a display problem is one line, never a stop (the engine records the attempt either way)."""
    try:
        progress(event)
    except Exception as err:  # noqa: BLE001 - the terminal is not worth an attempt left `running`
        err_console.print(Text(f"warning: could not show {event.kind} of {event.cell.cell_id}: {err!r}"))


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
            err_console.print(Text(f"warning: {warning}"))


def exit_code(finished: Finished, inconclusive_ok: bool = False) -> int:
    """0 pass, 1 fail (a cell that did not complete, or a point that failed a gate), 3 inconclusive (nothing
    failed, some point undecided); `inconclusive_ok` makes 3 into 0. A dry run judges nothing: 0."""
    if finished.points is None:
        return EXIT_PASS
    code = verdicts_exit_code(finished.points, inconclusive_ok, failed=bool(finished.outcome.failed))
    return parity_exit_code(finished.parity, code, inconclusive_ok)


def parity_exit_code(pairs: list[dict[str, Any]], code: int, inconclusive_ok: bool = False) -> int:
    """`code` made worse by the parity pairs: a failed pair fails (1), an undecided one is inconclusive (3)."""
    verdicts = {p["verdict"] for p in pairs}
    if code == EXIT_FAIL or "fail" in verdicts:
        return EXIT_FAIL
    if verdicts - {"pass"} and not inconclusive_ok:
        return EXIT_INCONCLUSIVE
    return code


def verdicts_exit_code(points: list[PointVerdict], inconclusive_ok: bool = False, failed: bool = False) -> int:
    verdicts = {p.verdict for p in points}
    if failed or "fail" in verdicts:
        return EXIT_FAIL
    if verdicts - {"pass"} and not inconclusive_ok:
        return EXIT_INCONCLUSIVE
    return EXIT_PASS


def view(workspace: Path, name: str, with_rows: bool = True) -> CampaignView:
    """The campaign as the report and status show it, its stored verdicts first re-derived with its gates."""
    with Store(workspace, create=False) as store:
        _record(store, name)
        regate(store, name)
        campaign = campaign_view(store, name, with_rows=with_rows)
        if campaign.parity:
            store.record_parity(name, campaign.parity)  # `mbx report`: the parity verdicts stored again
        return campaign


def regate_campaign(workspace: Path, name: str, file: Path | None = None) -> Regated:
    """`mbx campaign regate`: re-judge every stored result of a campaign with its gates, or with the gates of
    campaign file `file` (of the same name; they are stored as the campaign's gates). Holds the campaign lock."""
    gates = None
    if file is not None:
        from orchestrator.spec.loader import load_campaign

        loaded = load_campaign(file)
        if loaded.name != name:
            raise UsageError(f"name: the file defines campaign {loaded.name!r}, not {name!r}", file=str(file))
        gates = with_gpu_memory(loaded, None).gates  # headroom_gib_min: the GPU memory of resources.gpu
    workspace = check_workspace(workspace, create=False)
    with Store(workspace, create=False) as store:
        record = _record(store, name)  # before the lock: an unknown name makes no directory
        with CampaignLock(workspace / name):
            done = regate(store, name, gates)
            if record["spec"].get("parity"):  # the pairs judged again from their run dirs, and stored
                done.parity = record_parity(store, Campaign.model_validate(record["spec"]), quiet=True)
            return done


def write_report(workspace: Path, campaign: CampaignView, out: Path | None) -> Path:
    """Write the report site (index, a page per cell, the comparison with the baseline, summary.md) and return
    the index's path. Beside the view it passes the site what the store knows: the winner and the rejected
    points by the verdicts (orchestrator/judge/freeze.py), baseline summaries, estimates, search trials, GPU-hours.

    A directory that cannot hold it → UsageError (the path and what to do); a full disk or another write
    error → RunError saying what to free and how to write it again.
    """
    from orchestrator.judge.compare import write_baseline_page
    from orchestrator.judge.freeze import freeze
    from orchestrator.run.baseline import baseline_for
    from reports.markdown import markdown_summary
    from reports.site import write_site
    from reports.site_data import SiteExtras, attempt_gpu_hours

    workspace = Path(workspace)
    out_dir = Path(out) if out else workspace / campaign.name / "report"
    extras = SiteExtras()
    try:
        frozen = freeze(workspace, campaign.name)
        extras.winner, extras.how = frozen.winner.point_id, frozen.how
        extras.rejected = [dict(vars(r)) for r in frozen.rejected]
    except (MbxError, KeyError, ValueError) as err:  # e.g. nothing eligible yet: the report says why
        extras.freeze_note = f"No winner picked by the verdicts: {err}"
    with Store(workspace, create=False) as store:
        cells = {c.cell_id: c for c in store.cells(campaign.name, active_only=False)}
        base = baseline_summaries(store, campaign.baseline)
        found = {cell_id: baseline_for(base, cell) for cell_id, cell in cells.items()} if base else {}
        extras.baselines = {k: v for k, v in found.items() if v is not None}
        extras.estimates, extras.trials = store.estimates(campaign.name), store.trials(campaign.name)
        attempts = store.attempts(campaign.name)

    def gpus(cell_id: str) -> int:
        res = cells[cell_id].resources if cell_id in cells else {}
        return int(res.get("nodes") or 1) * int(res.get("gpus_per_node") or 1)

    if attempts:
        extras.gpu_hours = sum(attempt_gpu_hours(a.run_dir, gpus(a.cell_id), a.submitted_at, a.ended_at)
                               for a in attempts)  # fmt: skip
        extras.gpu_hours_note = f"{len(attempts)} attempt(s), run time × ranks; CPU runs count process-hours"
    try:
        if write_baseline_page(workspace, campaign.name, out_dir / "compare") is not None:
            extras.compare_href = "compare/index.html"
        return write_site(campaign, out_dir, extras, {"summary.md": markdown_summary(campaign, extras)})
    except OSError as err:
        raise report_error(err, out_dir, campaign.name, workspace) from None


_WRONG_PLACE = (errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT)


def report_error(err: OSError, out_dir: Path, name: str, workspace: Path) -> MbxError:
    """The one line saying why the report could not be written where, and how to write it again."""
    where = err.filename or out_dir
    again = f"`mbx report {name} --workspace {Path(workspace).expanduser().resolve()}`"
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return RunError(f"the report was not written: {where}: {err.strerror}; free space on the disk holding "
                        f"{out_dir}, then write it again with {again}")  # fmt: skip
    if err.errno in _WRONG_PLACE:
        return UsageError(f"the report cannot be written in {out_dir}: {where}: {err.strerror}; move that path "
                          f"away or choose another directory with --out, then run {again}")  # fmt: skip
    return RunError(f"the report was not written: {where}: {err.strerror or err}; write it again with {again}")


def cancel_campaign(workspace: Path, name: str) -> int:
    """Cancel the active attempts of a campaign through the launcher that started them."""
    from launchers.base import Submitted

    with Store(workspace, create=False) as store:
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
    with Store(workspace, create=False) as store:
        return store.campaign_names()
