"""GitHub-flavoured Markdown summary of a campaign, to paste into a pull request: the parts of the index's sections
(reports/sections/) in their summary order; deterministic for golden tests."""

from __future__ import annotations

from reports import index_sections
from reports.index_data import IndexPage
from reports.markdown_text import VERDICT_TEXT, md_code, md_description, md_text
from reports.site_data import SiteExtras
from reports.views import CampaignView

# the GFM escaping, re-exported for the orchestrator
__all__ = ["VERDICT_TEXT", "markdown_summary", "md_code", "md_description", "md_text"]


def markdown_summary(view: CampaignView, extras: SiteExtras | None = None) -> str:
    """The campaign as GFM in a performance PR's shape: its header and outcome (a parity campaign's toggle matrix
    next), Frozen configuration, Performance result, Validation (gates, failed and inconclusive points), Rejected
    experiments; then the point table, damaged files and the environment."""
    page = IndexPage(view, extras or SiteExtras(), {})
    lines = [line for section in index_sections.summary_sections() for line in section.summary(page)]
    return "\n".join(lines) + "\n"
