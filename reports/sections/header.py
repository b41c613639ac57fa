"""The index's header: the campaign's name, its outcome as the closing line says it, its description and facts."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from reports.index_data import IndexPage, counts
from reports.index_sections import Section, register
from reports.site_data import SiteExtras
from reports.site_format import code_spans, fmt_number, fmt_param


def outcome_badge(extras: SiteExtras) -> dict[str, str] | None:
    """The campaign's outcome as the closing line says it (the orchestrator's, orchestrator/judge/outcome.py):
    its verdict, its word and the rest of the line; None for a page rendered without it."""
    if not extras.outcome:
        return None
    word, _, text = str(extras.outcome.get("closing", "")).partition(" ")
    return {"verdict": str(extras.outcome.get("verdict")), "word": word, "text": text}


@register
class Header(Section):
    name = "header"
    order = 0

    def context(self, page: IndexPage) -> dict[str, Any]:
        view = page.view
        return {
            "view": view, "extras": page.extras, "outcome": outcome_badge(page.extras),
            "description": code_spans(view.description), "fmt_number": fmt_number,
            "generated_at": view.generated_at or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "gates": [(k, fmt_param(v)) for k, v in view.gates.items()],
            "states": counts([c.state for c in view.cells]), "verdicts": counts([p.verdict for p in view.points]),
        }  # fmt: skip
