"""Formatting and file writing shared by the report site's pages and the Markdown summary: numbers, swept values,
gate messages, the Jinja environment (autoescape on) and whole-or-nothing file writes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from reports import secrets
from reports.metrics import finite
from reports.views import PointView
from trainer import atomic

TEMPLATE_DIR = Path(__file__).parent / "templates"


DASH = "—"


def fmt_number(value: Any, digits: int = 1, thousands: bool = True) -> str:
    """A finite number with fixed decimals ('—' for None, NaN, inf or a non-number).

    Values too small to show at that precision (CPU-sized TFLOP/s) get 3 significant digits instead of 0.0.
    """
    if not finite(value):
        return DASH
    if value != 0 and abs(value) < 0.5 * 10**-digits:
        return f"{value:.3g}"
    return f"{value:,.{digits}f}" if thousands else f"{value:.{digits}f}"


def fmt_param(value: Any) -> str:
    """A swept value as the user wrote it: strings bare, everything else as JSON (true, null, 1.25)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):  # e.g. a circular structure
        return str(value)


def failed_messages(point: PointView) -> list[str]:
    """Messages of the checks the point failed (over all its repeats)."""
    return [c.message for c in point.gate.failed] if point.gate is not None else []


def unchecked_messages(point: PointView) -> list[str]:
    """Messages of the checks that could not decide (why a point's verdict is inconclusive)."""
    return [c.message for c in point.gate.unchecked] if point.gate is not None else []


def point_name(point: PointView) -> str:
    """A point of one repeat by its cell id, else by its point id."""
    return point.repeats[0].cell_id if len(point.repeats) == 1 else point.point_id


def _masked(value: Any) -> Any:
    """A value as a page shows it, any secret in a string masked (reports.secrets). Markup (the figures' JSON,
    HTML built by the site) is not rescanned: it is built from the same values, and its size makes a scan slow."""
    return secrets.mask(value) if isinstance(value, str) and not hasattr(value, "__html__") else value


def environment(more: list[str] | None = None) -> Any:
    """The Jinja environment of the site's templates (then those in the folders `more`): autoescape on, undefined
    names are errors, every shown value's secrets masked."""
    import jinja2

    return jinja2.Environment(
        finalize=_masked,
        loader=jinja2.FileSystemLoader([str(TEMPLATE_DIR), *(more or [])]),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def atomic_copy(source: Path, target: Path) -> None:
    """copy2 through a temporary file: a full disk leaves the old file (or none), never half of one."""
    atomic.copy_file(source, target)


def atomic_write(path: Path, text: str) -> None:
    """Write `text` through a temporary file renamed over `path`: readers see the old or the new file, whole."""
    atomic.write_text(path, text, errors="replace")  # lone surrogates


_CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)


def code_spans(text: str) -> list[tuple[bool, str]]:
    """A description split into (is code, text) parts: `code spans` (any fence length) and the text between."""
    parts: list[tuple[bool, str]] = []
    last = 0
    for match in _CODE_SPAN.finditer(text):
        parts += [(False, text[last : match.start()]), (True, match.group(2))]
        last = match.end()
    parts.append((False, text[last:]))
    return [(code, part) for code, part in parts if part]
