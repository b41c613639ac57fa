"""Shared CLI option types (Annotated aliases) so every command spells them the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DEFAULT_WORKSPACE = Path("mbx-workspace")

WorkspaceOpt = Annotated[
    Path,
    typer.Option(
        "--workspace",
        "-w",
        envvar="MBX_WORKSPACE",
        help="Directory holding the run store (mbx.sqlite), run dirs and reports.",
        show_default=True,
    ),
]
CampaignFileArg = Annotated[
    Path, typer.Argument(help="Campaign YAML file (see `mbx schema campaign`).", show_default=False)
]
CampaignNameArg = Annotated[
    str, typer.Argument(help="Campaign name, as in the file's `name:`.", show_default=False)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]
MaxCellsOpt = Annotated[
    int | None,
    typer.Option(
        "--max-cells",
        envvar="MBX_MAX_CELLS",
        min=1,
        help=(
            "Refuse a sweep of more cells than this, counted from axis lengths before anything is expanded "
            "[default: 10000]."
        ),
        show_default=False,
    ),
]
