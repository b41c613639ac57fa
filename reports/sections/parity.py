"""Numerics parity: a parity campaign's toggle matrix (one row per pair, a verdict per metric) and its pairs' figures."""

from __future__ import annotations

from typing import Any

from reports.index_data import IndexPage, counts
from reports.index_sections import Section, register
from reports.parity_figures import parity_figures, parity_rows


@register
class Parity(Section):
    name = "parity"
    order = 20  # a parity campaign leads with its parity table

    def applies(self, page: IndexPage) -> bool:
        return bool(page.view.parity)

    def context(self, page: IndexPage) -> dict[str, Any]:
        view = page.view
        return {"view": view, "parity": parity_rows(view), "parity_figures": parity_figures(view),
                "parity_head": ((page.extras.outcome or {}).get("parts") or {}).get("parity"),
                "parity_counts": counts([p["verdict"] for p in view.parity])}  # fmt: skip
