"""The environment: each distinct environment the cells ran under, differing keys highlighted."""

from __future__ import annotations

from typing import Any

from reports.index_data import IndexPage, differing_keys, fingerprint_groups
from reports.index_sections import Section, register
from reports.markdown_text import md_code, md_text
from reports.views import CampaignView


def _environment(view: CampaignView) -> list[str]:
    groups, keys = fingerprint_groups(view.cells)
    if not groups:
        return ["", "### Environment", "", "No cell recorded an environment fingerprint."]
    differs = differing_keys(groups, keys)
    common = [k for k in keys if k not in differs]
    out = ["", "### Environment", ""]
    if not differs:
        line = ", ".join(f"{md_text(k)} {md_code(groups[0].values[k])}" for k in keys)
        out.append(f"Fingerprint (all {len(groups[0].cells)} cells that recorded one): {line}")
    else:
        out += [
            "> [!WARNING]",
            f"> Cells ran under {len(groups)} different environments, differing in "
            + ", ".join(md_text(k) for k in differs)
            + "; their numbers may not compare.",
        ]
        for index, group in enumerate(groups, 1):
            ids = ", ".join(md_code(c) for c in group.cells)
            values = ", ".join(f"{md_text(k)} {md_code(group.values[k])}" for k in differs)
            out.append(f"> - environment {index} ({ids}): {values}")
        if common:
            out += [
                "",
                "Common: " + ", ".join(f"{md_text(k)} {md_code(groups[0].values[k])}" for k in common),
            ]
    missing = [c.cell_id for c in view.cells if not c.fingerprint and c.state != "pending"]
    if missing:
        out += ["", "No fingerprint recorded for: " + ", ".join(md_code(c) for c in missing)]
    return out


@register
class Fingerprint(Section):
    name = "fingerprint"
    order = 90
    summary_order = 90
    nav = "Environment"

    def context(self, page: IndexPage) -> dict[str, Any]:
        groups, keys, differs = page.environments
        missing = [c.cell_id for c in page.view.cells if not c.fingerprint and c.state != "pending"]
        return {"fp_groups": groups, "fp_keys": keys, "fp_differs": differs, "fp_missing": missing}

    def summary(self, page: IndexPage) -> list[str]:
        return _environment(page.view)
