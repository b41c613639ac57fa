"""`mbx bisect FILE`: the first version (commit, image tag, pip version, env value) that changes a metric."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.options import (
    DEFAULT_WORKSPACE,
    CampaignFileArg,
    InconclusiveOkOpt,
    JsonOpt,
    LauncherOpt,
    MarkdownOpt,
    MinEffectOpt,
    ParallelOpt,
    WorkspaceOpt,
    metric_option,
    repeats_option,
)
from orchestrator.cli.terminal import console, err, noun_app

app = noun_app("Find the first version (commit, image, pip version, env value) that changes a metric.")
_STYLE = {"bad": "bold red", "good": "green", "unknown": "yellow"}


GoodOpt = Annotated[str | None, typer.Option("--good", help="A ref of the software repo that is good.")]
BadOpt = Annotated[str | None, typer.Option("--bad", help="A later ref of the same repo that is bad.")]
RepoOpt = Annotated[
    str | None, typer.Option("--repo", help="The software.repos entry (default: the only one).")
]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--key",
        help="With --values: the sweep key (container.image, software.pip.PKG, env.NAME, ...); names mbx reserves "
        "(MBX_*, SLURM_*, RANK, JIT cache variables, ...) are refused, as in a campaign's sweep.",
    ),
]
ValuesOpt = Annotated[
    str | None,
    typer.Option("--values", help="Comma-separated values of --key in order, good first, bad last."),
]
RepeatsOpt = repeats_option("sweep.repeats if the file sets it, else 3", minimum=2)
BudgetOpt = Annotated[
    int, typer.Option("--max-repeats", min=2, help="Budget: repeats per version while a decision is UNKNOWN.")
]
MetricOpt = metric_option("step_time")


@app.command()
def bisect(
    file: CampaignFileArg,
    good: GoodOpt = None,
    bad: BadOpt = None,
    repo: RepoOpt = None,
    key: KeyOpt = None,
    values: ValuesOpt = None,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    launcher: LauncherOpt = None,
    parallel: ParallelOpt = None,
    repeats: RepeatsOpt = None,
    max_repeats: BudgetOpt = 10,
    metric: MetricOpt = "step_time",
    min_effect: MinEffectOpt = None,
    markdown: MarkdownOpt = False,
    as_json: JsonOpt = False,
    inconclusive_ok: InconclusiveOkOpt = False,
) -> None:
    """Bisect an ordered list of versions against the campaign's frozen recipe.

    Versions: `--good REF --bad REF` (the commits of `git rev-list GOOD..BAD` of a software.repos entry,
    as software.repos.NAME.ref), or `--key KEY --values v1,v2,...` (container tags, pip versions, env
    values, any sweep key).

    Both ends are measured first; then binary search, each probe decided by `mbx compare`'s statistics
    against good-end repeats run beside it, interleaved (more repeats while UNKNOWN, up to --max-repeats),
    so drift of the machine between probes cannot hide or fake a change. The probes are cells of a
    bisect campaign in the workspace, so running the same bisect again reuses every finished run. Runs go
    through the campaign's launcher (local or Slurm), as `mbx campaign run` does; their progress is on
    stderr, the final table (every measurement, the first bad version, its diagnosis) on stdout.

    Exit codes: 0 the first bad version is named; 1 refused: the ends do not differ (or did not run);
    2 bad input; 3 inconclusive (the ends, or a probe, undecided within the budget); `--inconclusive-ok`
    turns 3 into 0.

    --min-effect is a percent [default: 1].

    Example: mbx bisect campaigns/quickstart.yaml --good v1.0 --bad main --min-effect 5 --markdown
    """
    from rich.text import Text

    from orchestrator.flow import bisect as search
    from orchestrator.flow.options import Options
    from orchestrator.spec.loader import load_campaign

    effect = 0.01 if min_effect is None else min_effect.single()  # a percent on the command line
    campaign = load_campaign(file)
    plan = search.make_plan(campaign, file, good=good, bad=bad, repo=repo, key=key, values=values,
                            repeats=repeats, max_repeats=max_repeats, metric=metric, min_effect=effect)  # fmt: skip
    options = Options(Path(workspace), launcher=launcher, parallel=parallel)
    runner = search.Search(campaign, file, plan, options)
    runner.log = lambda line: err().print(Text(line, style="bold"))
    err().print(Text(f"bisect {plan.key}: {len(plan.values)} versions ({plan.labels[0]} … {plan.labels[-1]}), "
                           f"campaign {plan.name} in {workspace}"))  # fmt: skip
    result = runner.run()
    if as_json:
        typer.echo(json.dumps(search.to_json(result, inconclusive_ok), indent=2, default=str))
    elif markdown:
        typer.echo(search.to_markdown(result), nl=False)
    else:
        show(result, inconclusive_ok)
    raise typer.Exit(result.exit_code(inconclusive_ok))


def show(result: object, inconclusive_ok: bool = False) -> None:
    """The final table: every measurement, then the first bad version (or why there is none), the closing line
    (`inconclusive_ok`: the command was given --inconclusive-ok) and the diagnosis."""
    from rich.table import Table
    from rich.text import Text

    from orchestrator.flow import bisect as search

    assert isinstance(result, search.Result)
    metric = search.metric_of(result.plan.metric)
    table = Table(title=Text(f"mbx bisect {result.plan.key}"), title_justify="left")
    for column in ("#", "version", "role", "repeats", f"{metric.label} mean ± 95% CI", "vs good"):
        table.add_column(column)
    for m in result.measurements:
        table.add_row(str(m.index), Text(m.label), m.role, str(m.repeats), search.fmt_mean(m),
                      Text(search.fmt_verdict(m), style=_STYLE.get(m.verdict, "")))  # fmt: skip
    console().print(table)
    from orchestrator.judge.closing import closing_text

    console().print(closing_text(result.outcome(), inconclusive_ok), soft_wrap=True)
    for line in result.diagnosis:
        console().print(Text(f"  diagnosis: {line}"), soft_wrap=True)
