"""`mbx golden ...`: Megatron-LM golden-values files (export a completed cell's step rows as one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from orchestrator.cli.options import DEFAULT_WORKSPACE, CampaignNameArg, WorkspaceOpt

app = typer.Typer(no_args_is_help=True, help="Megatron-LM golden-values files: `mbx golden export`.")
err_console = Console(stderr=True, highlight=False, markup=False, emoji=False, soft_wrap=True)


@app.command()
def export(
    campaign: CampaignNameArg,
    point: Annotated[
        str,
        typer.Option(
            "--point",
            "-p",
            help="Point id or cell id to export (a point: its first completed repeat).",
            show_default=False,
        ),
    ],
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Write the JSON to this file (default: print it).", show_default=False
        ),
    ] = None,
    follow_symlinks: Annotated[
        bool,
        typer.Option(
            "--follow-symlinks",
            help="When --out is a symbolic link, write the file it points to (without it a link is refused).",
        ),
    ] = False,
) -> None:
    """Write a completed cell's step rows as Megatron-LM golden values:
    {metric: {start_step, end_step, step_interval, values: {"<step>": value | "nan"}}} with "lm loss",
    "iteration-time" (seconds), "mem-allocated-bytes", "mem-max-allocated-bytes" and "num-zeros", each where
    the run recorded it. The file can be given to `mbx compare` as A or B.
    """
    from orchestrator.judge.golden import export_golden, write_document
    from orchestrator.run.outfile import check_target

    if out is not None:
        check_target(out, follow_symlinks=follow_symlinks)  # before any work: a device or link is refused
    done = export_golden(workspace, campaign, point)
    for note in done.notes:
        err_console.print(Text(f"note: {note}"))
    if out is None:
        typer.echo(json.dumps(done.document, indent=4))
        return
    write_document(done.document, out, follow_symlinks=follow_symlinks)
    metrics = ", ".join(done.document)
    err_console.print(
        Text.assemble(("wrote ", "bold green"), f"{out} ({metrics}) from {campaign}/{done.cell_id}")
    )
