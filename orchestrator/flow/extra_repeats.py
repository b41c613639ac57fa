"""Extra repeats stay active when a campaign file is run again; the cells a rerun sets aside are named.

Extra repeats are repeat cells beyond the file's `sweep.repeats`, as `mbx compare --until-conclusive` adds them
(orchestrator/flow/interleave.py).

A stored active cell is an extra repeat when its repeat index is at least the `sweep.repeats` of the campaign as
stored (the file never asked for it) and its point is in the file's plan: same point id, so the same resolved
recipe, resources and environment (orchestrator/spec/sweep.py's digest). Such cells are registered again after the
plan's cells, their results counted with the point's other repeats, unless the file now asks for fewer repeats than
before (then the user cut the repeats: nothing extra is kept). Every other active stored cell the plan lacks (a
point changed or removed, fewer repeats) is set aside: inactive, its results kept in the store, and the run names
it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from orchestrator.run.store import CellRow, read_only

SHOWN = 6  # cell ids named in a line


def kept_repeats(
    workspace: Path, name: str, cells: list[CellRow], repeats: int
) -> tuple[list[CellRow], list[str]]:
    """The planned `cells` (the file's `repeats` per point) with the stored campaign's extra repeats of their points
    after them (renumbered), and the lines saying what is kept and what is set aside. Reads the store read-only;
    nothing stored: as given."""
    with read_only(workspace) as store:
        record = store.campaign(name) if store is not None else None
        stored = store.cells(name) if store is not None and record is not None else []
    if record is None:
        return cells, []
    asked = int(((record.get("spec") or {}).get("sweep") or {}).get("repeats") or 1)
    planned = {c.cell_id for c in cells}
    points = {c.point_id for c in cells}
    unplanned = [c for c in stored if c.cell_id not in planned]
    extra = [c for c in unplanned if c.point_id in points and c.repeat >= asked] if repeats >= asked else []
    aside = [c for c in unplanned if c not in extra]
    start = max((c.ordinal for c in cells), default=-1) + 1
    kept = [dataclasses.replace(c, ordinal=start + i) for i, c in enumerate(extra)]
    lines = []
    if kept:
        lines.append(f"kept {len(kept)} extra repeat(s) beyond sweep.repeats ({asked}) of points still in the file "
                     f"(added by `mbx compare --until-conclusive`): {_ids(kept)}")  # fmt: skip
    if aside:
        lines.append(f"set aside {len(aside)} stored cell(s) the file no longer has (a point changed or removed, "
                     f"or fewer repeats): {_ids(aside)}; inactive, their results stay in the store")  # fmt: skip
    return cells + kept, lines


def _ids(cells: list[CellRow]) -> str:
    shown = ", ".join(c.cell_id for c in cells[:SHOWN])
    return shown + (f", … ({len(cells) - SHOWN} more)" if len(cells) > SHOWN else "")
