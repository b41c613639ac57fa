"""The text of `mbx campaign plan`: one aligned row per cell, plain text (never markup), fast for 10,000 cells."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len

from orchestrator.errors import printable
from orchestrator.sweep import Point


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


def plan_text(name: str, points: Sequence[Point], keys: Sequence[str]) -> str:
    """The plan table: #, cell id, one column per swept key, world size; the title names the campaign."""
    header = ["#", "cell id", *(shown(key) for key in keys), "world"]
    rows = [
        [str(index), point.cell_id, *(shown(point.params.get(k, _ABSENT)) for k in keys), str(point.world_size)]
        for index, point in enumerate(points, 1)
    ]
    widths = [max(_width(row[col]) for row in (header, *rows)) for col in range(len(header))]
    right = {0, len(header) - 1}  # numbers align right

    def line(row: list[str]) -> str:
        cells = []
        for col, (text, width) in enumerate(zip(row, widths, strict=True)):
            pad = " " * (width - _width(text))
            cells.append(pad + text if col in right else text + pad)
        return "  ".join(cells).rstrip()

    rule = "  ".join("─" * width for width in widths)
    body = "\n".join(line(row) for row in rows)
    return f"{shown(name)}: {len(points)} cell(s)\n{line(header)}\n{rule}\n{body}"
