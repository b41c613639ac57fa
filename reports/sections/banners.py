"""The index's warnings under its header: cells of different environments, damaged run directories, nothing done."""

from __future__ import annotations

from typing import Any

from reports.index_data import IndexPage
from reports.index_sections import Section, register


@register
class Banners(Section):
    name = "banners"
    order = 10

    def context(self, page: IndexPage) -> dict[str, Any]:
        groups, _, differs = page.environments
        cells = page.view.cells
        return {"fp_groups": groups, "fp_differs": differs, "damaged": [c for c in cells if c.damaged],
                "completed": sum(1 for c in cells if c.state == "completed")}  # fmt: skip
