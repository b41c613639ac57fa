"""`mbx campaign ...`: validate, plan, run, status, resume, cancel and list campaigns."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.options import DEFAULT_WORKSPACE, CampaignFileArg, CampaignNameArg, JsonOpt, WorkspaceOpt

# Commands import the schema, store and engine lazily so `mbx --help` stays fast.

app = typer.Typer(
    no_args_is_help=True,
    help="Define, check and run benchmark campaigns.",
)
console = Console(highlight=False)


@app.command()
def validate(file: CampaignFileArg) -> None:
    """Check a campaign file and every point of its sweep (exit 2 with `file: key: problem` lines if bad)."""
    from orchestrator.loader import load_campaign
    from orchestrator.trainers import expand

    campaign = load_campaign(file)
    points = expand(campaign, file)
    distinct = len({p.point_id for p in points})
    console.print(
        Text.assemble(
            ("ok ", "bold green"),
            f"{file}: campaign {campaign.name!r}, {distinct} point(s) × {campaign.sweep.repeats} repeat(s) = "
            f"{len(points)} cell(s)",
        )
    )


@app.command()
def plan(file: CampaignFileArg, as_json: JsonOpt = False) -> None:
    """Show the expanded points with their cell ids and world sizes; nothing is run."""
    from orchestrator.loader import load_campaign
    from orchestrator.sweep import swept_keys
    from orchestrator.trainers import expand

    campaign = load_campaign(file)
    points = expand(campaign, file)
    if as_json:
        payload = [
            {
                "cell_id": p.cell_id,
                "point_id": p.point_id,
                "repeat": p.repeat,
                "params": p.params,
                "world_size": p.world_size,
                "resources": p.resources,
                "recipe": p.recipe,
            }
            for p in points
        ]
        typer.echo(json.dumps(payload, indent=2))
        return
    keys = swept_keys(campaign)
    table = Table(title=f"{campaign.name}: {len(points)} cell(s)", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("cell id")
    for key in keys:
        table.add_column(key)
    table.add_column("world", justify="right")
    for index, point in enumerate(points, 1):
        values = [Text(str(point.params.get(key, "·"))) for key in keys]
        table.add_row(str(index), point.cell_id, *values, str(point.world_size))
    console.print(table)


@app.command()
def run(
    file: CampaignFileArg,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    launcher: Annotated[
        str | None,
        typer.Option("--launcher", "-l", help="Backend: local, submitit, nemo-run (default: the campaign's)."),
    ] = None,
    parallel: Annotated[
        int | None, typer.Option("--parallel", "-j", min=1, help="Attempts running (or queued on Slurm) at once.")
    ] = None,
    report: Annotated[bool, typer.Option(help="Write the report page when done.")] = True,
    wandb: Annotated[
        bool, typer.Option(help="Log every attempt to W&B (mode from the campaign; offline default).")
    ] = True,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the job scripts and commands the launcher would submit now; submit and record nothing.",
        ),
    ] = False,
) -> None:
    """Run every cell of a campaign; cells already completed in the workspace are skipped.

    Exits 0 when every cell completed and passed its gates, 1 when a cell failed or a gate failed
    (each is named), 2 when the campaign file is invalid. A second run of a campaign that is still
    running is refused before it writes anything.

    `--dry-run` renders exactly what the campaign's launcher (or `--launcher`) would submit for the
    cells not yet completed (sbatch scripts and task tables for Slurm, the command line locally),
    through the same path a real run takes, and records nothing.
    """
    from orchestrator import runner
    from orchestrator.loader import load_campaign
    from orchestrator.trainers import expand

    campaign = load_campaign(file)
    points = expand(campaign, file)
    outcome = runner.run_campaign(
        workspace,
        campaign,
        points,
        file,
        launcher=launcher,
        parallel=parallel,
        make_report=report,
        log_wandb=wandb,
        dry_run=dry_run,
    )
    raise typer.Exit(runner.exit_code(outcome))


@app.command()
def resume(
    name: CampaignNameArg,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    parallel: Annotated[
        int | None, typer.Option("--parallel", "-j", min=1, help="Attempts running at once.")
    ] = None,
    report: Annotated[bool, typer.Option(help="Write the report page when done.")] = True,
    wandb: Annotated[bool, typer.Option(help="Log attempts to W&B.")] = True,
) -> None:
    """Finish a campaign from the run store: adopt running attempts, run what is left, skip what completed."""
    from orchestrator import runner

    outcome = runner.resume_campaign(workspace, name, parallel=parallel, make_report=report, log_wandb=wandb)
    raise typer.Exit(runner.exit_code(outcome))


@app.command()
def status(
    name: CampaignNameArg, workspace: WorkspaceOpt = DEFAULT_WORKSPACE, as_json: JsonOpt = False
) -> None:
    """Show every cell's state, attempt, window figures and verdict."""
    from orchestrator import runner, status_view

    view = runner.view(workspace, name, with_rows=False)
    if as_json:
        typer.echo(json.dumps(status_view.status_payload(view), indent=2))
        return
    console.print(status_view.status_table(view))


@app.command()
def cancel(name: CampaignNameArg, workspace: WorkspaceOpt = DEFAULT_WORKSPACE) -> None:
    """Cancel every queued or running attempt of a campaign."""
    from orchestrator import runner

    count = runner.cancel_campaign(workspace, name)
    console.print(f"cancelled {count} attempt(s) of {name!r}")


@app.command("list")
def list_campaigns(workspace: WorkspaceOpt = DEFAULT_WORKSPACE) -> None:
    """List the campaigns in a workspace."""
    from orchestrator import runner
    from orchestrator.errors import UsageError

    names = runner.campaign_names(workspace)
    if not names:
        raise UsageError(f"no campaigns in workspace {workspace}")
    for name in names:
        console.print(name)
