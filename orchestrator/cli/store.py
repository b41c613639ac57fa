"""`mbx store ...`: look after the workspace's run store (rebuild it from the run directories)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.text import Text

from orchestrator.cli.options import DEFAULT_WORKSPACE, WorkspaceOpt

app = typer.Typer(no_args_is_help=True, help="Look after the run store (mbx.sqlite) of a workspace.")
console = Console(highlight=False, markup=False, emoji=False)
err_console = Console(stderr=True, highlight=False, markup=False, emoji=False)


@app.command()
def rebuild(workspace: WorkspaceOpt = DEFAULT_WORKSPACE) -> None:
    """Rebuild a lost or damaged run store from <campaign>/campaign.json and the run directories.

    Attempts keep their numbers; results are collected again from the run dirs.

    A campaign whose campaign.json is damaged or missing is taken from the old store, else rebuilt from its run
    directories alone (what they cannot tell is said). Memory estimates, search trials and parity verdicts are
    carried over from the old store when it can be read.

    The old store is kept aside as mbx.sqlite.damaged-<time>, never deleted. Refused while any campaign of the
    workspace runs; no campaign starts until the rebuild ends.
    """
    from orchestrator.run.rebuild import rebuild as rebuild_store

    done = rebuild_store(workspace)
    for problem in done.problems:
        err_console.print(Text(f"warning: {problem}"))
    for note in done.notes:
        console.print(Text(note))
    for path in done.kept_aside:
        console.print(Text(f"kept aside: {path}"))
    for name, cells, attempts in done.campaigns:
        console.print(Text(f"  {name}: {cells} cell(s), {attempts} attempt(s)"))
    console.print(
        Text.assemble(("rebuilt ", "bold green"), f"{done.store} ({len(done.campaigns)} campaign(s))")
    )
