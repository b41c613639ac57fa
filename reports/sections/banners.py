"""The index's warnings under its header: cells of different environments, damaged run directories, a printed
TFLOP/s/GPU mbx's own FLOPs count does not confirm, nothing done."""

from __future__ import annotations

from typing import Any

from reports.flops_check import disagreements
from reports.index_data import IndexPage
from reports.index_sections import Section, register
from reports.markdown_text import md_code, md_text
from reports.views import CampaignView


def _damaged_section(view: CampaignView) -> list[str]:
    """Run-directory files that could not be read (the stored results above are still shown)."""
    damaged = [(cell, note) for cell in view.cells for note in cell.damaged]
    if not damaged:
        return []
    return ["", "### Damaged run-directory files", ""] + [
        f"- {md_code(cell.cell_id)}: {md_text(note)}" for cell, note in damaged
    ]


@register
class Banners(Section):
    name = "banners"
    order = 10
    summary_order = 70  # after the points table

    def context(self, page: IndexPage) -> dict[str, Any]:
        groups, _, differs = page.environments
        cells = page.view.cells
        return {"fp_groups": groups, "fp_differs": differs, "damaged": [c for c in cells if c.damaged],
                "completed": sum(1 for c in cells if c.state == "completed"),
                "flops": [(c, f, page.hrefs.get(c.cell_id)) for c, f in disagreements(cells)]}  # fmt: skip

    def summary(self, page: IndexPage) -> list[str]:
        return _damaged_section(page.view)
