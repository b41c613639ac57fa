"""The best point (a search's result): its figures and verdict, how it was picked, or why there is none."""

from __future__ import annotations

from typing import Any

from reports.index_data import IndexPage
from reports.index_sections import Section, register


@register
class Best(Section):
    name = "best"
    order = 30

    def context(self, page: IndexPage) -> dict[str, Any]:
        best = page.best
        return {"extras": page.extras, "trials": bool(page.extras.trials), "how": page.picked[1],
                "best": page.point_rows.get(best.point_id) if best is not None else None}  # fmt: skip
