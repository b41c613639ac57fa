"""The text of `mbx campaign plan`: one aligned row per cell, plain text (never markup), fast for 10,000 cells."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len

from orchestrator.errors import printable
from orchestrator.run.feasibility import Assessment, PointFeasibility, problem_kind, summary_lines
from orchestrator.spec.sweep import Point


def _width(text: str) -> int:
    return len(text) if text.isascii() else cell_len(text)


MAX_VALUE_WIDTH = 40  # a longer value is cut with "…" (the whole value is in `plan --json`)
_ABSENT = "·"


def shown(value: Any) -> str:
    """A value as one printable line: control characters escaped (\\n, \\x1b), cut at MAX_VALUE_WIDTH."""
    text = printable(str(value))
    if len(text) > MAX_VALUE_WIDTH:
        text = text[: MAX_VALUE_WIDTH - 1] + "…"
    return text


def _gib(value: float | None) -> str:
    if value is None:
        return _ABSENT
    if abs(value) >= 1e5:
        return f"{value:.3g}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def estimate_cells(row: PointFeasibility | None, with_gpu: bool) -> list[str]:
    """A point's estimate columns: estimated peak GiB, (GPU, headroom GiB,) and ok / INFEASIBLE: why (memory,
    headroom gate, peak limit, a layout key; no headroom beside it, its reasons follow the table) / not
    estimated (a point whose settings give no estimate runs: only a layout rule could stop it)."""
    if row is None:
        return [_ABSENT] * (4 if with_gpu else 2)
    cells = [_gib(row.estimate_gib)]
    if with_gpu:
        cells += [shown(row.gpu or _ABSENT), _gib(row.headroom_gib if row.feasible else None)]
    if not row.feasible:
        why = ", ".join(dict.fromkeys(problem_kind(p) for p in row.problems))
        return [*cells, shown(f"INFEASIBLE: {why}" if why else "INFEASIBLE")]
    return [*cells, "ok" if row.estimate_gib is not None else "not estimated"]


def estimate_header(with_gpu: bool) -> list[str]:
    return ["est GiB", *(["gpu", "headroom"] if with_gpu else []), "feasible"]


def plan_text(
    name: str, points: Sequence[Point], keys: Sequence[str], assessment: Assessment | None = None
) -> str:
    """The plan table: #, cell id, one column per swept key, world size, and with an `assessment` each cell's
    estimated peak memory, headroom on its GPU and feasibility, then why each infeasible point is skipped."""
    by_point = assessment.by_point() if assessment else {}
    with_gpu = any(row.gpu for row in by_point.values())
    extra = estimate_header(with_gpu) if assessment else []
    header = ["#", "cell id", *(shown(key) for key in keys), "world", *extra]
    rows = [
        [str(index), point.cell_id, *(shown(point.params.get(k, _ABSENT)) for k in keys), str(point.world_size),
         *(estimate_cells(by_point.get(point.point_id), with_gpu) if assessment else [])]
        for index, point in enumerate(points, 1)
    ]  # fmt: skip
    table = _table(header, rows, right={0, len(keys) + 2, *_numeric(header)})
    lines = summary_lines(assessment) if assessment else []
    return "\n".join([f"{shown(name)}: {len(points)} cell(s)", table, *map(printable, lines)])


def estimate_text(assessment: Assessment) -> str:
    """One row per point: label, world size, estimated peak, GPU, headroom, feasible; then the infeasible
    points and why (the dry run's closing table)."""
    with_gpu = any(row.gpu for row in assessment.rows)
    header = ["point", "world", *estimate_header(with_gpu)]
    rows = [
        [shown(row.label), str(row.world_size), *estimate_cells(row, with_gpu)] for row in assessment.rows
    ]
    lines = summary_lines(assessment)
    title = "memory estimate per GPU" + (f" on {assessment.gpu}" if assessment.gpu else "")
    return "\n".join([title, _table(header, rows, right={1, *_numeric(header)}), *map(printable, lines)])


def _numeric(header: list[str]) -> set[int]:
    return {i for i, name in enumerate(header) if name in ("est GiB", "headroom")}


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> str:
    """Aligned columns (those in `right` flush right), a rule under the header."""
    widths = [max(_width(row[col]) for row in (header, *rows)) for col in range(len(header))]

    def line(row: list[str]) -> str:
        cells = []
        for col, (text, width) in enumerate(zip(row, widths, strict=True)):
            pad = " " * (width - _width(text))
            cells.append(pad + text if col in right else text + pad)
        return "  ".join(cells).rstrip()

    rule = "  ".join("─" * width for width in widths)
    body = "\n".join(line(row) for row in rows)
    return f"{line(header)}\n{rule}\n{body}"
