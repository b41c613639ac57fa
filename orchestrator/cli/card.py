"""`mbx card ...`: model verification cards (export a point's performance item, validate a card, gate a
campaign by a card)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.cli.options import DEFAULT_WORKSPACE, CampaignNameArg, WorkspaceOpt

app = typer.Typer(
    no_args_is_help=True,
    help="Model verification cards (Megatron-Bridge's *.card.yaml): export, validate, check.",
)
console = Console(highlight=False, markup=False, emoji=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, markup=False, emoji=False, soft_wrap=True)
VERDICT_STYLE = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow", "none": "dim"}


@app.command()
def export(
    campaign: CampaignNameArg,
    point: Annotated[
        str,
        typer.Option("--point", "-p", help="Point id, cell id or label of the point.", show_default=False),
    ],
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Write the card here (default: print it).", show_default=False),
    ] = None,
    item: Annotated[str, typer.Option(help="The card item's name.")] = "pretrain_performance",
    margin: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=0.5,
            help="Margin of the portable gates (0.03 = 3%) [default: from repeat noise].",
            show_default=False,
        ),  # fmt: skip
    ] = None,
    title: Annotated[str | None, typer.Option(help="The card's title [default: the campaign name].")] = None,
) -> None:
    """Write a card's performance item for one point, from all its completed repeats.

    Metrics in Megatron-Bridge's names (initial/final loss, last-10-steps step time, model TFLOP/s/GPU and
    tokens/s/GPU, peak allocated/reserved GiB), the command, precision, versions and date, and structured
    thresholds beside the prose: the portable gate = measured × (1 − margin) for throughput and × (1 + margin)
    for time and memory, the margin from a 99% prediction bound of the repeats' noise (at least 1%) unless
    --margin gives it. The item also carries `rejected` (every other point and why it lost, as mbx freeze
    judges) and `campaign`, the frozen campaign (this point alone, 3 repeats, the portable gates) that its
    `command` reruns. The card is validated (secrets, accounts, paths) before it is written.

    Example: mbx card export quickstart --point 3f2a9c01d2 --out quickstart.card.yaml
    """
    from orchestrator.judge.card import export_card, write_card
    from orchestrator.spec.yamlio import dump_yaml

    done = export_card(workspace, campaign, point, item=item, margin=margin, title=title)
    for note in done.notes:
        err_console.print(Text(f"note: {note}"))
    if out is None:
        typer.echo(dump_yaml(done.document), nl=False)
        return
    write_card(done.document, out)
    err_console.print(Text.assemble(("wrote ", "bold green"), f"{out} from {campaign} point {done.point_id} "
                                    f"({len(done.cells)} repeat(s))"))  # fmt: skip


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="Card files (*.card.yaml).", show_default=False)],
) -> None:
    """Check cards before they are published.

    Title and items; every measured item has a status, precision,
    command and finite positive metrics over a window of at least 10 steps; structured thresholds on the right
    side of the measured values; and no secrets (detect-secrets' plugins plus mbx's rules: WANDB_API_KEY=…,
    --wandb-key …, password=…; the value is never printed), account names, personal directories or absolute
    paths anywhere. Exit 0 when every file validates, 2 otherwise (each problem named by file and key path)."""
    from orchestrator.errors import UsageError
    from orchestrator.judge.card import read_card

    problems: list[str] = []
    for file in files:
        try:
            read_card(file)
            console.print(Text.assemble(("ok ", "bold green"), str(file)))
        except UsageError as err:
            problems += err.lines()
    if problems:
        raise UsageError(problems)


@app.command()
def check(
    card_file: Annotated[Path, typer.Argument(help="The card file.", show_default=False)],
    campaign: Annotated[str, typer.Option("--campaign", "-c", help="Campaign to gate.", show_default=False)],
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    item: Annotated[
        str | None,
        typer.Option(
            help="The card item (e.g. pretrain.H100) when the card has several.", show_default=False
        ),
    ] = None,
    margin: Annotated[
        float, typer.Option(min=0.0, max=0.5, help="Margin for an item without structured thresholds.")
    ] = 0.05,
) -> None:
    """Gate every point of a campaign against a card item's thresholds.

    Each point is judged from all its repeats (mean and 95% CI: a point passes only when the whole interval is on the right side). Exit 0 every point passes,
    1 a point fails, 3 inconclusive (an interval across a threshold, or nothing finished)."""
    from orchestrator.judge.card import check_card

    checked = check_card(card_file, workspace, campaign, item=item, margin=margin)
    for note in checked.notes:
        err_console.print(Text(f"note: {note}"))
    table = Table(title=f"{campaign} against {card_file.name}: {checked.item}", title_justify="left")
    for column in ("point", "label", "repeats", "verdict", "why"):
        table.add_column(column)
    for point in checked.points:
        table.add_row(point.point_id, point.label, str(point.finished),
                      Text(point.verdict.upper(), style=VERDICT_STYLE.get(point.verdict, "")),
                      point.why() if point.verdict != "pass" else "")  # fmt: skip
    console.print(table)
    raise typer.Exit(checked.exit_code)
