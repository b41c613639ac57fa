"""`mbx campaign ...`: validate, plan, run, status, resume, cancel and list campaigns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.cli.options import (
    DEFAULT_WORKSPACE,
    CampaignFileArg,
    CampaignFileOpt,
    CampaignNameArg,
    CheckBaselineOpt,
    GpuOpt,
    InconclusiveOkOpt,
    JsonOpt,
    LauncherOpt,
    MaxCellsOpt,
    ParallelOpt,
    ReportOpt,
    StrictOpt,
    WandbOpt,
    WorkspaceOpt,
)
from orchestrator.cli.terminal import console, emit_json, json_result, noun_app

# Commands import the schema, store, engine and Rich lazily so `mbx --help` and `validate` stay fast.

app = noun_app(
    "Define, check and run campaigns: validate, plan, run, resume, regate, status, cancel, list.\n\n"
    "Example: mbx campaign validate campaigns/quickstart.yaml"
)


class Closed(typer.Exit):
    """A command's exit with the outcome its closing line said (`inconclusive_ok`: given --inconclusive-ok):
    what its `--json` carries, word for word."""

    def __init__(self, judged: Any, inconclusive_ok: bool) -> None:
        super().__init__(judged.exit_code(inconclusive_ok))
        self.judged, self.inconclusive_ok = judged, inconclusive_ok


def _closing(arguments: dict[str, Any], code: int, exited: typer.Exit | None = None) -> dict[str, Any]:
    """`run/resume/regate --json`: the campaign's outcome as the command's closing line said it (its verdict,
    that line, its parts), the exit code and every cell as `mbx campaign status --json` prints them (judged in
    memory from the store, read-only)."""
    from orchestrator.cli import status_view
    from orchestrator.flow import runner

    name = arguments.get("name")
    if name is None:  # `run FILE`: the campaign's name from its file
        from orchestrator.spec.loader import load_campaign

        name = load_campaign(arguments["file"]).name
    if arguments.get("dry_run"):  # nothing was recorded
        return {"campaign": name, "exit_code": code, "dry_run": True}
    view = runner.view(arguments["workspace"], name, with_rows=False)
    said = exited.judged.to_dict(exited.inconclusive_ok) if isinstance(exited, Closed) else {}
    return {**status_view.status_json(arguments["workspace"], view), **said, "exit_code": code}


def _check_baseline(ctx: typer.Context, wanted: bool, workspace: Path, campaign: Any, file: Path) -> None:
    """--check-baseline: the baseline campaign is in the workspace's store. `-w DIR` alone on the command line,
    the spelling before 2026-12-06, still checks it, with a note (MBX_WORKSPACE alone does not)."""
    source = ctx.get_parameter_source("workspace")  # Typer's own (vendored) Click: compared by name
    if not wanted and source is not None and source.name == "COMMANDLINE":
        typer.echo("note: --workspace/-w alone checks the baseline as before 2026-12-06; write --check-baseline "
                   "(--workspace names the workspace only)", err=True)  # fmt: skip
        wanted = True
    if wanted:
        from orchestrator.flow.runner import check_baseline

        check_baseline(workspace, campaign, file)


@app.command()
def validate(
    ctx: typer.Context,
    file: CampaignFileArg,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    check_baseline: CheckBaselineOpt = False,
    max_cells: MaxCellsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a campaign file and every point of its sweep (exit 2 with `file: key: problem` lines if bad).

    --check-baseline also checks that the baseline campaign (`baseline:`) is in the workspace's store.

    Example: mbx campaign validate campaigns/quickstart.yaml --json
    """
    from orchestrator.spec.loader import load_campaign
    from orchestrator.trainers import expand, with_parity_axes, with_steps_key

    campaign = with_parity_axes(with_steps_key(load_campaign(file)), file)  # parity sides as sweep factors
    points = expand(campaign, file, max_cells)
    _check_like_plan(campaign, points, file)
    if campaign.sweep.search is not None:  # its shorter trials: their length set through its steps key
        from orchestrator.flow.search_length import check_steps_key  # (numpy: searches only)

        check_steps_key(campaign, points, file)
    _check_baseline(ctx, check_baseline, workspace, campaign, file)
    distinct = len({p.point_id for p in points})
    if as_json:
        emit_json({"ok": True, "file": str(file), "campaign": campaign.name, "points": distinct,
                   "repeats": campaign.sweep.repeats, "cells": len(points)})  # fmt: skip
        return
    typer.secho("ok ", fg="green", bold=True, nl=False)  # plain echo: Rich stays off validate's path
    typer.echo(f"{file}: campaign {campaign.name!r}, {distinct} point(s) × {campaign.sweep.repeats} repeat(s) = "
               f"{len(points)} cell(s)")  # fmt: skip


def auto_gpu(gpu: str | None) -> Any:
    """--gpu as feasibility takes it: `auto` read from this machine's GPU (said on stderr), else as given."""
    from orchestrator.run.feasibility import Card, resolve_gpu

    found = resolve_gpu(gpu)
    if isinstance(found, Card):
        typer.echo(f"--gpu auto: this machine's GPU is {found} (nvidia-smi)", err=True)
    return found


def _named_gpus(campaign: Any) -> list[tuple[str, Any]]:
    """(key path, name) of resources.gpu and of each swept resources.gpu value."""
    from orchestrator.spec.loader import sweep_entries

    named = [("resources.gpu", campaign.resources.gpu)] if campaign.resources.gpu is not None else []
    for where, key, values in sweep_entries(campaign):
        if key == "resources.gpu":
            several = len(values) > 1 or where.startswith(("sweep.axes.", "sweep.zip["))
            named += [(f"{where}[{i}]" if several else where, v) for i, v in enumerate(values)]
    return named


def _check_like_plan(campaign: Any, points: list[Any], file: Any) -> None:
    """What `mbx campaign plan` refuses without --gpu or --strict, refused by validate too: an unknown GPU name,
    every point infeasible (its layout, or its estimate on the GPU it names or against the search's peak-memory
    constraint). The memory model loads only where a GPU or a constraint makes it count."""
    search = campaign.sweep.search
    constrained = search is not None and search.constraints.peak_memory_gib_max is not None
    if not (_named_gpus(campaign) or constrained or (points and all(p.infeasible for p in points))):
        return  # no GPU, no constraint, a feasible layout: nothing plan checks is left (quickstart's case)
    from orchestrator.run.feasibility import check_points, limits_of

    _check_gpu_names(campaign, file)
    check_points(points, None, False, str(file), limits_of(campaign))


def _check_gpu_names(campaign: Any, file: Any) -> None:
    """resources.gpu and each swept resources.gpu value is a GPU the estimates know (plan refuses another)."""
    from orchestrator.errors import ConfigError
    from orchestrator.run.feasibility import gpu_name

    named = _named_gpus(campaign)
    problems = []
    for where, name in named:
        if name is None:  # a swept null: the point's own GPU is none, as plan reads it
            continue
        try:
            gpu_name(str(name))
        except ConfigError as err:
            problems += [f"{where}: {p.removeprefix('gpu: ')}" for p in err.problems]
    if problems:
        raise ConfigError(problems, file=str(file))


@app.command()
def plan(
    ctx: typer.Context,
    file: CampaignFileArg,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    check_baseline: CheckBaselineOpt = False,
    as_json: JsonOpt = False,
    max_cells: MaxCellsOpt = None,
    gpu: GpuOpt = None,
    strict: StrictOpt = False,
) -> None:
    """Show the expanded points with their cell ids, world sizes, memory estimates and feasibility; nothing
    is run.

    Each point's peak memory per GPU is estimated before submission (the bundled trainer's recipe, or the
    Megatron-LM flags of a command trainer); with a GPU (--gpu or resources.gpu) the headroom is shown and
    points that do not fit, or that break a parallel-layout rule, are marked INFEASIBLE with the reason:
    `mbx campaign run` skips them (--strict refuses the campaign instead). With --check-baseline, the baseline
    campaign is checked to be in the workspace's store, as `validate` does.

    On a GPU node, `--gpu auto` judges every point on this machine's GPU, as nvidia-smi reports it (name and
    memory; exit 2 when there is none): what `mbx campaign run` finds there too, since every attempt checks its
    allocation's GPU before the trainer starts and records a point that cannot fit as infeasible.

    Example: mbx campaign plan campaigns/quickstart.yaml --gpu H100-80GB --json
    """
    from orchestrator.flow.lifecycle import Options, load, prepare_loaded
    from orchestrator.run.plan_view import plan_text
    from orchestrator.spec.software import local_source_notes
    from orchestrator.spec.sweep import swept_keys

    options = Options(workspace, gpu=auto_gpu(gpu), strict=strict, max_cells=max_cells)
    campaign, points = load(file, options)  # as run loads it (parity sides too)
    _check_gpu_names(campaign, file)
    prepared = prepare_loaded(campaign, points, file, options)  # what `run` prepares: the same estimates
    assessment = prepared.assessment
    assert assessment is not None  # a file's plan is assessed
    _check_baseline(ctx, check_baseline, workspace, campaign, file)
    if as_json:
        rows = assessment.by_point()
        payload = [
            {
                "cell_id": p.cell_id,
                "point_id": p.point_id,
                "repeat": p.repeat,
                "params": p.params,
                "world_size": p.world_size,
                "resources": p.resources,
                "recipe": p.recipe,
                "estimate": rows[p.point_id].to_dict(),
                "attempt": prepared.attempts.get(p.cell_id),  # what a run would number it now (None: not run)
            }
            for p in points
        ]
        typer.echo(json.dumps(payload, indent=2))
    else:
        typer.echo(plan_text(campaign.name, points, swept_keys(campaign), assessment))
    for note in local_source_notes(campaign.software):  # what runs beyond the trainer, named as such
        typer.secho(f"note: {note}", fg="yellow", err=as_json)


@app.command()
@json_result(_closing)
def run(
    file: CampaignFileArg,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    launcher: LauncherOpt = None,
    parallel: ParallelOpt = None,
    report: ReportOpt = True,
    wandb: WandbOpt = True,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the job scripts and commands the launcher would submit now; submit and record nothing.",
        ),
    ] = False,
    inconclusive_ok: InconclusiveOkOpt = False,
    max_cells: MaxCellsOpt = None,
    gpu: GpuOpt = None,
    strict: StrictOpt = False,
) -> None:
    """Run every cell of a campaign; cells already completed in the workspace are skipped.

    With `sweep.search` (grid | random | halving | optuna, a budget and an objective) only the points the
    search picks run, rung by rung; every trial, the best point with its evidence and the Pareto front go to
    the store and the report. Running the same file again (or `mbx campaign resume NAME`) resumes a killed
    search without repeating finished trials. Exit 0 when a best point was found, 1 when none qualified, 3 when
    it is undecided: a tie no figure separates (orchestrator/judge/best.py), or the budget ran out before a best
    point with no trial failed (one INCONCLUSIVE closing line). A `points` budget counts points that ran (never
    an infeasible one: ruled out by its estimate, or refused on its node's GPU, which costs no steps or
    GPU-hours either); a `gpu_hours` budget checks each trial's predicted cost before it starts.

    Before anything is submitted, every point's peak memory per GPU is estimated; a point that breaks a
    parallel-layout rule, or whose estimate does not fit the GPU (--gpu, else resources.gpu), is infeasible:
    recorded in the store with its reason and skipped, while the rest run. `--strict` refuses the whole
    campaign instead (exit 2, nothing written). `mbx campaign plan` shows the estimates first. Each attempt
    records its allocation's GPU (node.json) before the trainer starts; on a GPU with less memory than the
    point needs, the trainer is not started and the point is recorded infeasible with the reason (not a
    failure; every point refused: exit 1). The headroom gate uses each attempt's own GPU.

    Every stored result, skipped cells' too, is judged again with the campaign's current gates; a point's
    verdict comes from all its repeats (mean and confidence interval). A second run of a campaign that is
    still running is refused before it writes anything.

    Exit codes (README's table; the closing line says the same word): 0 every point passed its gates and every
    parity pair passed; 1 a cell did not complete, a point failed a gate or a parity pair failed (each is
    named); 2 bad input (an invalid file, a baseline campaign not in the workspace); 3 inconclusive: nothing
    failed but something could not be decided (named, with why, under the INCONCLUSIVE line).
    `--inconclusive-ok` turns 3 into 0.

    `--dry-run` renders exactly what the campaign's launcher (or `--launcher`) would submit for the
    cells not yet completed (sbatch scripts and task tables for Slurm, the command line locally),
    through the same path a real run takes, and records nothing. For a `sweep.search` it renders the first
    batch the search would run (a halving's first rung at its run length, Optuna's first trial), since what
    follows depends on those results.

    `--json` prints the progress on stderr and, at the end, on stdout: the closing line as printed (`closing`,
    `verdict`, `parts`), the exit code and every cell (as `mbx campaign status --json`); with --dry-run, the
    scripts go to stderr. The report page, summary.md and the W&B outcome say the closing line's word without
    its exit hint (W&B's `outcome/exit_code`: this command's).

    Example: mbx campaign run campaigns/quickstart.yaml -w mbx-workspace -j 2
    """
    from orchestrator.flow import lifecycle

    gpu = auto_gpu(gpu)  # --gpu auto: this machine's GPU (a local run's allocation)
    options = lifecycle.Options(workspace, launcher, parallel, gpu, strict, max_cells, make_report=report,
                                log_wandb=wandb, inconclusive_ok=inconclusive_ok)  # fmt: skip
    campaign, points = lifecycle.load(file, options)  # parity sides as sweep factors
    _check_gpu_names(campaign, file)  # as validate and plan: the file's GPU names, whatever --gpu says
    plan = lifecycle.prepare_loaded(campaign, points, file, options)  # a search too: its rungs are plans in turn
    finished = lifecycle.render(plan) if dry_run else lifecycle.execute(plan)
    if finished.judged is None:  # a dry run judges nothing
        raise typer.Exit(finished.exit_code(inconclusive_ok))
    raise Closed(finished.judged, inconclusive_ok)


@app.command()
@json_result(_closing)
def resume(
    name: CampaignNameArg,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    parallel: ParallelOpt = None,
    report: ReportOpt = True,
    wandb: WandbOpt = True,
    inconclusive_ok: InconclusiveOkOpt = False,
) -> None:
    """Finish a campaign from the run store: adopt running attempts, run what is left, skip what completed.

    Exit codes: 0 every point passed; 1 a cell did not complete or a point failed a gate; 2 bad input;
    3 inconclusive (nothing failed, a point undecided; named on the closing line). `--inconclusive-ok`
    turns 3 into 0. `--json`: as for `run`.

    Example: mbx campaign resume quickstart -w mbx-workspace
    """
    from orchestrator.flow import lifecycle

    options = lifecycle.Options(workspace, parallel=parallel, make_report=report, log_wandb=wandb,
                                inconclusive_ok=inconclusive_ok)
    finished = lifecycle.execute(lifecycle.prepare_stored(workspace, name, options))
    if finished.judged is None:
        raise typer.Exit(finished.exit_code(inconclusive_ok))
    raise Closed(finished.judged, inconclusive_ok)


@app.command()
@json_result(_closing)
def regate(
    name: CampaignNameArg,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    file: CampaignFileOpt = None,
    report: ReportOpt = True,
    wandb: WandbOpt = True,
    inconclusive_ok: InconclusiveOkOpt = False,
) -> None:
    """Judge every stored result of a campaign again with its gates, and print the verdicts that changed.

    With --file, the gates come from that (changed) campaign file and become the campaign's gates. A search's
    answer is judged again too: a best point that now fails a gate is no best (`mbx freeze`'s rule). Then, as
    `run` does, the report (summary.md, the page's badge) is written again and the outcome logged to W&B, so
    they say the closing line's word (--no-report, --no-wandb: not). Exit codes as for `run`, from the points'
    verdicts, the parity pairs and a search's answer (the closing line says the same word): 0 pass, 1 fail,
    2 bad input, 3 inconclusive (`--inconclusive-ok` turns it into 0). `--json`: as for `run`.
    --file/-f: take the gates from this campaign file (the same name) and store them.

    Example: mbx campaign regate quickstart --file campaigns/quickstart.yaml
    """
    from rich.text import Text

    from orchestrator.flow import lifecycle
    from orchestrator.judge.closing import closing_text, verdict_lines
    from orchestrator.run.progress import print_changes

    options = lifecycle.Options(
        workspace, make_report=report, log_wandb=wandb, inconclusive_ok=inconclusive_ok
    )
    done = lifecycle.regate_campaign(workspace, name, file, options)
    print_changes(done.changes, "re-judged with " + ("the gates of " + str(file) if file else "the stored gates"))
    points = done.judged.points
    gates = "gates updated" if done.gates_changed else "gates unchanged"
    console().print(Text(f"{name}: {len(points)} point(s) judged; {gates}; {done.rewritten} stored result(s) "
                         f"rewritten, {len(done.changes)} verdict(s) changed"), soft_wrap=True)  # fmt: skip
    judged = done.outcome  # a search's answer judged again, as status says it (judge/outcome.py)
    console().print(closing_text(judged, inconclusive_ok), soft_wrap=True)
    for line in verdict_lines(done.verdicts):  # a parity campaign: its pairs are judged again too
        console().print(line, soft_wrap=True)
    lifecycle.say_unwritten(done.unwritten)  # a full disk: one line, exit 1 (every verdict is stored)
    raise Closed(judged, inconclusive_ok)


@app.command()
def status(
    name: CampaignNameArg, workspace: WorkspaceOpt = DEFAULT_WORKSPACE, as_json: JsonOpt = False
) -> None:
    """Show every cell's state, attempt, window figures and verdict, and the campaign's outcome: the closing line
    run and regate end with (its gates and parity pairs, or a search's answer), in the same word.

    Status only reads: every verdict is judged in memory with the campaign's current gates; only run, resume
    and regate store verdicts. --json prints {campaign, verdict, closing, exit_code (what run and regate exit
    with for these verdicts), parts, cells}.

    Example: mbx campaign status quickstart -w mbx-workspace --json
    """
    from orchestrator.cli import status_view
    from orchestrator.flow import runner

    view = runner.view(workspace, name, with_rows=False)
    if as_json:
        emit_json(status_view.status_json(workspace, view))
        return
    console().print(status_view.status_table(view))
    for line in status_view.damaged_lines(view):
        console().print(line)
    for line in status_view.flops_lines(view):  # the printed TFLOP/s/GPU against mbx's own count
        console().print(line, soft_wrap=True)
    for line in status_view.verdict_lines(workspace, view):  # the outcome, parity pairs, the best point
        console().print(line, soft_wrap=True)


@app.command()
def cancel(name: CampaignNameArg, workspace: WorkspaceOpt = DEFAULT_WORKSPACE, as_json: JsonOpt = False) -> None:
    """Cancel every queued or running attempt of a campaign.

    Example: mbx campaign cancel quickstart -w mbx-workspace
    """
    from orchestrator.flow import runner

    count = runner.cancel_campaign(workspace, name)
    if as_json:
        emit_json({"campaign": name, "cancelled": count})
        return
    typer.echo(f"cancelled {count} attempt(s) of {name!r}")


@app.command("list")
def list_campaigns(workspace: WorkspaceOpt = DEFAULT_WORKSPACE, as_json: JsonOpt = False) -> None:
    """List the campaigns in a workspace.

    Example: mbx campaign list -w mbx-workspace --json
    """
    from orchestrator.errors import UsageError
    from orchestrator.flow import runner

    names = runner.campaign_names(workspace)
    if not names:
        raise UsageError(f"no campaigns in workspace {workspace}")
    if as_json:
        emit_json(names)
        return
    for name in names:
        typer.echo(name)
