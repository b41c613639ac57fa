"""GitHub-flavoured Markdown of user text and figures: text that renders literally, code spans, descriptions,
counts and loss ranges (the summary's sections and the orchestrator's Markdown use them)."""

from __future__ import annotations

import re
from typing import Any

from reports import secrets
from reports.site_format import DASH, code_spans, fmt_number
from reports.views import PointView

VERDICT_TEXT = {"pass": "✅ pass", "fail": "❌ fail", "inconclusive": "⚠️ inconclusive", "none": DASH}

_SPECIAL = re.compile(r"([\\`*\[\]<>|~#])")
_LONE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # intraword _ never emphasises


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _one_line(value: Any) -> str:
    """Whitespace and control-character runs (newlines too) as one space; secrets masked (reports.secrets)."""
    return secrets.mask(" ".join(_CONTROL.sub(" ", str(value)).split()))


def md_text(value: Any) -> str:
    """Plain text that renders literally in GFM, also inside a table cell."""
    text = _one_line(value)
    text = text.replace("&", "&amp;")
    text = _SPECIAL.sub(r"\\\1", text)
    return _LONE_UNDERSCORE.sub(r"\\_", text)


def md_code(value: Any, table: bool = False) -> str:
    """An inline code span that survives backticks in the value (and pipes, inside a table cell)."""
    text = _one_line(value)
    if table:  # GFM splits table cells before code spans: a pipe needs its backslash even there
        text = text.replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _plain(text: str) -> str:
    """md_text keeping one space where `text` starts or ends with whitespace (text between code spans)."""
    inner = md_text(text)
    if not inner:
        return " " if text else ""
    return (" " if text[0].isspace() else "") + inner + (" " if text[-1].isspace() else "")


def md_description(value: Any) -> str:
    """A description as one paragraph: its `code spans` kept as code (they render their content literally),
    everything else as plain text; no escaped backticks."""
    parts = code_spans(_one_line(value))
    return "".join(md_code(text) if code else _plain(text) for code, text in parts).strip()


def md_loss(point: PointView) -> str:
    """A point's loss, first → last (its repeats' means)."""
    first, last = point.mean("first_loss"), point.mean("last_loss")
    if first is None and last is None:
        return DASH
    return f"{fmt_number(first, 4, False)} → {fmt_number(last, 4, False)}"


_ORDER = "pass fail inconclusive none completed failed timeout cancelled preempted running submitted pending".split()


def md_counts(items: list[str]) -> str:
    """'3 pass, 1 fail': known names in a fixed order, others after them alphabetically."""
    counted: dict[str, int] = {}
    for item in items:
        counted[item] = counted.get(item, 0) + 1
    rank = {name: i for i, name in enumerate(_ORDER)}
    ordered = sorted(counted, key=lambda name: (rank.get(name, len(rank)), name))
    return ", ".join(f"{counted[name]} {name}" for name in ordered)
