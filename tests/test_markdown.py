"""Markdown summary: golden output for fixture campaigns, escaping checked with a CommonMark+table renderer."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from report_fixtures import campaign_view, empty_view, hostile_view, mismatched_view

from reports.markdown import markdown_summary, md_code, md_text

# Regenerate after an intended format change with:
#   PYTHONPATH=tests python -c "from report_fixtures import *; from reports.markdown import *; print(markdown_summary(mismatched_view()), end='')"
GOLDEN_MISMATCHED = r"""## mbx campaign `moe-dispatch`

Dispatcher SMs × expert capacity factor on 8×H200.

source: `campaigns/moe-dispatch.yaml` · window: last 10 steps · generated: 2026-12-02T12:00:00Z\
cells: 7 (5 completed, 1 failed, 1 pending) · points: 7

### Frozen configuration

- Point: **`c2b0`** (model.moe.capacity_factor=1.25, moe.dispatcher_sms=24)
- Picked: highest mean TFLOP/s/GPU among completed points that did not fail; not compared with confidence (mbx freeze compares)
- Swept knobs: model.moe.capacity_factor=1.25, moe.dispatcher_sms=24
- Freeze it: `mbx freeze moe-dispatch --point c2b0`

### Performance result

- Window: steps 11–20 (10 steps; the first step never counts)
- Step time 760.0 ms, **455.5 TFLOP/s/GPU**, 12,000 tokens/s/GPU
- Peak memory: allocated 62.00 GiB, reserved 60.00 GiB
- Loss: 10.5000 → 5.8864; skipped=0, NaN=0

### Validation

- Gates: `tflops_per_gpu_min=300.0`, `peak_alloc_gib_max=70.0`, `loss_finite=true`
- Verdicts (per point, from all its repeats): 3 pass, 3 fail, 1 none

### Failed gates

- `c3c0` (model.moe.capacity_factor=1.5, moe.dispatcher_sms=24): peak_alloc_gib_max: 75.25 GiB is above the maximum 70 GiB
- `c4d0` (model.moe.capacity_factor=1.5, moe.dispatcher_sms=32): tflops_per_gpu_min: 290 TFLOP/s is below the minimum 300 TFLOP/s
- `c4d0` (model.moe.capacity_factor=1.5, moe.dispatcher_sms=32): loss_finite: a non-finite loss was logged
- `c5e0` (model.moe.capacity_factor=2.0, moe.dispatcher_sms=32): run failed: CUDA out of memory on rank 3 (class `oom`)

### Rejected experiments

None recorded.

### Points

| point | capacity_factor | dispatcher_sms | state | TFLOP/s/GPU | step ms | peak mem GiB | loss first → last | verdict |
|---|---|---|---|--:|--:|--:|---|---|
| `c1a0` | 1.0 | 16 | completed | 410.0 | 820.0 | 50.00 | 10.5000 → 5.8864 | ✅ pass |
| `c1a1` | 1.0 | 16 | completed | 405.0 | 830.0 | 50.00 | 10.5000 → 5.8864 | ✅ pass |
| **`c2b0`** ★ | 1.25 | 24 | completed | 455.5 | 760.0 | 62.00 | 10.5000 → 5.8864 | ✅ pass |
| `c3c0` | 1.5 | 24 | completed | 470.0 | 740.0 | 75.25 | 10.5000 → 5.8864 | ❌ fail |
| `c4d0` | 1.5 | 32 | completed | 290.0 | 1,100.0 | 50.00 | 10.5000 → 5.8864 | ❌ fail |
| `c5e0` | 2.0 | 32 | failed | 300.0 | 800.0 | 50.00 | 10.5000 → 9.8795 | ❌ fail |
| `c6f0` | 2.0 | 16 | pending | — | — | — | — | — |

### Environment

> [!WARNING]
> Cells ran under 2 different environments, differing in driver, torch; their numbers may not compare.
> - environment 1 (`c1a0`, `c1a1`, `c3c0`, `c4d0`, `c5e0`): driver `580.82.07`, torch `2.11.0+cu130`
> - environment 2 (`c2b0`): driver `590.10`, torch `2.12.0+cu130`

Common: gpu_name `NVIDIA H200`, cuda `13.0`, transformer_engine `2.20.2`, nccl `2.27.3`, container_image `nvcr.io/nvidia/pytorch:26.01-py3`, git_sha `f9f0556`
"""

GOLDEN_EMPTY = r"""## mbx campaign `empty`

window: last 10 steps · generated: 2026-12-02T12:00:00Z\
cells: 3 (1 failed, 1 running, 1 pending) · points: 3

### Frozen configuration

None yet: no completed point passed its gates with a TFLOP/s figure

### Performance result

No completed point to report.

### Validation

- Gates: none configured
- Verdicts (per point, from all its repeats): 1 fail, 2 none

### Failed gates

- `e1` (x=1): run failed: node failure (class `infra`)

### Rejected experiments

None recorded.

### Points

| point | x | state | TFLOP/s/GPU | step ms | peak mem GiB | loss first → last | verdict |
|---|---|---|--:|--:|--:|---|---|
| `e1` | 1 | failed | — | — | — | — | ❌ fail |
| `e2` | 2 | pending | — | — | — | — | — |
| `e3` | 3 | running | 404.0 | 792.0 | 50.00 | 10.5000 → 10.1850 | — |

### Environment

No cell recorded an environment fingerprint.
"""


def _renderer() -> MarkdownIt:
    # CommonMark with raw HTML allowed (as GitHub passes a sanitized subset) plus GFM tables.
    return MarkdownIt("commonmark", {"html": True}).enable("table")


def test_golden_mismatched_campaign() -> None:
    assert markdown_summary(mismatched_view()) == GOLDEN_MISMATCHED


def test_golden_nothing_completed() -> None:
    assert markdown_summary(empty_view()) == GOLDEN_EMPTY


def test_deterministic() -> None:
    assert markdown_summary(campaign_view()) == markdown_summary(campaign_view())


def test_failed_gates_listed_with_messages() -> None:
    view = campaign_view()
    text = markdown_summary(view)
    section = text.split("### Failed gates", 1)[1].split("###", 1)[0]
    for cell in view.cells:
        for check in cell.gate.failed if cell.gate else []:
            lines = [ln for ln in section.splitlines() if ln.startswith(f"- `{cell.cell_id}` (")]
            assert any(md_text(check.message) in ln for ln in lines), (cell.cell_id, check.message)
    assert "CUDA out of memory on rank 3" in section and "`oom`" in section
    assert "[!WARNING]" not in text  # one environment


def test_table_renders_one_row_per_cell() -> None:
    view = campaign_view()
    html = _renderer().render(markdown_summary(view))
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body, flags=re.S)
    assert len(rows) == len(view.cells)
    header = html.split("<thead>", 1)[1].split("</thead>", 1)[0]
    width = header.count("<th")
    for row, cell in zip(rows, view.cells, strict=True):
        assert row.count("<td") == width
        assert f"<code>{cell.cell_id}</code>" in row
    best_row = rows[[c.cell_id for c in view.cells].index("c2b0")]
    assert "<strong><code>c2b0</code></strong> ★" in best_row


def test_hostile_values_render_as_text() -> None:
    view = hostile_view()
    view.cells[1].cell_id = "h|2`x"  # a pipe and a backtick inside a table cell's code span
    html = _renderer().render(markdown_summary(view))
    assert "<script" not in html and "<b>" not in html and "<a " not in html and "<i>" not in html
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body, flags=re.S)
    width = html.split("<thead>", 1)[1].split("</thead>", 1)[0].count("<th")
    assert [r.count("<td") for r in rows] == [width, width]
    assert "<code>h|2`x</code>" in rows[1]


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text).replace("&amp;", "&")


@given(st.text())
def test_md_text_round_trips_and_never_breaks_a_table(value: str) -> None:
    out = md_text(value)
    assert "\n" not in out and "\r" not in out
    assert _unescape(out) == " ".join(re.sub(r"[\x00-\x1f\x7f-\x9f]", " ", value).split())
    assert not re.search(r"(?<!\\)(?:\\\\)*[|<>`]", out.replace("\\\\", "")), out


@given(st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1).filter(lambda v: v.strip()))
def test_md_code_renders_the_value(value: str) -> None:
    normal = " ".join(value.split())
    html = _renderer().render("x " + md_code(value) + " y").strip()
    escaped = normal.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    assert html == f"<p>x <code>{escaped}</code> y</p>"
