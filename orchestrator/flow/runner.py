"""What the lifecycle (orchestrator/flow/lifecycle.py) and the commands share: the launcher, the baseline check,
parity, the report, exit codes; and the commands over a stored campaign: view, cancel, list."""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from launchers.base import Launcher
from orchestrator.errors import ConfigError, MbxError, RunError, UsageError
from orchestrator.judge.views import campaign_view, parity_verdicts
from orchestrator.run.baseline import baseline_summaries
from orchestrator.run.engine import Event, Outcome
from orchestrator.run.progress import ProgressReporter
from orchestrator.run.regate import PointVerdict, regate
from orchestrator.run.store import ACTIVE_STATES, Store, check_workspace, manifest_path, read_only
from orchestrator.spec.campaign import Campaign
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
        stored_record(store, name)
        regate(store, name)
        campaign = campaign_view(store, name, with_rows=with_rows)
        if campaign.parity:
            store.record_parity(name, campaign.parity)  # `mbx report`: the parity verdicts stored again
        return campaign


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
