"""GitHub-flavoured Markdown summary of a campaign, to paste into a pull request; deterministic for golden tests."""

from __future__ import annotations

import re
from typing import Any

from reports import secrets
from reports.index_data import differing_keys, fingerprint_groups, pick_best
from reports.parity_figures import parity_rows
from reports.site_data import SiteExtras, point_baseline, point_memory, relative, short_axis_names
from reports.site_format import (
    DASH,
    code_spans,
    failed_messages,
    fmt_number,
    fmt_param,
    point_name,
    unchecked_messages,
)
from reports.views import CampaignView, PointView

VERDICT_TEXT = {"pass": "✅ pass", "fail": "❌ fail", "inconclusive": "⚠️ inconclusive", "none": DASH}

_SPECIAL = re.compile(r"([\\`*\[\]<>|~#])")
_LONE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # intraword _ never emphasises


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _one_line(value: Any) -> str:
    """Whitespace and control-character runs (newlines too) as one space; secrets masked (reports.secrets)."""
    return secrets.mask(" ".join(_CONTROL.sub(" ", str(value)).split()))


def md_text(value: Any) -> str:
    """Plain text that renders literally in GFM, also inside a table cell."""
    text = _one_line(value)
    text = text.replace("&", "&amp;")
    text = _SPECIAL.sub(r"\\\1", text)
    return _LONE_UNDERSCORE.sub(r"\\_", text)


def md_code(value: Any, table: bool = False) -> str:
    """An inline code span that survives backticks in the value (and pipes, inside a table cell)."""
    text = _one_line(value)
    if table:  # GFM splits table cells before code spans: a pipe needs its backslash even there
        text = text.replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _plain(text: str) -> str:
    """md_text keeping one space where `text` starts or ends with whitespace (text between code spans)."""
    inner = md_text(text)
    if not inner:
        return " " if text else ""
    return (" " if text[0].isspace() else "") + inner + (" " if text[-1].isspace() else "")


def md_description(value: Any) -> str:
    """A description as one paragraph: its `code spans` kept as code (they render their content literally),
    everything else as plain text; no escaped backticks."""
    parts = code_spans(_one_line(value))
    return "".join(md_code(text) if code else _plain(text) for code, text in parts).strip()


def _loss(point: PointView) -> str:
    first, last = point.mean("first_loss"), point.mean("last_loss")
    if first is None and last is None:
        return DASH
    return f"{fmt_number(first, 4, False)} → {fmt_number(last, 4, False)}"


_ORDER = "pass fail inconclusive none completed failed timeout cancelled preempted running submitted pending".split()


def _counts(items: list[str]) -> str:
    """'3 pass, 1 fail': known names in a fixed order, others after them alphabetically."""
    counted: dict[str, int] = {}
    for item in items:
        counted[item] = counted.get(item, 0) + 1
    rank = {name: i for i, name in enumerate(_ORDER)}
    ordered = sorted(counted, key=lambda name: (rank.get(name, len(rank)), name))
    return ", ".join(f"{counted[name]} {name}" for name in ordered)


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
            _loss(point),
            VERDICT_TEXT.get(point.verdict, md_text(point.verdict)),
        ]
        lines.append("| " + " | ".join(values) + " |")
    return lines


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


def _parity_head(view: CampaignView, extras: SiteExtras) -> str:
    """The parity part of the campaign's outcome (orchestrator/judge/outcome.py), in bold; without it (a summary
    rendered from a view alone) the pairs counted, with no verdict of its own."""
    part = ((extras.outcome or {}).get("parts") or {}).get("parity")
    if part:
        return f"**{md_text(part['text'])}**"
    counts = _counts([p["verdict"] for p in view.parity])
    return f"{len(view.parity)} pair(s): {md_text(counts)}"


def _parity_section(view: CampaignView, extras: SiteExtras) -> list[str]:
    """The toggle matrix: one row per on/off pair, one column per metric (verdict, max |Δ|, first step exceeded)."""
    if not view.parity:
        return []
    columns, rows = parity_rows(view)
    icon = {"pass": "✅", "fail": "❌", "inconclusive": "⚠️"}
    out = ["", "### Numerics parity", "", _parity_head(view, extras), "", "| pair (off → on) | combination | repeat | "
           "verdict | " + " | ".join(md_code(c, table=True) for c in columns) + " |",
           "|---|---|--:|---|" + "---|" * len(columns)]  # fmt: skip
    for row in rows:
        pair = row["pair"]
        cells = [
            f"{icon.get(c['verdict'], '')} {md_text(c['verdict'])} {md_text(c['text'])}".strip()
            + (f" (tol. {md_text(c['tolerance'])})" if c["tolerance"] else "")
            for c in row["cells"]
        ]
        verdict = f"{icon.get(pair['verdict'], '')} {md_text(pair['verdict'])}"
        out.append(
            f"| {md_text(pair['title'])} | {md_text(pair['label'])} | {pair['repeat']} | {verdict} | "
            + " | ".join(cells)
            + " |"
        )
    failed = [p for p in view.parity if p["verdict"] != "pass"]
    out += [""] + [
        f"- {md_text(p['verdict'])}: {md_text(p['title'])} [{md_text(p['label'])}]: {md_text(p['reason'])}"
        for p in failed
    ]
    return out


def _damaged_section(view: CampaignView) -> list[str]:
    """Run-directory files that could not be read (the stored results above are still shown)."""
    damaged = [(cell, note) for cell in view.cells for note in cell.damaged]
    if not damaged:
        return []
    return ["", "### Damaged run-directory files", ""] + [
        f"- {md_code(cell.cell_id)}: {md_text(note)}" for cell, note in damaged
    ]


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


def _memory(point: PointView) -> str:
    value, kind = point_memory(point)
    return fmt_number(value, 2) + (" RSS" if kind == "rss" and value is not None else "")


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
        f"- Loss: {_loss(best)}; skipped={skipped}, NaN={nans}",
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


def _validation(view: CampaignView) -> list[str]:
    gates = ", ".join(md_code(f"{k}={fmt_param(v)}") for k, v in view.gates.items()) or "none configured"
    verdicts = md_text(_counts([p.verdict for p in view.points]))
    return [
        "",
        "### Validation",
        "",
        f"- Gates: {gates}",
        f"- Verdicts (per point, from all its repeats): {verdicts}",
    ]


def _rejected(extras: SiteExtras) -> list[str]:
    out = ["", "### Rejected experiments", ""]
    if not extras.rejected:
        return out + ["None recorded."]
    return out + [f"- {md_code(r.get('point_id', ''))} [{md_text(r.get('label', ''))}] ({md_text(r.get('kind', ''))}): "
                  f"{md_text(r.get('why', ''))}" for r in extras.rejected]  # fmt: skip


def _outcome(extras: SiteExtras) -> list[str]:
    """The campaign's outcome as the closing line says it (given by the orchestrator), in bold with its icon."""
    if not extras.outcome:
        return []
    word, _, text = str(extras.outcome.get("closing", "")).partition(" ")
    icon = {"pass": "✅", "fail": "❌"}.get(str(extras.outcome.get("verdict")), "⚠️")
    return [f"{icon} **{md_text(word)}** {md_text(text)}", ""]


def markdown_summary(view: CampaignView, extras: SiteExtras | None = None) -> str:
    """The campaign as GFM in a performance PR's shape: Frozen configuration, Performance result, Validation
    (gates, failed and inconclusive points), Rejected experiments; then the point table, parity, environment."""
    extras = extras or SiteExtras()
    best, how = pick_best(view, extras)
    out = [f"## mbx campaign {md_code(view.name)}", ""]
    if view.description.strip():
        out += [md_description(view.description), ""]
    meta = [f"window: last {view.window} steps"]
    if view.source_file:
        meta.insert(0, f"source: {md_code(view.source_file)}")
    if view.generated_at:
        meta.append(f"generated: {md_text(view.generated_at)}")
    if view.baseline:
        meta.append(f"baseline: {md_code(view.baseline)}")
    out.append(" · ".join(meta) + "\\")  # a backslash at the end of a line is a GFM hard break
    out += [
        f"cells: {len(view.cells)} ({md_text(_counts([c.state for c in view.cells]))}) · points: {len(view.points)}",
        "",
    ]
    out += _outcome(extras)  # the closing line's word first
    lead = _parity_section(view, extras)  # a parity campaign leads with what it is for
    out += [*lead[1:], ""] if lead else []
    out += _frozen(view, best, how, extras)
    out += _performance(view, best, extras)
    out += _validation(view)
    out += _gate_sections(view)
    out += _rejected(extras)
    out += ["", "### Points", ""] + _points_table(view, best)
    out += _damaged_section(view)
    out += _environment(view)
    return "\n".join(out) + "\n"
