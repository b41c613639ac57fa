"""The best point (a search's result): its figures and verdict, how it was picked, or why there is none."""

from __future__ import annotations

from typing import Any

from reports.index_data import IndexPage
from reports.index_sections import Section, register
from reports.markdown_text import md_code, md_loss, md_text
from reports.site_data import SiteExtras, point_baseline, point_memory, relative
from reports.site_format import fmt_number, fmt_param, point_name
from reports.views import CampaignView, PointView


def _frozen(view: CampaignView, best: PointView | None, how: str, extras: SiteExtras) -> list[str]:
    """Frozen configuration: the winner, how it was picked (with its confidence), its swept knobs."""
    out = ["### Frozen configuration", ""]
    if best is None:
        note = extras.freeze_note or "no completed point passed its gates with a TFLOP/s figure"
        return out + [f"None yet: {md_text(note)}"]
    knobs = ", ".join(md_text(f"{a}={fmt_param(best.params[a])}") for a in view.axes if a in best.params)
    out += [f"- Point: **{md_code(point_name(best))}**" + (f" ({md_text(best.label)})" if best.label else ""),
            f"- Picked: {md_text(how)}", f"- Swept knobs: {knobs or 'the base recipe'}"]  # fmt: skip
    out.append(f"- Freeze it: {md_code('mbx freeze ' + view.name + ' --point ' + best.point_id)}")
    return out


def _performance(view: CampaignView, best: PointView | None, extras: SiteExtras) -> list[str]:
    """Performance result of the winner: window, averages, peak memory, loss range, skipped/NaN, baseline."""
    out = ["", "### Performance result", ""]
    if best is None or not best.completed:
        if any(p.completed for p in view.points):
            return out + ["No winner picked (see Frozen configuration): every completed point's figures are in the "
                          "table below."]  # fmt: skip
        return out + ["No completed point to report."]
    first = best.completed[0].summary
    skipped = sum(c.summary.skipped_iterations for c in best.completed)  # type: ignore[union-attr]
    nans = sum(c.summary.nan_iterations for c in best.completed)  # type: ignore[union-attr]
    mean = f", means of {len(best.completed)} repeats" if len(best.completed) > 1 else ""
    value, kind = point_memory(best)
    memory = (f"peak RSS {fmt_number(value, 2)} GiB (CPU run)" if kind == "rss" else
              f"allocated {fmt_number(value, 2)} GiB, reserved {fmt_number(best.mean('peak_reserved_gib'), 2)} GiB")  # fmt: skip
    out += [
        f"- Window: steps {first.window_first_step}–{first.window_last_step} ({first.window_steps} steps; the first "
        f"step never counts){mean}",  # type: ignore[union-attr]
        f"- Step time {fmt_number(best.mean('step_time_ms'), 1)} ms, **{fmt_number(best.mean('tflops_per_gpu'), 1)} "
        f"TFLOP/s/GPU**, {fmt_number(best.mean('tokens_per_s_per_gpu'), 0)} tokens/s/GPU",
        f"- Peak memory: {memory}",
        f"- Loss: {md_loss(best)}; skipped={skipped}, NaN={nans}",
    ]  # fmt: skip
    base = point_baseline(best, extras.baselines)
    if base is not None:
        tf, st = (
            relative(best.mean("tflops_per_gpu"), base.tflops_per_gpu),
            relative(best.mean("step_time_ms"), base.step_time_ms),
        )
        out.append(f"- Against the baseline {md_code(view.baseline or '')}: TFLOP/s/GPU "
                   f"{fmt_number(base.tflops_per_gpu, 1)} → {'—' if tf is None else f'{tf:+.2%}'}, step time "
                   f"{fmt_number(base.step_time_ms, 1)} ms → {'—' if st is None else f'{st:+.2%}'}")  # fmt: skip
    if extras.gpu_hours is not None:
        out.append(f"- GPU-hours for the campaign: {fmt_number(extras.gpu_hours, 2)}")
    return out


@register
class Best(Section):
    name = "best"
    order = 30
    summary_order = 30

    def context(self, page: IndexPage) -> dict[str, Any]:
        best = page.best
        return {"extras": page.extras, "trials": bool(page.extras.trials), "how": page.picked[1],
                "best": page.point_rows.get(best.point_id) if best is not None else None}  # fmt: skip

    def summary(self, page: IndexPage) -> list[str]:
        best, how = page.picked
        return _frozen(page.view, best, how, page.extras) + _performance(page.view, best, page.extras)
