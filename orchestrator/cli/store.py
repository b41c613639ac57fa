"""`mbx store ...`: look after the workspace's run store (rebuild it from the run directories)."""

from __future__ import annotations

from orchestrator.cli.options import DEFAULT_WORKSPACE, JsonOpt, WorkspaceOpt
from orchestrator.cli.terminal import emit_json, err, noun_app, say

app = noun_app(
    "Look after the run store (mbx.sqlite) of a workspace: rebuild.\n\nExample: mbx store rebuild -w mbx-workspace"
)


@app.command()
def rebuild(workspace: WorkspaceOpt = DEFAULT_WORKSPACE, as_json: JsonOpt = False) -> None:
    """Rebuild a lost or damaged run store from <campaign>/campaign.json and the run directories.

    Attempts keep their numbers; results are collected again from the run dirs.

    A campaign whose campaign.json is damaged or missing is taken from the old store, else rebuilt from its run
    directories alone (what they cannot tell is said). Memory estimates, search trials and parity verdicts are
    carried over from the old store when it can be read.

    The old store is kept aside as mbx.sqlite.damaged-<time>, never deleted. Refused while any campaign of the
    workspace runs; no campaign starts until the rebuild ends. --json prints the same as JSON (warnings stay
    on stderr).

    Example: mbx store rebuild --workspace mbx-workspace
    """
    from rich.text import Text

    from orchestrator.run.rebuild import rebuild as rebuild_store

    done = rebuild_store(workspace)
    for problem in done.problems:
        err().print(Text(f"warning: {problem}"))
    if as_json:
        emit_json({"store": str(done.store), "notes": list(done.notes), "kept_aside": [str(p) for p in done.kept_aside],
                   "campaigns": [{"name": n, "cells": c, "attempts": a} for n, c, a in done.campaigns]})  # fmt: skip
        return
    for note in done.notes:
        say(note)
    for path in done.kept_aside:
        say(f"kept aside: {path}")
    for name, cells, attempts in done.campaigns:
        say(f"  {name}: {cells} cell(s), {attempts} attempt(s)")
    say(f"rebuilt {done.store} ({len(done.campaigns)} campaign(s))", style="bold green")
