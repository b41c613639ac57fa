"""GitHub-flavoured Markdown summary of a campaign, to paste into a pull request; deterministic for golden tests."""

from __future__ import annotations

import re
from typing import Any

from reports.page import (
    DASH,
    differing_keys,
    fingerprint_groups,
    fmt_number,
    fmt_param,
    unchecked_messages,
    verdict_of,
)
from reports.views import CampaignView, CellView

VERDICT_TEXT = {"pass": "✅ pass", "fail": "❌ fail", "inconclusive": "⚠️ inconclusive", "none": DASH}

_SPECIAL = re.compile(r"([\\`*\[\]<>|~#])")
_LONE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # intraword _ never emphasises


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _one_line(value: Any) -> str:
    """Whitespace and control-character runs (newlines too) as one space."""
    return " ".join(_CONTROL.sub(" ", str(value)).split())


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


def _short_axis_names(axes: list[str]) -> list[str]:
    """Last dotted component of each axis where that is unambiguous, else the full key."""
    last = [a.rsplit(".", 1)[-1] for a in axes]
    return [short if last.count(short) == 1 else full for short, full in zip(last, axes, strict=True)]


def _loss(cell: CellView) -> str:
    s = cell.summary
    if s is None or (s.first_loss is None and s.last_loss is None):
        return DASH
    return f"{fmt_number(s.first_loss, 4, False)} → {fmt_number(s.last_loss, 4, False)}"


_ORDER = "pass fail inconclusive none completed failed timeout cancelled preempted running submitted pending".split()


def _counts(items: list[str]) -> str:
    """'3 pass, 1 fail': known names in a fixed order, others after them alphabetically."""
    counted: dict[str, int] = {}
    for item in items:
        counted[item] = counted.get(item, 0) + 1
    rank = {name: i for i, name in enumerate(_ORDER)}
    ordered = sorted(counted, key=lambda name: (rank.get(name, len(rank)), name))
    return ", ".join(f"{counted[name]} {name}" for name in ordered)


def _cells_table(view: CampaignView, best: CellView | None) -> list[str]:
    with_repeat = any(c.repeat for c in view.cells)
    head = ["cell"] + (["rep"] if with_repeat else []) + [md_text(a) for a in _short_axis_names(view.axes)]
    head += ["state", "TFLOP/s/GPU", "step ms", "peak alloc GiB", "loss first → last", "verdict"]
    align = ["---"] * (1 + with_repeat + len(view.axes)) + ["---", "--:", "--:", "--:", "---", "---"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for cell in view.cells:
        s = cell.summary
        cell_id = md_code(cell.cell_id, table=True)
        name = f"**{cell_id}** ★" if cell is best else cell_id
        values = [name] + ([str(cell.repeat)] if with_repeat else [])
        values += [md_text(fmt_param(cell.params[a])) if a in cell.params else DASH for a in view.axes]
        values += [
            md_text(cell.state),
            fmt_number(s.tflops_per_gpu if s else None, 1),
            fmt_number(s.step_time_ms if s else None, 1),
            fmt_number(s.peak_alloc_gib if s else None, 2),
            _loss(cell),
            VERDICT_TEXT.get(verdict_of(cell), md_text(verdict_of(cell))),
        ]
        lines.append("| " + " | ".join(values) + " |")
    return lines


def _cell_ref(cell: CellView) -> str:
    return f"{md_code(cell.cell_id)} ({md_text(cell.label)})" if cell.label else md_code(cell.cell_id)


def _gate_sections(view: CampaignView) -> list[str]:
    out: list[str] = []
    failed = [c for c in view.cells if c.gate is not None and c.gate.failed]
    if failed:
        out += ["", "### Failed gates", ""]
        for cell in failed:
            assert cell.gate is not None
            extra = f" (class {md_code(cell.failure_class)})" if cell.failure_class else ""
            for check in cell.gate.failed:
                out.append(f"- {_cell_ref(cell)}: {md_text(check.message)}{extra}")
    inconclusive = [c for c in view.cells if verdict_of(c) == "inconclusive"]
    if inconclusive:
        out += ["", "### Inconclusive", ""]
        for cell in inconclusive:
            reasons = "; ".join(md_text(m) for m in unchecked_messages(cell)) or "repeats disagree"
            out.append(f"- {_cell_ref(cell)}: {reasons}")
    return out


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


def markdown_summary(view: CampaignView) -> str:
    """The campaign as GFM: header, cell table, best cell, failed gates and the environment fingerprint."""
    best = view.best_cell()
    out = [f"## mbx campaign {md_code(view.name)}", ""]
    if view.description.strip():
        out += [md_text(view.description), ""]
    meta = [f"window: last {view.window} steps"]
    if view.source_file:
        meta.insert(0, f"source: {md_code(view.source_file)}")
    if view.generated_at:
        meta.append(f"generated: {md_text(view.generated_at)}")
    if view.baseline:
        meta.append(f"baseline: {md_code(view.baseline)}")
    out.append(" · ".join(meta) + "\\")  # a backslash at the end of a line is a GFM hard break
    out.append(
        f"cells: {len(view.cells)} ({md_text(_counts([c.state for c in view.cells]))}) · "
        f"verdicts: {md_text(_counts([verdict_of(c) for c in view.cells]))}\\"
    )
    gates = ", ".join(md_code(f"{k}={fmt_param(v)}") for k, v in view.gates.items()) or "none configured"
    out += [f"gates: {gates}", ""]
    if best is not None and best.summary is not None:
        s = best.summary
        out.append(
            f"**Best:** {_cell_ref(best)}: **{fmt_number(s.tflops_per_gpu, 1)} TFLOP/s/GPU**, "
            f"{fmt_number(s.step_time_ms, 1)} ms/step, peak {fmt_number(s.peak_alloc_gib, 2)} GiB allocated"
        )
    else:
        out.append("**Best:** none (no completed cell passed its gates with a TFLOP/s figure)")
    out.append("")
    out += _cells_table(view, best)
    out += _gate_sections(view)
    out += _environment(view)
    return "\n".join(out) + "\n"
