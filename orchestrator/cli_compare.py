"""`mbx compare A B`: per-metric SAME / DIFFERENT / UNKNOWN between two campaigns, with CIs and a diagnosis."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.options import DEFAULT_WORKSPACE, JsonOpt, WorkspaceOpt

console = Console(highlight=False, markup=False, emoji=False)

_STYLE = {"DIFFERENT (worse)": "bold red", "DIFFERENT (better)": "green", "UNKNOWN": "yellow"}


def compare(
    a: Annotated[
        str,
        typer.Argument(
            help="A (the reference): a campaign as named in the store, or a golden-values .json file.",
            show_default=False,
        ),
    ],
    b: Annotated[
        str,
        typer.Argument(
            help="B (the candidate): a campaign as named in the store, or a golden-values .json file.",
            show_default=False,
        ),
    ],
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            help="Compare only this metric (repeatable): step_time, tflops, peak_alloc, "
            "peak_reserved, final_loss (default: all).",
        ),  # fmt: skip
    ] = None,
    min_effect: Annotated[
        float, typer.Option("--min-effect", help="Smallest relative change that matters (0.01 = 1%).")
    ] = 0.01,
    pair: Annotated[
        list[str] | None,
        typer.Option(
            "--pair",
            help="Compare these points explicitly: A_POINT_OR_CELL:B_POINT_OR_CELL "
            "(repeatable) instead of matching by swept values.",
        ),  # fmt: skip
    ] = None,
    allow_different_hardware: Annotated[
        bool,
        typer.Option("--allow-different-hardware", help="Compare points measured on different GPU models."),
    ] = False,
    as_json: JsonOpt = False,
    markdown: Annotated[
        bool, typer.Option("--markdown", "-m", help="Print a Markdown summary for a PR.")
    ] = False,
) -> None:
    """Compare two campaigns point by point: relative change with a 95% CI and SAME / DIFFERENT / UNKNOWN per
    metric, decided on repeats (Welch t on log repeat values, p ≤ 0.01 and ≥ --min-effect for DIFFERENT).

    A side may be a Megatron-LM golden-values file (a path ending in .json; `mbx golden export` writes one): one
    point, `golden`, with one repeat of per-step samples and no fingerprint. One repeat on a side follows the
    single-repeat rule: never SAME, DIFFERENT only for a large effect, else UNKNOWN.

    Exit codes: 0 every metric SAME (or below --min-effect, or better); 1 a metric DIFFERENT in the bad
    direction (slower, fewer TFLOP/s, more memory, higher loss); 3 an UNKNOWN (more repeats needed) and
    nothing worse; 2 bad input.
    """
    from orchestrator import compare as cmp

    result = cmp.compare_campaigns(workspace, a, b, metrics=metric, min_effect=min_effect, pairs=pair,
                                   allow_different_hardware=allow_different_hardware)  # fmt: skip
    if as_json:
        typer.echo(json.dumps(cmp.to_json(result), indent=2))
    elif markdown:
        typer.echo(cmp.to_markdown(result), nl=False)
    else:
        _print(result)
    raise typer.Exit(result.exit_code)


def _print(result: object) -> None:
    from orchestrator import compare as cmp

    assert isinstance(result, cmp.Comparison)
    by_name = {m.name: m for m in cmp.METRICS}
    for pair in result.pairs:
        table = Table(title=Text(cmp.pair_title(pair)), title_justify="left")
        for column, justify in (("metric", "left"), ("A", "right"), ("B", "right"), ("Δ", "right"),
                                ("95% CI", "left"), ("p", "right"), ("decision", "left")):  # fmt: skip
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for name, d in pair.decisions.items():
            word = cmp.verdict_word(d, by_name[name])
            p = "–" if d.p_value is None else f"{d.p_value:.2g}"
            table.add_row(Text(by_name[name].label), cmp.fmt_value(d.mean_a), cmp.fmt_value(d.mean_b),
                          cmp.fmt_change(d), cmp.fmt_ci(d), p, Text(word, style=_STYLE.get(word, "")))  # fmt: skip
        console.print(table)
        lines = [("fingerprint differs (first suspect): ", x) for x in pair.fingerprint_diff]
        fingerprint = cmp.fingerprint_line(pair)
        if fingerprint is not None:
            lines.append(("fingerprint: ", fingerprint))
        lines += [("note: ", x) for x in pair.notes]
        lines += [("diagnosis: ", x) for x in pair.diagnosis] + [("", x) for x in cmp.advice(pair)]
        for head, text in lines:
            console.print(Text.assemble((head, "bold"), text))
    for line in result.unmatched:
        console.print(Text.assemble(("unmatched: ", "yellow"), line))
    word = {0: "SAME", 1: "WORSE", 3: "UNKNOWN"}[result.exit_code]
    console.print(Text(f"{word}: {result.a} → {result.b}, practical threshold {result.min_effect:.1%}",
                       style="bold"))  # fmt: skip
