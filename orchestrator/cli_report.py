"""`mbx report NAME` and `mbx schema ...`: report pages, Markdown summaries and JSON Schemas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from orchestrator.options import DEFAULT_WORKSPACE, CampaignNameArg, WorkspaceOpt

console = Console(highlight=False, markup=False, emoji=False)
schema_app = typer.Typer(no_args_is_help=True, help="Print JSON Schemas of mbx files.")


def report(
    name: CampaignNameArg,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Directory for the page; default <workspace>/<name>/report."),
    ] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", "-m", help="Also print the Markdown summary (paste it into a PR).")
    ] = False,
) -> None:
    """Write the campaign's HTML report page (works offline from disk) and print its path."""
    from orchestrator import runner

    view = runner.view(workspace, name)
    page = runner.write_report(workspace, view, out)
    if markdown:
        from reports.markdown import markdown_summary

        typer.echo(markdown_summary(view))
    console.print(Text(f"report: {page}"))


@schema_app.command("campaign")
def schema_campaign() -> None:
    """JSON Schema of campaign files (for editors and CI linting)."""
    from orchestrator.campaign import Campaign

    typer.echo(json.dumps(Campaign.model_json_schema(), indent=2))


@schema_app.command("recipe")
def schema_recipe() -> None:
    """JSON Schema of bundled-trainer recipes (trainer/recipe.py)."""
    from orchestrator.campaign import recipe_schema

    typer.echo(json.dumps(recipe_schema(), indent=2))
