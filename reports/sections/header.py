"""The index's header: the campaign's name, its outcome as the closing line says it, its description and facts."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from reports.index_data import IndexPage, counts
from reports.index_sections import Section, register
from reports.markdown_text import md_code, md_counts, md_description, md_text
from reports.site_data import SiteExtras
from reports.site_format import code_spans, fmt_number, fmt_param
from reports.views import CampaignView


def outcome_badge(extras: SiteExtras) -> dict[str, str] | None:
    """The campaign's outcome as the closing line says it (the orchestrator's, orchestrator/judge/outcome.py):
    its verdict, its word and the rest of the line; None for a page rendered without it."""
    if not extras.outcome:
        return None
    word, _, text = str(extras.outcome.get("closing", "")).partition(" ")
    return {"verdict": str(extras.outcome.get("verdict")), "word": word, "text": text}


def _outcome(extras: SiteExtras) -> list[str]:
    """The campaign's outcome as the closing line says it (given by the orchestrator), in bold with its icon."""
    if not extras.outcome:
        return []
    word, _, text = str(extras.outcome.get("closing", "")).partition(" ")
    icon = {"pass": "✅", "fail": "❌"}.get(str(extras.outcome.get("verdict")), "⚠️")
    return [f"{icon} **{md_text(word)}** {md_text(text)}", ""]


def _head(view: CampaignView) -> list[str]:
    """The summary's title, description and facts."""
    out = [f"## mbx campaign {md_code(view.name)}", ""]
    if view.description.strip():
        out += [md_description(view.description), ""]
    meta = [f"window: last {view.window} steps"]
    if view.source_file:
        meta.insert(0, f"source: {md_code(view.source_file)}")
    if view.generated_at:
        meta.append(f"generated: {md_text(view.generated_at)}")
    if view.baseline:
        meta.append(f"baseline: {md_code(view.baseline)}")
    out.append(" · ".join(meta) + "\\")  # a backslash at the end of a line is a GFM hard break
    out += [
        f"cells: {len(view.cells)} ({md_text(md_counts([c.state for c in view.cells]))}) · points: {len(view.points)}",
        "",
    ]
    return out


@register
class Header(Section):
    name = "header"
    order = 0
    summary_order = 0

    def context(self, page: IndexPage) -> dict[str, Any]:
        view = page.view
        return {
            "view": view, "extras": page.extras, "outcome": outcome_badge(page.extras),
            "description": code_spans(view.description), "fmt_number": fmt_number,
            "generated_at": view.generated_at or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "gates": [(k, fmt_param(v)) for k, v in view.gates.items()],
            "states": counts([c.state for c in view.cells]), "verdicts": counts([p.verdict for p in view.points]),
        }  # fmt: skip

    def summary(self, page: IndexPage) -> list[str]:
        return _head(page.view) + _outcome(page.extras)  # the closing line's word first
