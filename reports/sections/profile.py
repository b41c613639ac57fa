"""Where the time goes: GPU time by kernel class of each profiled cell (reports/profile_view.py), when one has a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reports.index_data import IndexPage
from reports.index_sections import Section, register
from reports.site_data import knob_label
from reports.site_format import fmt_param


def profile_html(page: IndexPage) -> str:
    """The stacked bars of GPU time by kernel class per profiled cell, or "" (none, or no profile reader)."""
    view = page.view
    cells = [{"label": knob_label(c, view.axes, fmt_param), "run_dir": Path(c.run_dir)} for c in view.cells
             if c.run_dir]  # fmt: skip
    if not cells:
        return ""  # nothing to read: the trace readers are not even imported
    try:
        from reports.profile_view import profile_section
    except ImportError:
        return ""
    return profile_section(cells)


@register
class Profile(Section):
    name = "profile"
    order = 80
    nav = "Where the time goes"

    def applies(self, page: IndexPage) -> bool:
        page.memo[self.name] = profile_html(page)
        return bool(page.memo[self.name])

    def context(self, page: IndexPage) -> dict[str, Any]:
        return {"profile_html": page.memo[self.name]}
