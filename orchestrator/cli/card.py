"""`mbx card ...`: model verification cards (export a point's performance item, validate a card, gate a
campaign by a card)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.options import (
    DEFAULT_WORKSPACE,
    AllowFailedOpt,
    CampaignNameArg,
    InconclusiveOkOpt,
    JsonOpt,
    OutFileOpt,
    PointsOpt,
    RequiredPointOpt,
    WorkspaceOpt,
    margin_option,
)
from orchestrator.cli.terminal import console, emit_json, err, noun_app

app = noun_app(
    "Model verification cards: export, validate, check (Megatron-Bridge's *.card.yaml).\n\n"
    "Example: mbx card check quickstart quickstart.card.yaml"
)
ITEM_HELP = "The card item, by its name under `items:` (e.g. pretrain_performance; pretrain.H100 names a GPU's)."
ExportItemOpt = Annotated[str, typer.Option("--item", help=ITEM_HELP)]
CheckItemOpt = Annotated[
    str | None, typer.Option("--item", help=ITEM_HELP, show_default="the card's one measured item")
]
ExportMarginOpt = margin_option("from the repeats' noise")
CheckMarginOpt = margin_option("5")
VERDICT_STYLE = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow", "none": "dim"}


def _note(text: str) -> None:
    from rich.text import Text

    err(soft_wrap=True).print(Text(f"note: {text}"))


@app.command()
def export(
    campaign: CampaignNameArg,
    point: RequiredPointOpt,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    out: OutFileOpt = None,
    item: ExportItemOpt = "pretrain_performance",
    margin: ExportMarginOpt = None,
    title: Annotated[str | None, typer.Option(help="The card's title [default: the campaign name].")] = None,
    allow_failed: AllowFailedOpt = None,
    as_json: JsonOpt = False,
    inconclusive_ok: InconclusiveOkOpt = False,
) -> None:
    """Write a card's performance item for one point, from all its completed repeats.

    Metrics in Megatron-Bridge's names (initial/final loss, last-10-steps step time, model TFLOP/s/GPU and
    tokens/s/GPU, peak allocated/reserved GiB), the command, precision, versions and date, and structured
    thresholds beside the prose: the portable gate = measured × (1 − margin) for throughput and × (1 + margin)
    for time and memory, the margin from a 99% prediction bound of the repeats' noise (at least 1%) unless
    --margin gives it (a percent: 3 is 3%). The item also carries `rejected` (every other point and why it
    lost, as mbx freeze judges) and `campaign`, the frozen campaign (this point alone, 3 repeats, the portable
    gates) that its `command` reruns. The card is validated (secrets, accounts, paths) before it is written.
    --json prints the card as JSON instead of YAML (with --out, the file is YAML and --json prints what was
    written).

    A point that failed a check is not exported, as mbx freeze --point refuses it: a gate not passed, a parity
    pair not passed that rules it out (the side under test: the on side of a toggle or pair, the reloading
    side of a checkpoint check, the evaluating side of eval_check), a failed or unstable repeat. That ends with
    one closing line naming the check (FAIL, exit 1; INCONCLUSIVE, exit 3, for a check not decided yet: an
    inconclusive gate or parity pair, a repeat not finished; --json: the verdict, closing line and exit code),
    unless --allow-failed "REASON" says why: then the card is written `unverified`, with `failed_check` naming
    the check and the reason.

    Exit codes: 0 written; 1 the point failed a check (without --allow-failed); 2 bad input; 3 undecided: a
    check of the point not decided yet (`--inconclusive-ok` turns it into 0; nothing is written either way).

    Example: mbx card export quickstart --point 3f2a9c01d2 --out quickstart.card.yaml
    """
    from rich.text import Text

    from orchestrator.errors import UsageError
    from orchestrator.judge.card import export_card, write_card
    from orchestrator.spec.yamlio import dump_yaml

    if allow_failed is not None and not allow_failed.strip():
        raise UsageError('--allow-failed "REASON": give a reason (it is written in the card\'s failed_check)')
    from orchestrator.cli.freeze import no_winner
    from orchestrator.judge.freeze import NoWinner

    try:
        done = export_card(workspace, campaign, point, item=item, margin=margin, title=title,
                           allow_failed=allow_failed)  # fmt: skip
    except NoWinner as refused:  # the point is ruled out by a check: the one closing line, nothing written
        raise typer.Exit(no_winner(campaign, refused, as_json, inconclusive_ok)) from None
    for note in done.notes:
        _note(note)
    if out is None:
        emit_json(done.document) if as_json else typer.echo(dump_yaml(done.document), nl=False)
        return
    write_card(done.document, out)
    if as_json:
        emit_json({"written": str(out), "campaign": campaign, "point_id": done.point_id, "repeats": len(done.cells)})
        return
    err(soft_wrap=True).print(Text.assemble(("wrote ", "bold green"), f"{out} from {campaign} point "
                                            f"{done.point_id} ({len(done.cells)} repeat(s))"))  # fmt: skip


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="Card files (*.card.yaml).", show_default=False)],
    as_json: JsonOpt = False,
) -> None:
    """Check cards before they are published.

    Title and items; every measured item has a status, precision,
    command and finite positive metrics over a window of at least 10 steps; structured thresholds on the right
    side of the measured values; and no secrets (detect-secrets' plugins plus mbx's rules: WANDB_API_KEY=…,
    --wandb-key …, password=…; the value is never printed), account names, personal directories or absolute
    paths anywhere. Exit 0 when every file validates, 2 otherwise (each problem named by file and key path;
    with --json, every file and its problems on stdout as well).

    Example: mbx card validate cards/*.card.yaml
    """
    from orchestrator.errors import UsageError
    from orchestrator.judge.card import read_card

    problems: list[str] = []
    results = []
    for file in files:
        try:
            read_card(file)
            results.append({"file": str(file), "ok": True, "problems": []})
            if not as_json:
                typer.secho("ok ", fg="green", bold=True, nl=False)
                typer.echo(str(file))
        except UsageError as bad:
            problems += bad.lines()
            results.append({"file": str(file), "ok": False, "problems": bad.lines()})
    if as_json:
        emit_json(results)
    if problems:
        raise UsageError(problems)


@app.command()
def check(
    campaign: Annotated[str, typer.Argument(help="Campaign to gate, as named in the store.", show_default=False)],
    card_file: Annotated[Path | None, typer.Argument(help="The card file.", show_default=False)] = None,
    old_campaign: Annotated[
        str | None, typer.Option("--campaign", "-c", hidden=True, help="Before 2026-12-04: CARD --campaign NAME.")
    ] = None,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    item: CheckItemOpt = None,
    margin: CheckMarginOpt = None,
    point: PointsOpt = None,
    as_json: JsonOpt = False,
    inconclusive_ok: InconclusiveOkOpt = False,
) -> None:
    """Gate every point of a campaign (or the --point ones) against a card item's thresholds.

    Each point is judged from all its repeats (mean and 95% CI: a point passes only when the whole interval is
    on the right side). Run it on the card's own frozen campaign (the item's `command`), or with `-p` on the point
    the card was exported from: a sweep's other points are not what the card describes and fail it. Exit 0 every point passes, 1 a point fails, 3 inconclusive (an interval across a
    threshold, or nothing finished; `--inconclusive-ok` turns it into 0). An item without structured thresholds
    is gated at its measured values with --margin (a percent [default: 5]). The campaign comes first, as
    everywhere (`CARD --campaign NAME`, the old order, still works).

    Example: mbx card check quickstart quickstart.card.yaml -w mbx-workspace --json
    """
    from rich.table import Table
    from rich.text import Text

    from orchestrator.errors import UsageError
    from orchestrator.judge.card import check_card

    if old_campaign is not None:  # the old spelling: `card check CARD --campaign NAME`
        if card_file is not None:
            raise UsageError("--campaign: give the campaign once: `mbx card check CAMPAIGN CARD`")
        campaign, card_file = old_campaign, Path(campaign)
    if card_file is None:
        raise UsageError(f"no card file to check {campaign!r} against: `mbx card check CAMPAIGN CARD`")
    checked = check_card(card_file, workspace, campaign, item=item, margin=0.05 if margin is None else margin,
                         points=tuple(point or ()))
    for note in checked.notes:
        _note(note)
    outcome = checked.outcome(campaign, card_file.name)
    if as_json:
        code = checked.exit_code(inconclusive_ok)
        emit_json({"campaign": campaign, "card": str(card_file), "item": checked.item, "verdict": checked.verdict,
                   "closing": outcome.closing(inconclusive_ok), "exit_code": code,
                   "points": [{"point_id": p.point_id, "label": p.label, "repeats": p.finished, "verdict": p.verdict,
                               "why": p.why() if p.verdict != "pass" else ""} for p in checked.points]})  # fmt: skip
        raise typer.Exit(code)
    table = Table(title=f"{campaign} against {card_file.name}: {checked.item}", title_justify="left")
    for column in ("point", "label", "repeats", "verdict", "why"):
        table.add_column(column)
    for point in checked.points:
        table.add_row(point.point_id, point.label, str(point.finished),
                      Text(point.verdict.upper(), style=VERDICT_STYLE.get(point.verdict, "")),
                      point.why() if point.verdict != "pass" else "")  # fmt: skip
    console(soft_wrap=True).print(table)
    from orchestrator.judge.closing import closing_text

    console(soft_wrap=True).print(closing_text(outcome, inconclusive_ok))
    raise typer.Exit(checked.exit_code(inconclusive_ok))
