"""Numerics parity: a parity campaign's toggle matrix (one row per pair, a verdict per metric) and its pairs' figures."""

from __future__ import annotations

from typing import Any

from reports.index_data import IndexPage, counts
from reports.index_sections import Section, register
from reports.markdown_text import md_code, md_counts, md_text
from reports.parity_figures import parity_figures, parity_rows
from reports.site_data import SiteExtras
from reports.views import CampaignView


def _parity_head(view: CampaignView, extras: SiteExtras) -> str:
    """The parity part of the campaign's outcome (orchestrator/judge/outcome.py), in bold; without it (a summary
    rendered from a view alone) the pairs counted, with no verdict of its own."""
    part = ((extras.outcome or {}).get("parts") or {}).get("parity")
    if part:
        return f"**{md_text(part['text'])}**"
    counts = md_counts([p["verdict"] for p in view.parity])
    return f"{len(view.parity)} pair(s): {md_text(counts)}"


def _parity_section(view: CampaignView, extras: SiteExtras) -> list[str]:
    """The toggle matrix: one row per on/off pair, one column per metric (verdict, max |Δ|, first step exceeded)."""
    if not view.parity:
        return []
    columns, rows = parity_rows(view)
    icon = {"pass": "✅", "fail": "❌", "inconclusive": "⚠️"}
    out = ["", "### Numerics parity", "", _parity_head(view, extras), "", "| pair (off → on) | combination | repeat | "
           "verdict | " + " | ".join(md_code(c, table=True) for c in columns) + " |",
           "|---|---|--:|---|" + "---|" * len(columns)]  # fmt: skip
    for row in rows:
        pair = row["pair"]
        cells = [
            f"{icon.get(c['verdict'], '')} {md_text(c['verdict'])} {md_text(c['text'])}".strip()
            + (f" (tol. {md_text(c['tolerance'])})" if c["tolerance"] else "")
            for c in row["cells"]
        ]
        verdict = f"{icon.get(pair['verdict'], '')} {md_text(pair['verdict'])}"
        out.append(
            f"| {md_text(pair['title'])} | {md_text(pair['label'])} | {pair['repeat']} | {verdict} | "
            + " | ".join(cells)
            + " |"
        )
    failed = [p for p in view.parity if p["verdict"] != "pass"]
    out += [""] + [
        f"- {md_text(p['verdict'])}: {md_text(p['title'])} [{md_text(p['label'])}]: {md_text(p['reason'])}"
        for p in failed
    ]
    return out


@register
class Parity(Section):
    name = "parity"
    order = 20  # a parity campaign leads with its parity table
    summary_order = 20

    def applies(self, page: IndexPage) -> bool:
        return bool(page.view.parity)

    def context(self, page: IndexPage) -> dict[str, Any]:
        view = page.view
        return {"view": view, "parity": parity_rows(view), "parity_figures": parity_figures(view),
                "parity_head": ((page.extras.outcome or {}).get("parts") or {}).get("parity"),
                "parity_counts": counts([p["verdict"] for p in view.parity])}  # fmt: skip

    def summary(self, page: IndexPage) -> list[str]:
        lead = _parity_section(page.view, page.extras)  # a parity campaign leads with what it is for
        return [*lead[1:], ""] if lead else []
