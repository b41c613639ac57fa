"""A search's trials: every trial run with its rung, run length and verdict against its rung's leader."""

from __future__ import annotations

from typing import Any

from reports.index_data import IndexPage
from reports.index_sections import Section, register
from reports.site_rows import trial_table


@register
class Trials(Section):
    name = "trials"
    order = 40

    def applies(self, page: IndexPage) -> bool:
        return bool(page.extras.trials)

    def context(self, page: IndexPage) -> dict[str, Any]:
        return {"trials": trial_table(page.extras.trials, page.point_hrefs)}
