"""The rejected experiments: each point the verdicts ruled out of "best", and why."""

from __future__ import annotations

from typing import Any

from reports.index_data import IndexPage
from reports.index_sections import Section, register


@register
class Rejected(Section):
    name = "rejected"
    order = 50
    nav = "Rejected"

    def context(self, page: IndexPage) -> dict[str, Any]:
        return {"extras": page.extras, "point_hrefs": page.point_hrefs}
