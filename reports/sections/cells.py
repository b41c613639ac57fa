"""The points table: one row per point (its repeats listed), sortable, with baseline deltas and memory estimates
when given, and the infeasible points that were not run."""

from __future__ import annotations

from typing import Any

from reports.gates import CONFIDENCE
from reports.index_data import IndexPage
from reports.index_sections import Section, register
from reports.site_format import fmt_number

EAGER_ROWS = 100  # table rows laid out with the page; the rest join it from a <template> once it has loaded


@register
class Cells(Section):
    name = "cells"
    order = 60
    nav = "Points"
    nav_order = 45  # first in the nav

    def context(self, page: IndexPage) -> dict[str, Any]:
        view, extras = page.view, page.extras
        known = {p.point_id for p in view.points}
        infeasible = [r for r in extras.estimates if r.get("feasible") is False and r.get("point_id") not in known]  # fmt: skip
        return {"view": view, "extras": extras, "rows": list(page.point_rows.values()), "eager_rows": EAGER_ROWS,
                "estimates": bool(page.estimates), "infeasible": infeasible, "fmt_number": fmt_number,
                "confidence": f"{CONFIDENCE:.0%}"}  # fmt: skip
