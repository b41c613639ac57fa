"""Megatron-LM golden values on the login side: `mbx golden export` (a completed cell → golden JSON) and reading
a golden-values file with clean errors (for `mbx compare`).

The step rows come from the cell's latest completed attempt through `trainer.rundir.read_metrics_checked`; the
layout and the JSON are reports/parsers/golden.py's (`rows_layout`, `lm_document`), the reader's inverse.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.run.outfile import write_out
from orchestrator.run.store import CellRow, Store
from reports.parsers.golden import GoldenValues, lm_document, read_golden_values, rows_layout
from trainer import rundir


@dataclass
class Export:
    """What `export_golden` made: the golden document, the cell it came from and notes for the user."""

    document: dict[str, Any]
    cell_id: str
    run_dir: Path
    notes: list[str]


def load_golden(path: str | os.PathLike[str]) -> GoldenValues:
    """A golden-values file (Megatron-LM or Megatron-Bridge) with at least one value; any problem → UsageError."""
    path = Path(path)
    try:
        golden = read_golden_values(path)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such golden-values file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a golden-values file") from None
    except OSError as err:
        raise UsageError(f"{path}: unreadable ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text, not a golden-values file") from None
    except json.JSONDecodeError as err:
        raise UsageError(
            f"{path}: not JSON ({err.msg} at line {err.lineno}), not a golden-values file"
        ) from None
    except (ValueError, TypeError, AttributeError, RecursionError) as err:
        detail = str(err) if str(err).startswith(str(path)) else f"{path}: not a golden-values file ({err})"
        raise UsageError(detail) from None
    if not golden.rows:
        raise UsageError(f'{path}: a golden-values file without any value (every point is missing or "nan")')
    return golden


def _pick_cell(store: Store, campaign: str, ref: str) -> tuple[CellRow, Any, list[str]]:
    """The cell `ref` names (a cell id, or a point id: its first completed repeat) and its completed attempt."""
    cells = store.cells(campaign)
    chosen = [c for c in cells if c.cell_id == ref] or [c for c in cells if c.point_id == ref]
    if not chosen:
        points = sorted({c.point_id for c in cells})
        shown = ", ".join(points[:20]) + (f", … ({len(points)} points)" if len(points) > 20 else "")
        raise UsageError(
            f"--point {ref!r}: campaign {campaign!r} has no such point or cell (points: {shown or 'none'})"
        )
    latest = store.latest_attempts(campaign)
    done = [
        (c, latest[c.cell_id])
        for c in chosen
        if c.cell_id in latest and latest[c.cell_id].state == "completed"
    ]
    if not done:
        states = ", ".join(f"{c.cell_id}: {latest[c.cell_id].state if c.cell_id in latest else 'never run'}"
                           for c in chosen)  # fmt: skip
        raise UsageError(f"--point {ref!r}: no completed repeat to export ({states})")
    notes = []
    if len(done) > 1:
        notes.append(f"point {ref} has {len(done)} completed repeats; exported {done[0][0].cell_id} "
                     "(pass a cell id to --point to choose another)")  # fmt: skip
    return done[0][0], done[0][1], notes


def export_golden(workspace: Path, campaign: str, ref: str) -> Export:
    """The Megatron-LM golden values of a completed cell's step rows (its latest completed attempt)."""
    with Store(workspace, create=False) as store:
        if store.campaign(campaign) is None:
            known = ", ".join(store.campaign_names()) or "none"
            raise UsageError(f"campaign {campaign!r} is not in the store {store.path} (known: {known})")
        cell, attempt, notes = _pick_cell(store, campaign, ref)
    run_dir = Path(attempt.run_dir)
    rows, problem = rundir.read_metrics_checked(run_dir)
    if problem is not None:
        raise UsageError(problem)
    rows = [row for row in rows if isinstance(row.get("step"), int) and not isinstance(row["step"], bool)]
    layout = rows_layout(rows)
    if not layout:
        raise UsageError(f"{run_dir / rundir.METRICS}: no step rows with loss, step time or memory to export")
    golden = GoldenValues("megatron-lm", rows, layout=layout)
    return Export(lm_document(golden), cell.cell_id, run_dir, notes)


def write_document(document: dict[str, Any], out: Path, follow_symlinks: bool = False) -> None:
    """Write golden values as Megatron-LM does (indent 4), atomically, only over a regular file (outfile.py);
    a path that cannot be written → UsageError."""
    write_out(out, json.dumps(document, indent=4) + "\n", follow_symlinks=follow_symlinks)
