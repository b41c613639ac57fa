"""`mbx golden ...`: Megatron-LM golden-values files (export a completed cell's step rows as one)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from orchestrator.cli.options import (
    DEFAULT_WORKSPACE,
    CampaignNameArg,
    JsonOpt,
    OutFileOpt,
    RequiredPointOpt,
    WorkspaceOpt,
)
from orchestrator.cli.terminal import emit_json, err, noun_app

app = noun_app("Megatron-LM golden-values files: export.\n\nExample: mbx golden export quickstart -p 3f2a9c01d2")


@app.command()
def export(
    campaign: CampaignNameArg,
    point: RequiredPointOpt,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    out: OutFileOpt = None,
    follow_symlinks: Annotated[
        bool,
        typer.Option(
            "--follow-symlinks",
            help="When --out is a symbolic link, write the file it points to (without it a link is refused).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write a completed cell's step rows as Megatron-LM golden values:
    {metric: {start_step, end_step, step_interval, values: {"<step>": value | "nan"}}} with "lm loss",
    "iteration-time" (seconds), "mem-allocated-bytes", "mem-max-allocated-bytes" and "num-zeros", each where
    the run recorded it. The file can be given to `mbx compare` as A or B. A point exports its first
    completed repeat. Printed, the document is JSON already; with --out, --json prints what was written.

    Example: mbx golden export quickstart --point 3f2a9c01d2 --out golden.json
    """
    from rich.text import Text

    from orchestrator.judge.golden import export_golden, write_document
    from orchestrator.run.outfile import check_target

    if out is not None:
        check_target(out, follow_symlinks=follow_symlinks)  # before any work: a device or link is refused
    done = export_golden(workspace, campaign, point)
    for note in done.notes:
        err(soft_wrap=True).print(Text(f"note: {note}"))
    if out is None:
        typer.echo(json.dumps(done.document, indent=4))
        return
    write_document(done.document, out, follow_symlinks=follow_symlinks)
    metrics = ", ".join(done.document)
    if as_json:
        emit_json({"written": str(out), "campaign": campaign, "cell_id": done.cell_id, "metrics": list(done.document)})
        return
    err(soft_wrap=True).print(
        Text.assemble(("wrote ", "bold green"), f"{out} ({metrics}) from {campaign}/{done.cell_id}")
    )
