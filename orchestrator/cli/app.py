"""The `mbx` command: Typer root app, sub-apps joined with add_typer, and clean error exits."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console
from rich.text import Text

from orchestrator.cli import bisect as cli_bisect
from orchestrator.cli import campaign as cli_campaign
from orchestrator.cli import card as cli_card
from orchestrator.cli import compare as cli_compare
from orchestrator.cli import freeze as cli_freeze
from orchestrator.cli import golden as cli_golden
from orchestrator.cli import ingest as cli_ingest
from orchestrator.cli import profile as cli_profile
from orchestrator.cli import report as cli_report
from orchestrator.cli import store as cli_store
from orchestrator.errors import ConfigError, MbxError, printable
from reports.limits import LimitError

app = typer.Typer(
    name="mbx",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    help=(
        "Benchmark campaigns for Megatron-style MoE training.\n\n"
        "Define a campaign (a base recipe plus sweeps of knobs), run every point locally or on Slurm, "
        "collect last-10-step TFLOP/s/GPU, step time, memory and loss, gate them and write a report.\n\n"
        "Start here:  mbx campaign run campaigns/quickstart.yaml"
    ),
)
app.add_typer(cli_campaign.app, name="campaign")
app.command("report")(cli_report.report)
app.command("ingest")(cli_ingest.ingest)
app.command("compare")(cli_compare.compare)
app.command("bisect")(cli_bisect.bisect)
app.add_typer(cli_report.schema_app, name="schema")
app.add_typer(cli_store.app, name="store")
app.add_typer(cli_golden.app, name="golden")
app.add_typer(cli_card.app, name="card")
app.command("freeze")(cli_freeze.freeze)
app.add_typer(cli_profile.app, name="profile")

err_console = Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)
MAX_ERRORS = 50  # problems printed per error; MBX_MAX_ERRORS=N prints more (0: all)
MAX_LINE = 2000  # characters of one problem line printed (the rest is cut with "…")


def shown_problems(lines: list[str], limit: int = MAX_ERRORS) -> list[str]:
    """The first `limit` problem lines (each on one line, cut at MAX_LINE characters), then a count of the rest."""
    shown = [printable(line) for line in lines[: limit or None]]
    shown = [line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + "…" for line in shown]
    if limit and len(lines) > limit:
        shown.append(f"… and {len(lines) - limit:,} more problem(s) (MBX_MAX_ERRORS=0 shows every one)")
    return shown


def _error_limit() -> int:
    value = os.environ.get("MBX_MAX_ERRORS", "")
    return int(value) if value.isdigit() else MAX_ERRORS


def main() -> None:
    """Entry point: run the app; MbxError → one message per problem on stderr (the first MAX_ERRORS) and
    its exit code."""
    try:
        app()
    except (MbxError, LimitError) as caught:
        if os.environ.get("MBX_DEBUG") == "1":
            raise
        err = caught if isinstance(caught, MbxError) else ConfigError(str(caught))  # an input over a limit
        for line in shown_problems(err.lines(), _error_limit()):
            err_console.print(Text.assemble(("error: ", "bold red"), line))
        if err.exit_code == 2:
            err_console.print(Text("(set MBX_DEBUG=1 for a traceback)", style="dim"))
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
