"""Parity and grad-norm spikes in verdicts and reports: the spike gate, pair verdicts through the store's `parity`
table, the toggle matrix and overlaid curves on the HTML page (real headless Chromium, no console errors) and in
Markdown, user text escaped."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from report_fixtures import step_rows
from test_report_page import console_messages, needs_chromium, parse, render_in_chromium

from orchestrator.judge.parity_verdicts import PairVerdict, judge_parity
from orchestrator.run.store import CellRow, Store
from orchestrator.spec.parity import Parity
from reports.gates import GateSpec, evaluate
from reports.markdown import markdown_summary
from reports.numerics import grad_norm_spikes, step_events
from reports.page import render_report, write_report
from reports.views import CampaignView, CellView
from reports.window import summarize

EVIL = "<img src=x onerror=alert(1)>|*x*`"


def curve_rows(
    seed: int, spike_at: int | None = None, offset: float = 0.0, steps: int = 40
) -> list[dict[str, Any]]:
    """Step rows with a noisy grad norm (a 5× spike at `spike_at`), an eval every 10 steps and a warm-up of 4."""
    rng = np.random.default_rng(seed)
    rows = step_rows(steps=steps)
    for row in rows:
        step = row["step"]
        row["grad_norm"] = float(1.0 + 0.05 * rng.standard_normal()) * (5.0 if step == spike_at else 1.0)
        row["loss"] = 5.0 - 0.02 * step + offset * step
        row["lr"] = 3e-4 * min(step, 4) / 4 * (1 - step / 100)
        if step % 10 == 0:
            row["eval_loss"] = row["loss"] + 0.1
    return rows


def test_spike_gate_names_the_step_and_the_eval_before_it():
    rows = curve_rows(1, spike_at=21)
    assert (
        step_events(rows)[20] == "eval at step 20" and step_events(rows)[4] == "LR-schedule change at step 4"
    )
    spikes = grad_norm_spikes(rows)
    assert [(s.step, s.preceded_by) for s in spikes] == [(21, ("eval at step 20",))]
    result = evaluate(GateSpec(grad_norm_spikes_max=0), summarize(rows), spikes=spikes)
    (check,) = [c for c in result.checks if c.gate == "grad_norm_spikes_max"]
    assert result.verdict == "fail" and check.value == 1.0
    assert (
        "1 spike(s): step 21 (z " in check.message
        and "after eval at step 20) is above the maximum 0" in check.message
    )
    calm = curve_rows(1)
    assert (
        evaluate(GateSpec(grad_norm_spikes_max=0), summarize(calm), spikes=grad_norm_spikes(calm)).verdict
        == "pass"
    )
    unread = evaluate(GateSpec(grad_norm_spikes_max=0), summarize(calm), spikes=None)
    assert unread.verdict == "inconclusive"  # a curve that was not read is never a pass


def _cells() -> list[CellRow]:
    params = [("off", "single"), ("on", "discrete"), ("lone", "single")]
    return [CellRow(campaign="p", cell_id=cid, point_id=cid, repeat=0, ordinal=i, label=EVIL,
                    params={"model.moe.expert_weights": w, "training.seed": EVIL if cid != "lone" else 2},
                    recipe={}, resources={}, env={}) for i, (cid, w) in enumerate(params)]  # fmt: skip


def verdicts() -> tuple[list[PairVerdict], dict[str, list[dict[str, Any]]]]:
    parity = Parity.model_validate({"toggle": {"model.moe.expert_weights": ["single", "discrete"]},
                                    "metrics": {"loss": {"max_abs": 1.05e-3}}})  # fmt: skip
    rows = {"off": curve_rows(1), "on": curve_rows(1, spike_at=31, offset=1e-4), "lone": curve_rows(3)}
    return judge_parity(parity, _cells(), lambda cell: (rows[cell.cell_id], "")), rows


def test_pair_verdicts_round_trip_through_the_store(tmp_path: Path):
    pairs, _ = verdicts()
    failed = next(p for p in pairs if p.on_cell == "on")
    assert failed.verdict == "fail"
    loss = next(m for m in failed.metrics if m.metric == "loss")
    assert loss.first_exceeded == 11 and math.isclose(
        loss.max_abs, 40e-4
    )  # 1e-4 × step leaves the band at 11
    assert next(p for p in pairs if p.off_cell == "lone").verdict == "inconclusive"
    with Store(tmp_path / "ws") as store:
        store.record_parity("p", [p.to_dict() for p in pairs])
        stored = store.parity("p")
    assert [PairVerdict.from_dict(d) for d in stored] == pairs
    assert stored[0]["tolerances"]["loss"] == {
        "exact": False,
        "max_abs": 1.05e-3,
        "max_rel": None,
        "trend": True,
    }
    with Store(tmp_path / "ws") as store:  # replaced as a whole, per campaign
        store.record_parity("p", [])
        assert store.parity("p") == []


def parity_view() -> CampaignView:
    pairs, rows = verdicts()
    cells = [CellView(cell_id=c.cell_id, point_id=c.point_id, repeat=0, label=EVIL, params=c.params,
                      state="completed", attempt=1, summary=summarize(rows[c.cell_id]), rows=rows[c.cell_id],
                      gate=evaluate(GateSpec(grad_norm_spikes_max=0), summarize(rows[c.cell_id]),
                                    spikes=grad_norm_spikes(rows[c.cell_id])))
             for c in _cells()]  # fmt: skip
    view = CampaignView(name="parity-report", description=EVIL, axes=["model.moe.expert_weights", "training.seed"],
                        cells=cells, gates={"grad_norm_spikes_max": 0}, window=10,
                        generated_at="2026-12-03T12:00:00Z")  # fmt: skip
    view.parity = [p.to_dict() for p in pairs]
    return view


def test_toggle_matrix_in_html_and_markdown_with_user_text_escaped():
    view = parity_view()
    dom = parse(render_report(view))
    table = dom.by_id("parity-matrix")
    assert table is not None
    rows = {r.attrs["data-pair"]: r for r in table.find_all("tr") if "data-pair" in r.attrs}
    failed = rows["toggle:off:on"]
    assert failed.attrs["data-verdict"] == "fail"
    loss = failed.find_all("td", data_metric="loss")[0]
    assert loss.attrs["data-verdict"] == "fail" and "max |Δ| 0.004, from step 11" in loss.text()
    assert "tolerance: max_abs 0.00105, no growth" in loss.text()
    assert "tolerance: bitwise" in failed.find_all("td", data_metric="grad_norm")[0].text()
    assert EVIL in failed.find_all("td", data_col="combination")[0].text()  # shown as text, not markup
    assert rows["toggle:lone:-"].attrs["data-verdict"] == "inconclusive"
    assert not dom.find_all("img")
    md = markdown_summary(view)
    assert "### Numerics parity" in md and "from step 11 (tol. max_abs 0.00105, no growth)" in md
    assert "<img" not in md.replace("\\<img", "") and "\\<img src=x onerror=alert(1)\\>\\|\\*x\\*\\`" in md


@needs_chromium
def test_parity_page_renders_in_chromium(tmp_path: Path):
    view = parity_view()
    dom, stderr = render_in_chromium(write_report(view, tmp_path / "report"), tmp_path / "profile")
    assert console_messages(stderr) == []
    figures = {f.attrs["id"]: f for f in dom.find_all("div", cls="figure")}
    assert {"fig-parity-0", "fig-grad-norm", "fig-loss"} <= set(figures)
    for fig in figures.values():
        assert "js-plotly-plot" in fig.classes and fig.find_all("svg", cls="main-svg"), fig.attrs["id"]
    parity_fig = figures["fig-parity-0"]
    legend = [t.text() for t in parity_fig.find_all("text", cls="legendtext")]
    assert legend == ["loss off", "loss on", "tolerance band", "eval step", "first step outside"]  # a Δ row per metric
    grad = figures["fig-grad-norm"]
    assert "spike" in [t.text() for t in grad.find_all("text", cls="legendtext")]
    assert "(1 spike(s) marked)" in grad.find_all("text", cls="gtitle")[0].text()
    assert not dom.find_all("img")
