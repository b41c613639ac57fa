"""What the lifecycle (orchestrator/flow/lifecycle.py) and the commands share: the launcher, the baseline check,
verdict kinds (parity), the report, how a run finished; and the commands over a stored campaign: view, cancel, list."""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from launchers.base import Launcher
from orchestrator.errors import EXIT_PASS, ConfigError, MbxError, RunError, UsageError
from orchestrator.judge import verdict_kinds
from orchestrator.judge.outcome import Outcome as Judged
from orchestrator.judge.outcome import view_outcome
from orchestrator.judge.verdict_kinds import Records
from orchestrator.judge.views import campaign_view
from orchestrator.run.baseline import baseline_summaries
from orchestrator.run.disk import DiskFull, is_full, nothing_left_on_error
from orchestrator.run.engine import Event, Outcome
from orchestrator.run.progress import ProgressReporter
from orchestrator.run.regate import PointVerdict
from orchestrator.run.store import ACTIVE_STATES, Store, check_workspace, manifest_path, read_only
from orchestrator.spec.campaign import Campaign
from reports.views import CampaignView
from trainer import atomic

if TYPE_CHECKING:
    from orchestrator.flow.search_run import SearchFinished
    from reports.site_data import SiteExtras

# markup and emoji off: campaign names, labels, paths and reasons are user text, printed as they are
console = Console(highlight=False, markup=False, emoji=False)
err_console = Console(stderr=True, highlight=False, markup=False, emoji=False)


@dataclass
class Finished:
    """How a run ended: the engine's outcome, every point's verdict from all its repeats and the campaign's
    outcome (orchestrator/judge/outcome.py; None: a dry run, which judges nothing and exits 0)."""

    outcome: Outcome
    points: list[PointVerdict] | None = None
    # each verdict kind's records by its name (orchestrator/judge/verdict_kinds.py; "parity": the on/off pairs)
    verdicts: dict[str, Records] = field(default_factory=dict)
    judged: Judged | None = None
    search: SearchFinished | None = None  # a search's answer: its best point, ledger and trials

    def exit_code(self, inconclusive_ok: bool = False) -> int:
        """The campaign outcome's exit code (0 pass, 1 fail, 3 inconclusive or 0 with `inconclusive_ok`)."""
        return EXIT_PASS if self.judged is None else self.judged.exit_code(inconclusive_ok)


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
        return backend.create(settings, workspace, profile)
    except (ValueError, RuntimeError) as err:  # e.g. a newline in cluster.partition, NeMo-Run not installed
        raise ConfigError([f"launchers.{name}: {err}"]) from None


def check_baseline(workspace: Path, campaign: Campaign, source_file: Path | None) -> None:
    """Refuse (exit 2), before anything is written, a baseline campaign that is not in the workspace's store:
    its relative gates could never be checked."""
    if not campaign.baseline:
        return
    workspace = Path(workspace).expanduser().resolve()
    with read_only(workspace) as store:  # `validate`, `plan` and dry runs check it too: nothing is written
        known = store.campaign_names() if store is not None else []
    if campaign.baseline not in known:
        listed = ", ".join(repr(n) for n in known) or "none yet"
        raise ConfigError([f"baseline: no campaign named {campaign.baseline!r} in workspace {workspace} "
                           f"(known: {listed})"], file=str(source_file) if source_file else campaign.name)  # fmt: skip


def stored_record(store: Store, name: str) -> dict[str, Any]:
    """The campaign's store record; UsageError (exit 2) naming the known campaigns when there is none."""
    record = store.campaign(name)
    if record is None:
        known = ", ".join(store.campaign_names()) or "none yet"
        hint = ""
        if manifest_path(store.workspace, name).exists():
            hint = f"; its run directories are there: `mbx store rebuild --workspace {store.workspace}` restores it"
        raise UsageError(f"no campaign named {name!r} in workspace {store.workspace} (known: {known}){hint}")
    return record


def record_verdicts(store: Store, campaign: Campaign, quiet: bool = False) -> dict[str, Records]:
    """Judge every verdict kind the campaign asks for from its run dirs (the parity pairs), store each kind's
    records (its table) and print its lines (unless `quiet`); kind name → its records."""
    verdicts = {}
    for kind in verdict_kinds.asked(campaign):
        verdicts[kind.name] = records = kind.judge(store, campaign.name, campaign)
        kind.record(store, campaign.name, records)
        for line in [] if quiet else kind.announce(records):
            console.print(line, soft_wrap=True)
    return verdicts


def show(progress: ProgressReporter, event: Event) -> None:
    """Show an event; a display problem is one line, never a stop (the engine records the attempt either way)."""
    try:
        progress(event)
    except Exception as err:  # noqa: BLE001 - the terminal is not worth an attempt left `running`
        err_console.print(Text(f"warning: could not show {event.kind} of {event.cell.cell_id}: {err!r}"))


def view(workspace: Path, name: str, with_rows: bool = True) -> CampaignView:
    """The campaign as the report and status show it: every verdict (cells, points, verdict kinds) judged in memory
    with its current gates from the store opened read-only. Views only read: run, resume and regate store
    verdicts, under the campaign lock."""
    with Store(workspace, create=False, read_only=True) as store:
        stored_record(store, name)
        return campaign_view(store, name, with_rows=with_rows)


def write_report(workspace: Path, campaign: CampaignView, out: Path | None, judged: Judged | None = None) -> Path:
    """Write the report site (index, a page per cell, the comparison with the baseline, summary.md) and return
    the index's path; `judged` is the outcome the closing line said (default: the view's, as status says it).

    A directory that cannot hold it → UsageError (the path and what to do); a full disk or another write
    error → RunError saying what to free and how to write it again.
    """
    from orchestrator.judge.compare import write_baseline_page
    from reports.markdown import markdown_summary
    from reports.site import write_site

    workspace = Path(workspace)
    out_dir = Path(out) if out else workspace / campaign.name / "report"
    extras = report_extras(workspace, campaign, judged)
    try:
        with nothing_left_on_error(out_dir):  # no empty assets/, cells/ left by a full disk
            if write_baseline_page(workspace, campaign.name, out_dir / "compare") is not None:
                extras.compare_href = "compare/index.html"
            return write_site(campaign, out_dir, extras, {"summary.md": markdown_summary(campaign, extras)})
    except OSError as err:
        raise report_error(err, out_dir, campaign.name, workspace) from None


def report_summary(workspace: Path, campaign: CampaignView) -> str:
    """summary.md's text without writing anything: `mbx report -m` prints it when the page cannot be written."""
    from reports.markdown import markdown_summary

    return markdown_summary(campaign, report_extras(Path(workspace), campaign, None))


def report_extras(workspace: Path, campaign: CampaignView, judged: Judged | None) -> SiteExtras:
    """What the site shows beside the view, from what the store knows (read-only): the campaign's outcome (the
    closing line's word), the winner and the rejected points by the verdicts (orchestrator/judge/freeze.py;
    never a point that failed a parity check), baseline summaries, estimates, search trials, GPU-hours."""
    from orchestrator.flow.search_length import search_full_steps
    from orchestrator.run.baseline import baseline_for
    from reports.site_data import SiteExtras, attempt_gpu_hours

    extras = SiteExtras()
    pick_winner(workspace, campaign, extras)
    with Store(workspace, create=False, read_only=True) as store:
        cells = {c.cell_id: c for c in store.cells(campaign.name, active_only=False)}
        base = baseline_summaries(store, campaign.baseline)
        found = {cell_id: baseline_for(base, cell) for cell_id, cell in cells.items()} if base else {}
        extras.baselines = {k: v for k, v in found.items() if v is not None}
        extras.estimates, extras.trials = store.estimates(campaign.name), store.trials(campaign.name)
        extras.search_steps = search_full_steps(store.campaign(campaign.name)) if extras.trials else None
        attempts = store.attempts(campaign.name)
    if judged is None:  # the outcome now (a search: its answer judged again with the current gates)
        from orchestrator.judge.search_answer import search_answer

        judged = view_outcome(campaign, searched=search_answer(workspace, campaign.name, extras.trials))
    extras.outcome = judged.to_dict(exit_hint=False)  # a file outlives the command: no exit hint

    def gpus(cell_id: str) -> int:
        res = cells[cell_id].resources if cell_id in cells else {}
        return int(res.get("nodes") or 1) * int(res.get("gpus_per_node") or 1)

    if attempts:
        extras.gpu_hours = sum(attempt_gpu_hours(a.run_dir, gpus(a.cell_id), a.submitted_at, a.ended_at)
                               for a in attempts)  # fmt: skip
        extras.gpu_hours_note = f"{len(attempts)} attempt(s), run time × ranks; CPU runs count process-hours"
    return extras


def pick_winner(workspace: Path, campaign: CampaignView, extras: SiteExtras) -> None:
    """The winner and the rejected points by the verdicts (mbx freeze's pick), or why there is none: never a point
    a verdict kind rules out (freeze reads each kind's `blame`, orchestrator/judge/verdict_kinds.py)."""
    from orchestrator.judge.freeze import NoWinner, freeze

    try:
        frozen = freeze(workspace, campaign.name)
    except (MbxError, KeyError, ValueError) as err:  # e.g. nothing eligible yet: the report says why
        extras.freeze_note = f"No winner picked by the verdicts: {err}"
        if isinstance(err, NoWinner):  # a tie, nothing eligible: every point it rules out, and why
            extras.rejected = [dict(vars(r)) for r in err.rejected]
        return
    extras.winner, extras.how = frozen.winner.point_id, frozen.how
    extras.rejected = [dict(vars(r)) for r in frozen.rejected]


_WRONG_PLACE = (errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT)


def report_error(err: OSError, out_dir: Path, name: str, workspace: Path) -> MbxError:
    """The one line saying why the report could not be written where, and how to write it again."""
    # a copy's (shutil) filename is its source, filename2 the copy; an atomic write's, its temporary file
    where = atomic.destination(err.filename2 or err.filename or out_dir)
    again = f"`mbx report {name} --workspace {Path(workspace).expanduser().resolve()}`"
    if is_full(err, Path(where)):
        return DiskFull(Path(where), "the report was not written", f"write it again with {again}")
    if err.errno == errno.EFBIG:
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
        record = stored_record(store, name)
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
    """The campaigns of a workspace's store, read read-only (a missing workspace or store: UsageError)."""
    workspace = check_workspace(workspace, create=False)
    with read_only(workspace) as store:
        return store.campaign_names() if store is not None else []
