"""`mbx report NAME` and `mbx schema ...`: report pages, Markdown summaries and JSON Schemas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text

from orchestrator.cli.options import DEFAULT_WORKSPACE, CampaignNameArg, WorkspaceOpt

if TYPE_CHECKING:  # an annotation only: pydantic stays off the `mbx --help` path
    from reports.views import CampaignView

console = Console(highlight=False, markup=False, emoji=False)
err_console = Console(stderr=True, highlight=False, markup=False, emoji=False)
schema_app = typer.Typer(no_args_is_help=True, help="Print JSON Schemas of mbx files.")


def report(
    name: CampaignNameArg,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Directory for the site (index.html, cells/, compare/, summary.md); default <workspace>/<name>/report.",
        ),
    ] = None,
    markdown: Annotated[
        bool,
        typer.Option(
            "--markdown",
            "-m",
            help="Print the Markdown summary on stdout (paste it into a PR); the page's path goes to stderr.",
        ),  # fmt: skip
    ] = False,
    wandb_report: Annotated[
        bool,
        typer.Option(
            "--wandb-report",
            help="Also build a W&B Report of the campaign's runs (wandb-workspaces): "
            "published when the campaign's wandb.mode is online (key from WANDB_API_KEY), else its spec "
            "is written beside the page as wandb-report.json.",
        ),  # fmt: skip
    ] = False,
) -> None:
    """Write the campaign's report site and print its index's path: it opens offline from disk (index.html: the
    point table, the TFLOP/s heatmap of any two swept axes, TFLOP/s vs peak memory with its Pareto frontier,
    per-step curves, the rejected points and why; cells/: one page per cell; compare/: the comparison with the
    campaign's baseline) and summary.md, the Markdown summary in a performance PR's shape.

    Example: `mbx report moe-dispatch --markdown > pr.md` (the page's path goes to stderr).
    """
    from orchestrator.errors import UsageError
    from orchestrator.flow import runner

    if out is not None and (out.is_symlink() or out.exists()) and not out.is_dir():
        raise UsageError(f"the report cannot be written in {out}: it is not a directory; choose a folder with "
                         f"--out, then run `mbx report {name} --workspace {workspace}`")  # fmt: skip
    view = runner.view(workspace, name)
    page = runner.write_report(workspace, view, out)
    summary = (page.parent / "summary.md").read_text(encoding="utf-8")
    if markdown:
        typer.echo(summary, nl=False)
    where = err_console if markdown else console
    where.print(Text(f"report: {page}"))
    if wandb_report:
        _wandb_report(workspace, view, summary, page.parent, where)


def _wandb_report(workspace: Path, view: CampaignView, summary: str, folder: Path, where: Console) -> None:
    """Build the W&B Report; publish it when online, else write its spec beside the page."""
    import os

    from orchestrator.errors import RunError
    from orchestrator.run.store import Store
    from reports.wandb_log import WandbSettings
    from reports.wandb_report import build_report, report_spec

    with Store(workspace, create=False) as store:
        spec = (store.campaign(view.name) or {}).get("spec") or {}
    settings = WandbSettings.model_validate(spec.get("wandb") or {})
    built = build_report(view, settings, summary)
    if settings.mode == "online" and os.environ.get("WANDB_API_KEY"):
        try:
            built.save()
        except Exception as err:  # noqa: BLE001 - network or permission: say so, keep the page
            raise RunError(f"the W&B Report could not be published: {type(err).__name__}: {err}") from None
        where.print(Text(f"W&B report: {built.url}"))
        return
    from orchestrator.run.outfile import write_out

    target = folder / "wandb-report.json"
    write_out(target, json.dumps(report_spec(built), indent=1) + "\n", label="W&B report spec")
    why = "wandb.mode is " + settings.mode if settings.mode != "online" else "WANDB_API_KEY is not set"
    where.print(Text(f"W&B report spec: {target} (not published: {why})"))


@schema_app.command("campaign")
def schema_campaign() -> None:
    """JSON Schema of campaign files (for editors and CI linting)."""
    from orchestrator.spec.campaign import Campaign

    typer.echo(json.dumps(Campaign.model_json_schema(), indent=2))


@schema_app.command("recipe")
def schema_recipe() -> None:
    """JSON Schema of bundled-trainer recipes (trainer/recipe.py)."""
    from orchestrator.spec.campaign import recipe_schema

    typer.echo(json.dumps(recipe_schema(), indent=2))
