"""`mbx report NAME`: a campaign's report site and its Markdown summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.options import (
    DEFAULT_WORKSPACE,
    CampaignNameArg,
    JsonOpt,
    MarkdownOpt,
    WorkspaceOpt,
    out_option,
)
from orchestrator.cli.terminal import console, emit_json, err, noun_app

if TYPE_CHECKING:  # annotations only: pydantic and Rich stay off the `mbx --help` path
    from rich.console import Console

    from reports.views import CampaignView

app = noun_app("Write a campaign's report site and its Markdown summary.")
OutOpt = out_option("DIR", "WORKSPACE/NAME/report")


@app.command()
def report(
    name: CampaignNameArg,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    out: OutOpt = None,
    markdown: MarkdownOpt = False,
    wandb_report: Annotated[
        bool,
        typer.Option(
            "--wandb-report",
            help="Also build a W&B Report of the campaign's runs (wandb-workspaces): "
            "published when the campaign's wandb.mode is online (key from WANDB_API_KEY), else its spec "
            "is written beside the page as wandb-report.json.",
        ),  # fmt: skip
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write the campaign's report site and print its index's path: it opens offline from disk (index.html: the
    point table, the TFLOP/s heatmap of any two swept axes, TFLOP/s vs peak memory with its Pareto frontier,
    per-step curves, the rejected points and why; cells/: one page per cell; compare/: the comparison with the
    campaign's baseline) and summary.md, the Markdown summary in a performance PR's shape.

    --out/-o is the site's folder [default: WORKSPACE/NAME/report]. --markdown/-m prints the summary on
    stdout and the page's path on stderr; --json prints the page's and the summary's paths as JSON.

    Example: mbx report moe-dispatch --markdown > pr.md   (the page's path goes to stderr)
    """
    from rich.text import Text

    from orchestrator.errors import UsageError
    from orchestrator.flow import runner

    if out is not None and (out.is_symlink() or out.exists()) and not out.is_dir():
        raise UsageError(f"the report cannot be written in {out}: it is not a directory; choose a folder with "
                         f"--out, then run `mbx report {name} --workspace {workspace}`")  # fmt: skip
    if out is None:  # the site goes into the campaign's folder: a link there is refused, not written through
        from orchestrator.run.workspace_links import refuse_links

        refuse_links(Path(workspace).expanduser().resolve() / name)
    view = runner.view(workspace, name)
    page = runner.write_report(workspace, view, out)
    summary = (page.parent / "summary.md").read_text(encoding="utf-8")
    if markdown:
        typer.echo(summary, nl=False)
    where = err() if markdown or as_json else console()
    where.print(Text(f"report: {page}"))
    if wandb_report:
        _wandb_report(workspace, view, summary, page.parent, where)
    if as_json:
        emit_json({"campaign": name, "page": str(page), "summary": str(page.parent / "summary.md")})


def _wandb_report(workspace: Path, view: CampaignView, summary: str, folder: Path, where: Console) -> None:
    """Build the W&B Report; publish it when online, else write its spec beside the page."""
    import os

    from rich.text import Text

    from orchestrator.errors import RunError
    from orchestrator.run.store import Store
    from reports.wandb_report import build_report, report_spec
    from reports.wandb_settings import WandbSettings

    with Store(workspace, create=False) as store:
        spec = (store.campaign(view.name) or {}).get("spec") or {}
    settings = WandbSettings.model_validate(spec.get("wandb") or {})
    if settings.mode == "online" and os.environ.get("WANDB_API_KEY"):
        built = build_report(view, settings, summary)
        try:
            built.save()
        except Exception as err:  # noqa: BLE001 - network or permission: say so, keep the page
            raise RunError(f"the W&B Report could not be published: {type(err).__name__}: {err}") from None
        where.print(Text(f"W&B report: {built.url}"))
        return
    from orchestrator.run.outfile import write_out

    # the spec written offline names no entity: wandb-workspaces asks the W&B server about a named one
    built = build_report(view, settings.model_copy(update={"entity": None}), summary)
    target = folder / "wandb-report.json"
    write_out(target, json.dumps(report_spec(built), indent=1) + "\n", label="W&B report spec")
    why = "wandb.mode is " + settings.mode if settings.mode != "online" else "WANDB_API_KEY is not set"
    where.print(Text(f"W&B report spec: {target} (not published: {why})"))
