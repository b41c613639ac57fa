"""The points table: one row per point (its repeats listed), sortable, with baseline deltas and memory estimates
when given, and the infeasible points that were not run."""

from __future__ import annotations

from typing import Any

from reports.gates import CONFIDENCE
from reports.index_data import IndexPage
from reports.index_sections import Section, register
from reports.markdown_text import VERDICT_TEXT, md_code, md_loss, md_text
from reports.site_data import point_memory, short_axis_names
from reports.site_format import DASH, fmt_number, fmt_param, point_name
from reports.views import CampaignView, PointView

EAGER_ROWS = 100  # table rows laid out with the page; the rest join it from a <template> once it has loaded


def _memory(point: PointView) -> str:
    value, kind = point_memory(point)
    return fmt_number(value, 2) + (" RSS" if kind == "rss" and value is not None else "")


def _points_table(view: CampaignView, best: PointView | None) -> list[str]:
    """One row per point: a point of several repeats shows their count and the means of the completed ones."""
    with_repeats = any(len(p.repeats) > 1 for p in view.points)
    head = (
        ["point"] + (["repeats"] if with_repeats else []) + [md_text(a) for a in short_axis_names(view.axes)]
    )
    head += ["state", "TFLOP/s/GPU", "step ms", "peak mem GiB", "loss first → last", "verdict"]
    align = ["---"] * (1 + with_repeats + len(view.axes)) + ["---", "--:", "--:", "--:", "---", "---"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for point in view.points:
        ident = md_code(point_name(point), table=True)
        values = [f"**{ident}** ★" if point is best else ident] + (
            [point.repeat_count] if with_repeats else []
        )
        values += [md_text(fmt_param(point.params[a])) if a in point.params else DASH for a in view.axes]
        values += [
            md_text(point.state),
            fmt_number(point.mean("tflops_per_gpu"), 1),
            fmt_number(point.mean("step_time_ms"), 1),
            _memory(point),
            md_loss(point),
            VERDICT_TEXT.get(point.verdict, md_text(point.verdict)),
        ]
        lines.append("| " + " | ".join(values) + " |")
    return lines


@register
class Cells(Section):
    name = "cells"
    order = 60
    summary_order = 60
    nav = "Points"
    nav_order = 45  # first in the nav

    def context(self, page: IndexPage) -> dict[str, Any]:
        view, extras = page.view, page.extras
        known = {p.point_id for p in view.points}
        infeasible = [r for r in extras.estimates if r.get("feasible") is False and r.get("point_id") not in known]  # fmt: skip
        return {"view": view, "extras": extras, "rows": list(page.point_rows.values()), "eager_rows": EAGER_ROWS,
                "estimates": bool(page.estimates), "infeasible": infeasible, "fmt_number": fmt_number,
                "confidence": f"{CONFIDENCE:.0%}"}  # fmt: skip

    def summary(self, page: IndexPage) -> list[str]:
        return ["", "### Points", ""] + _points_table(page.view, page.best)
