"""The summary's validation: the gates, the points' verdicts, whether the printed TFLOP/s/GPU agrees with mbx's own
FLOPs count, and each failed or inconclusive point with why (the page shows these in its header, banners and points
table)."""

from __future__ import annotations

from reports import flops_check
from reports.index_data import IndexPage
from reports.index_sections import Section, register
from reports.markdown_text import md_code, md_counts, md_text
from reports.site_format import failed_messages, fmt_param, point_name, unchecked_messages
from reports.views import CampaignView, PointView


def _validation(view: CampaignView) -> list[str]:
    gates = ", ".join(md_code(f"{k}={fmt_param(v)}") for k, v in view.gates.items()) or "none configured"
    verdicts = md_text(md_counts([p.verdict for p in view.points]))
    return [
        "",
        "### Validation",
        "",
        f"- Gates: {gates}",
        f"- Verdicts (per point, from all its repeats): {verdicts}",
        *_flops_lines(view),
    ]


def _flops_lines(view: CampaignView) -> list[str]:
    """The printed TFLOP/s/GPU against mbx's own count: one line for the cells that agree, one per cell that does not
    (nothing where mbx has no count)."""
    agreed = flops_check.agreement_line(view.cells)
    lines = [f"- {md_text(agreed)}"] if agreed else []
    return lines + [f"- {md_code(c.cell_id)}: {md_text(f.note())}" for c, f in flops_check.disagreements(view.cells)]


def _point_ref(point: PointView) -> str:
    ident = md_code(point_name(point))
    repeats = f"; {point.repeat_count} repeats" if len(point.repeats) > 1 else ""
    return f"{ident} ({md_text(point.label)}{repeats})" if point.label or repeats else ident


def _gate_sections(view: CampaignView) -> list[str]:
    out: list[str] = []
    failed = [p for p in view.points if failed_messages(p)]
    if failed:
        out += ["", "### Failed gates", ""]
        for point in failed:
            classes = sorted({c.failure_class for c in point.repeats if c.failure_class})
            extra = f" (class {', '.join(md_code(c) for c in classes)})" if classes else ""
            for message in failed_messages(point):
                out.append(f"- {_point_ref(point)}: {md_text(message)}{extra}")
    inconclusive = [p for p in view.points if p.verdict == "inconclusive"]
    if inconclusive:
        out += ["", "### Inconclusive", ""]
        for point in inconclusive:
            reasons = "; ".join(md_text(m) for m in unchecked_messages(point)) or "no reason recorded"
            out.append(f"- {_point_ref(point)}: {reasons}")
    return out


@register
class Validation(Section):
    name = "validation"
    order = None  # the Markdown summary only
    summary_order = 40

    def summary(self, page: IndexPage) -> list[str]:
        return _validation(page.view) + _gate_sections(page.view)
