"""The rejected experiments: each point the verdicts ruled out of "best", and why."""

from __future__ import annotations

from typing import Any

from reports.index_data import IndexPage
from reports.index_sections import Section, register
from reports.markdown_text import md_code, md_text
from reports.site_data import SiteExtras


def _rejected(extras: SiteExtras) -> list[str]:
    out = ["", "### Rejected experiments", ""]
    if not extras.rejected:
        return out + ["None recorded."]
    return out + [f"- {md_code(r.get('point_id', ''))} [{md_text(r.get('label', ''))}] ({md_text(r.get('kind', ''))}): "
                  f"{md_text(r.get('why', ''))}" for r in extras.rejected]  # fmt: skip


@register
class Rejected(Section):
    name = "rejected"
    order = 50
    summary_order = 50
    nav = "Rejected"

    def context(self, page: IndexPage) -> dict[str, Any]:
        return {"extras": page.extras, "point_hrefs": page.point_hrefs}

    def summary(self, page: IndexPage) -> list[str]:
        return _rejected(page.extras)
