"""`mbx compare A B`: per-metric SAME / DIFFERENT / UNKNOWN between two campaigns, with CIs and a diagnosis."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.options import (
    DEFAULT_WORKSPACE,
    InconclusiveOkOpt,
    JsonOpt,
    LauncherOpt,
    MarkdownOpt,
    MinEffect,
    MinEffectOpt,
    WorkspaceOpt,
    metric_option,
    repeats_option,
)
from orchestrator.cli.terminal import console, noun_app
from orchestrator.errors import RunError, UsageError
from reports.pvalue import p_text

if TYPE_CHECKING:
    from orchestrator.judge.outcome import Outcome

app = noun_app("Compare two campaigns (or golden-values files) metric by metric: SAME / DIFFERENT / UNKNOWN.")

_STYLE = {"DIFFERENT (worse)": "bold red", "DIFFERENT (better)": "green", "UNKNOWN": "yellow"}


_SIDE = "a campaign as named in the store, or a golden-values .json file; with --run, a campaign file."
SideAArg = Annotated[str, typer.Argument(help=f"A (the reference): {_SIDE}", show_default=False)]
SideBArg = Annotated[str, typer.Argument(help=f"B (the candidate): {_SIDE}", show_default=False)]
MetricOpt = metric_option("every metric; repeat --metric for several", several=True)
PairOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--pair",
        help="Compare these points explicitly: A_POINT_OR_CELL:B_POINT_OR_CELL (repeatable) instead of matching "
        "by swept values.",
    ),
]
HardwareOpt = Annotated[
    bool, typer.Option("--allow-different-hardware", help="Compare points measured on different GPU models.")
]
RunOpt = Annotated[
    bool,
    typer.Option(
        "--run",
        help="A and B are campaign files: run their cells alternately (A B A B …, one cell at a time) in the "
        "workspace, then compare. A rerun reuses completed cells.",
    ),
]
RepeatsOpt = repeats_option("each file's sweep.repeats; with --run only")
UntilOpt = Annotated[
    bool,
    typer.Option(
        "--until-conclusive",
        help="Run more repeats of the points of UNKNOWN verdicts (one per side per round, A then B) until every "
        "verdict is SAME or DIFFERENT or the --budget is spent. Looking after every round is paid for by a "
        "Bonferroni split: with at most K = 1 + budget // 2 looks, every look (the first too) tests at α/K "
        "(DIFFERENT at p ≤ 0.01/K; SAME when the (1 − 0.05/K) CI lies inside ±--min-effect), so over all looks a "
        "false DIFFERENT stays ≤ 1% and a false SAME ≤ 2.5%.",
    ),
]
BudgetOpt = Annotated[
    int | None,
    typer.Option(
        "--budget",
        min=2,
        help="With --until-conclusive: extra cells to run at most, both sides together [default: 6]; it sets "
        "the most looks, K = 1 + budget // 2, that the levels are split over.",
    ),
]
HtmlOpt = Annotated[
    Path | None, typer.Option("--html", help="Also write the comparison page, DIR/index.html.")
]


@app.command()
def compare(
    a: SideAArg,
    b: SideBArg,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    metric: MetricOpt = None,
    min_effect: MinEffectOpt = None,
    pair: PairOpt = None,
    allow_different_hardware: HardwareOpt = False,
    as_json: JsonOpt = False,
    markdown: MarkdownOpt = False,
    run: RunOpt = False,
    repeats: RepeatsOpt = None,
    launcher: LauncherOpt = None,
    until_conclusive: UntilOpt = False,
    budget: BudgetOpt = None,
    html: HtmlOpt = None,
    inconclusive_ok: InconclusiveOkOpt = False,
) -> None:
    """Compare two campaigns point by point: relative change with a 95% CI and SAME / DIFFERENT / UNKNOWN per
    metric, decided on repeats (Welch t on log repeat values, p ≤ 0.01 and ≥ --min-effect for DIFFERENT; SAME
    only when the whole 95% CI lies inside ±--min-effect, by two one-sided tests; else UNKNOWN, whatever the
    p-value). Peak memory is deterministic: compared against a floor of 1% or 0.25 GiB, whichever is larger
    (within it SAME, beyond it DIFFERENT), with one run a side too.

    What the sides ran differently is printed first: the resolved configuration diff (recipe, resources, env,
    trainer, launcher), then the environment fingerprint.

    A side may be a Megatron-LM golden-values file (a path ending in .json; `mbx golden export` writes one): one
    point, `golden`, with one repeat of per-step samples and no fingerprint. One repeat on a side follows the
    single-repeat rule: the within-run CI is widened by the run-to-run floor (the workspace's own repeats of
    that trainer and GPU, else 1%; never below 1%, the minimum: "1 run a side: within-run CI widened by the
    run-to-run floor 1.00% (minimum; measured 0.12%: …)"); never SAME, DIFFERENT only for a large effect
    (about 4% at 1%), else UNKNOWN.

    `--run A.yaml B.yaml` runs both campaigns first, interleaved (A B A B …) so that drift of the machine
    falls on both alike; their points must match by swept values. `--until-conclusive` then (or on stored
    campaigns) adds repeat cells to undecided points until decided or out of --budget; running the campaign
    file again keeps those extra repeats active (and says so).

    It ends with one closing line, PASS / FAIL / INCONCLUSIVE as every judging command says it (`--json`:
    `verdict`, `closing` and `exit_code`, the code the command exits with). Exit codes: 0 every metric SAME
    (or below --min-effect, or better); 1 a metric DIFFERENT in the bad direction (slower, fewer TFLOP/s, more
    memory, higher loss), a matched point with no completed repeat (listed "not compared"; the other points are
    compared), or with --run a cell that did not complete; 3 an UNKNOWN (more repeats needed) and
    nothing worse (`--inconclusive-ok` turns it into 0); 2 bad input.

    --min-effect is a percent [default: 1], for every metric and per metric: `2,final_loss=0.5` (a `%` sign
    may follow each number). --launcher/-l applies with --run or --until-conclusive.

    Example: mbx compare base fused -w mbx-workspace --min-effect 2 --markdown > compare.md
    """
    if repeats is not None and not run:
        raise UsageError("--repeats applies with --run (it sets the repeats of both campaign files)")
    if budget is not None and not until_conclusive:
        raise UsageError("--budget applies with --until-conclusive")
    quiet = contextlib.redirect_stdout(sys.stderr) if as_json or markdown else contextlib.nullcontext()
    with quiet:  # progress of runs goes to stderr when stdout carries JSON or Markdown
        result, failed = _decide(workspace, a, b, run, repeats, launcher, until_conclusive, budget,
                                 _options(metric, min_effect, pair, allow_different_hardware))  # fmt: skip
    if html is not None:
        from orchestrator.judge import compare as cmp

        page = cmp.write_page(result, html)
        print(f"comparison page: {page}", file=sys.stderr if as_json or markdown else sys.stdout)
    from orchestrator.judge.compare_outcome import compare_outcome

    judged = compare_outcome(result, failed)
    _output(result, judged, as_json, markdown, inconclusive_ok)
    raise typer.Exit(judged.exit_code(inconclusive_ok))


def _options(
    metric: list[str] | None, min_effect: MinEffect | None, pair: list[str] | None, allow: bool
) -> dict[str, Any]:
    from orchestrator.judge import compare as cmp

    default, per_metric = cmp.parse_min_effect(min_effect.fraction_text() if min_effect else "0.01")
    return dict(metrics=metric, min_effect=default, min_effects=per_metric, pairs=pair,
                allow_different_hardware=allow)  # fmt: skip


def _decide(workspace: Path, a: str, b: str, run: bool, repeats: int | None, launcher: str | None,
            until_conclusive: bool, budget: int | None, options: dict[str, Any]) -> tuple[Any, list[str]]:  # fmt: skip
    """Run (with --run), compare, run more repeats (with --until-conclusive); (comparison, "cell id: why" of
    each cell run that did not complete)."""
    from orchestrator.flow import interleave
    from orchestrator.judge import compare as cmp

    failed: list[Any] = []
    if until_conclusive:
        options = {**options, "looks": interleave.max_looks(interleave.DEFAULT_BUDGET if budget is None else budget)}
    if run:
        a, b, driven = interleave.run_files(workspace, Path(a), Path(b), repeats=repeats, launcher=launcher)
        failed = driven.failed

    def again() -> cmp.Comparison:
        try:
            return cmp.compare_campaigns(workspace, a, b, **options)
        except UsageError as err:
            if not failed:
                raise
            cells = "; ".join(f"{c.cell_id}: {why}" for c, why in failed)
            raise RunError(f"{err} (cells that did not complete: {cells})") from None

    result = again()
    if until_conclusive:
        result, extra = interleave.until_conclusive(
            workspace, result, again, interleave.DEFAULT_BUDGET if budget is None else budget, launcher
        )
        failed = failed + extra.failed
    return result, [f"{cell.cell_id}: {why}" for cell, why in failed]


def _output(result: Any, judged: Outcome, as_json: bool, markdown: bool, inconclusive_ok: bool) -> None:
    """The comparison as JSON (with the outcome's verdict, closing line and the exit code the process exits
    with), Markdown or a table; the latter two end with the closing line."""
    from orchestrator.judge import compare as cmp

    if as_json:
        typer.echo(json.dumps({**cmp.to_json(result), **judged.to_dict(inconclusive_ok)}, indent=2))
    elif markdown:
        from reports.markdown import md_text

        typer.echo(cmp.to_markdown(result) + f"\n**{md_text(judged.closing(inconclusive_ok))}**\n", nl=False)
    else:
        _print(result)
        from orchestrator.judge.closing import closing_text

        console().print(closing_text(judged, inconclusive_ok), soft_wrap=True)


def _print(result: object) -> None:
    from rich.table import Table
    from rich.text import Text

    from orchestrator.judge import compare as cmp

    assert isinstance(result, cmp.Comparison)
    out = console()
    by_name = {m.name: m for m in cmp.METRICS}
    for pair in result.pairs:
        out.print(Text(cmp.pair_title(pair), style="bold"))
        for line in cmp.first_lines(pair):
            head, _, text = line.partition(": ")
            out.print(Text.assemble((f"{head}: ", "bold"), text))
        table = Table()
        for column, justify in (("metric", "left"), ("A", "right"), ("B", "right"), ("Δ", "right"),
                                (cmp.ci_header(result), "left"), ("p", "right"), ("decision", "left")):  # fmt: skip
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for name, d in pair.decisions.items():
            word = cmp.verdict_word(d, by_name[name])
            p = "–" if d.p_value is None else p_text(d.p_value)
            table.add_row(Text(by_name[name].label), cmp.fmt_value(d.mean_a), cmp.fmt_value(d.mean_b),
                          cmp.fmt_change(d), cmp.fmt_ci(d), p, Text(word, style=_STYLE.get(word, "")))  # fmt: skip
        out.print(table)
        lines = [("note: ", x) for x in pair.notes]
        lines += [("diagnosis: ", x) for x in pair.diagnosis] + [("", x) for x in cmp.advice(pair)]
        for head, text in lines:
            out.print(Text.assemble((head, "bold"), text))
    for line in result.unmatched:
        out.print(Text.assemble(("unmatched: ", "yellow"), line))
    for line in result.not_compared:
        out.print(Text.assemble(("not compared: ", "bold red"), line))
    out.print(Text(f"rule: {cmp.rule_text(result)}", style="dim"))
