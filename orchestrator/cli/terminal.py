"""What the CLI prints through: Rich consoles made on first use (Rich stays off `mbx --help`), JSON output,
and the one factory of noun apps (plain help, no pretty exceptions)."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console


def noun_app(help: str) -> typer.Typer:
    """A noun's Typer app: `mbx NOUN` alone prints its help; plain Click help (no Rich: fast, one look)."""
    return typer.Typer(no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False, add_completion=False,
                       help=help)  # fmt: skip


@cache
def console(stderr: bool = False, soft_wrap: bool = False) -> Console:
    """stdout's (or stderr's) console: user text is never read as markup, emoji or highlighted."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, markup=False, emoji=False, soft_wrap=soft_wrap)


def err(soft_wrap: bool = False) -> Console:
    """stderr's console: progress and notes when stdout carries a result (JSON, Markdown)."""
    return console(True, soft_wrap)


def say(text: str, style: str = "", *, stderr: bool = False) -> None:
    """One line of plain user text (never interpreted as markup), optionally styled."""
    from rich.text import Text

    console(stderr).print(Text(text, style=style))


def emit_json(payload: Any) -> None:
    """The result as JSON on stdout (indent 2; values JSON cannot hold, such as paths, as strings)."""
    typer.echo(json.dumps(payload, indent=2, default=str))


def json_result(
    payload: Callable[[dict[str, Any], int, typer.Exit | None], Any],
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command that prints progress (campaign run, resume, regate) a `--json` option: with it, what the
    command prints goes to stderr, and `payload(its arguments, its exit code, the typer.Exit it raised or None)`
    is printed as JSON on stdout before it exits with that code (the Exit may carry what the command said, e.g.
    its closing line). The command's own body is unchanged."""
    import functools
    import inspect

    from orchestrator.cli.options import JsonOpt

    def wrap(command: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(command)
        def wrapper(*args: Any, as_json: bool = False, **kwargs: Any) -> None:
            if not as_json:
                return command(*args, **kwargs)
            import contextlib
            import sys

            code, exited = 0, None
            with contextlib.redirect_stdout(sys.stderr):
                try:
                    command(*args, **kwargs)
                except typer.Exit as done:
                    code, exited = done.exit_code, done
            emit_json(payload(kwargs, code, exited))
            raise typer.Exit(code)

        signature = inspect.signature(command, eval_str=True)  # Typer reads annotations from it
        extra = inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=JsonOpt)
        wrapper.__signature__ = signature.replace(parameters=[*signature.parameters.values(), extra])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {**command.__annotations__, "as_json": JsonOpt}
        return wrapper

    return wrap
