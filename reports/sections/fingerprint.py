"""The environment: each distinct environment the cells ran under, differing keys highlighted."""

from __future__ import annotations

from typing import Any

from reports.index_data import IndexPage
from reports.index_sections import Section, register


@register
class Fingerprint(Section):
    name = "fingerprint"
    order = 90
    nav = "Environment"

    def context(self, page: IndexPage) -> dict[str, Any]:
        groups, keys, differs = page.environments
        missing = [c.cell_id for c in page.view.cells if not c.fingerprint and c.state != "pending"]
        return {"fp_groups": groups, "fp_keys": keys, "fp_differs": differs, "fp_missing": missing}
