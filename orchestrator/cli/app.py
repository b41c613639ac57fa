"""The `mbx` command: the root app (one sub-app per noun, loaded when named), and clean error exits."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

import typer
from typer.core import TyperGroup

from orchestrator.errors import EXIT_BAD_INPUT, EXIT_FAIL, ConfigError, MbxError, printable

if TYPE_CHECKING:
    import click


class Noun(NamedTuple):
    module: str  # orchestrator/cli/<module>.py, whose `app` holds the noun's actions
    help: str  # the one line `mbx --help` shows
    group: bool = True  # `mbx NOUN ACTION ...`; False: the noun has one action (`mbx compare A B`)


# The grammar: `mbx NOUN [ACTION] [CAMPAIGN] [OPTIONS]`. A noun with several actions is a group
# (`mbx campaign run FILE`); a noun with one action takes its arguments directly (`mbx compare A B`).
NOUNS: dict[str, Noun] = {
    "campaign": Noun("campaign", "Define, check and run campaigns: validate, plan, run, resume, regate, status, "
                                 "cancel, list."),  # fmt: skip
    "compare": Noun("compare", "Compare two campaigns (or golden-values files) metric by metric: SAME / "
                               "DIFFERENT / UNKNOWN.", group=False),  # fmt: skip
    "bisect": Noun("bisect", "Find the first version (commit, image, pip version, env value) that changes a "
                             "metric.", group=False),  # fmt: skip
    "freeze": Noun("freeze", "Freeze the winner of a campaign with its evidence (recipe, campaign, FROZEN.md).",
                   group=False),  # fmt: skip
    "report": Noun("report", "Write a campaign's report site and its Markdown summary.", group=False),
    "card": Noun("card", "Model verification cards: export, validate, check."),
    "golden": Noun("golden", "Megatron-LM golden-values files: export."),
    "ingest": Noun("ingest", "Bring past Megatron-LM / Megatron-Bridge logs into the run store.", group=False),
    "store": Noun("store", "Look after the run store (mbx.sqlite) of a workspace: rebuild."),
    "profile": Noun("profile", "Profiler traces: where the time of profiled steps went (show)."),
    "schema": Noun("schema", "Print JSON Schemas of mbx files: campaign, recipe."),
}


class Nouns(TyperGroup):
    """The root group: lists the nouns from NOUNS and imports a noun's module only when it is named."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(NOUNS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        noun = NOUNS.get(cmd_name)
        if noun is None:
            return None
        module = importlib.import_module(f"orchestrator.cli.{noun.module}")
        command = typer.main.get_group(module.app) if noun.group else typer.main.get_command(module.app)
        command.name = cmd_name
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, noun.help) for name, noun in NOUNS.items()])


app = typer.Typer(
    name="mbx",
    cls=Nouns,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def root() -> None:
    """Benchmark campaigns for Megatron-style MoE training.

    Define a campaign (a base recipe plus sweeps of knobs), run every point locally or on Slurm, collect
    last-10-step TFLOP/s/GPU, step time, memory and loss, gate them and write a report.

    \b
    Grammar: mbx NOUN [ACTION] CAMPAIGN [OPTIONS]; one meaning per option everywhere:
    --workspace/-w (or MBX_WORKSPACE), --point/-p, --out/-o (the path written: FILE,
    or DIR for several files), --file/-f, --launcher/-l, --parallel/-j, --markdown/-m,
    --min-effect and --margin (percents), and --json on every command that prints a
    result. Exit codes: 0 ok, 1 failed, 2 bad input, 3 inconclusive.

    Example: mbx campaign run campaigns/quickstart.yaml
    """


MAX_ERRORS = 50  # problems printed per error; MBX_MAX_ERRORS=N prints more (0: all)
MAX_LINE = 2000  # characters of one problem line printed (the rest is cut with "…")
DEBUG_HINT = "(set MBX_DEBUG=1 for a traceback)"


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


def _print_error(lines: list[str], hint: bool) -> None:
    from rich.text import Text

    from orchestrator.cli.terminal import err

    for line in shown_problems(lines, _error_limit()):
        err(soft_wrap=True).print(Text.assemble(("error: ", "bold red"), line))
    if hint:  # only where there is a traceback worth showing: a bug, or a failure with an underlying cause
        err(soft_wrap=True).print(Text(DEBUG_HINT, style="dim"))


def run(cli: Any, args: list[str] | None = None) -> None:
    """Run a Typer app with mbx's exits: MbxError -> one line per problem (the first MAX_ERRORS) and its exit
    code (an input over a limit, a run-dir file a newer mbx wrote: exit 2); bad input (exit 2) without the MBX_DEBUG hint; an unexpected exception (a bug) -> one line, the hint,
    exit 1. MBX_DEBUG=1 lets every exception through with its traceback."""
    debug = os.environ.get("MBX_DEBUG") == "1"
    try:
        cli(args=args)
    except Exception as caught:  # noqa: BLE001 - mbx's errors, inputs over a limit, and bugs
        if debug:
            raise
        from reports.limits import LimitError  # here, not at import: `mbx --help` stays small
        from trainer.rundir import NewerFormat  # a run dir a newer mbx wrote: bad input for this one

        error = ConfigError(str(caught)) if isinstance(caught, (LimitError, NewerFormat)) else caught
        if not isinstance(error, MbxError):  # a bug in mbx: say what, point at the traceback
            _print_error([f"internal error: {type(caught).__name__}: {caught}"], hint=True)
            sys.exit(EXIT_FAIL)
        _print_error(error.lines(), hint=error.exit_code != EXIT_BAD_INPUT and caught.__cause__ is not None)
        sys.exit(error.exit_code)


def main() -> None:
    """Entry point (`mbx`, `python -m orchestrator`)."""
    run(app)


if __name__ == "__main__":
    main()
