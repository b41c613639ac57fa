"""Verdicts that can be trusted: a missing baseline is bad input, inconclusive is never a pass (exit 3), a point is
judged from all its repeats (confidence interval), verdicts follow the gates (regate), messages show the digits."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from report_fixtures import step_rows

from reports.gates import GateSpec, Repeat, evaluate, judge_point
from reports.markdown import markdown_summary
from reports.page import render_report
from reports.views import CampaignView, CellView
from reports.window import summarize

FAKE = ROOT / "tests" / "fixtures_cmd" / "fake_megatron.py"
LOG = ROOT / "tests" / "data" / "megatron" / "logs" / "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"
TFLOPS = 349.4010104996984  # the replayed log's window TFLOP/s/GPU


def _summary(tflops: float, loss: float = 5.0):
    return replace(summarize(step_rows(tflops=tflops)), tflops_per_gpu=tflops, last_loss=loss)


def _repeats(*tflops: float) -> list[Repeat]:
    return [Repeat(f"repeat {i}", "completed", None, _summary(t)) for i, t in enumerate(tflops)]


# ---------------------------------------------------------------- judging (no processes)


def test_loss_message_shows_the_digits_that_differ():
    spec = GateSpec(loss_rel_baseline_tol=1e-6)
    result = evaluate(spec, _summary(400, loss=5.35812), baseline=_summary(400, loss=5.358155))
    (check,) = [c for c in result.checks if c.gate == "loss_rel_baseline_tol"]
    assert check.ok is False
    assert "|5.35812 − 5.358155| = 3.5e-05" in check.message, check.message


def test_bound_message_shows_the_digits_that_differ():
    result = evaluate(GateSpec(tflops_per_gpu_min=300.0), _summary(299.99))
    assert result.verdict == "fail"
    assert "299.99 TFLOP/s is below the minimum 300 TFLOP/s" in result.failed[0].message


def test_point_passes_fails_or_straddles_on_its_confidence_interval():
    spec = GateSpec(tflops_per_gpu_min=300.0)
    assert judge_point(spec, _repeats(320, 321, 322)).verdict == "pass"
    assert judge_point(spec, _repeats(280, 281, 282)).verdict == "fail"
    straddling = judge_point(spec, _repeats(296, 301, 306))
    assert straddling.verdict == "inconclusive"
    (check,) = straddling.unchecked
    assert check.low is not None and check.high is not None and check.low < 300 < check.high
    assert "mean 301" in check.message and "95% CI" in check.message and "3 repeats" in check.message
    assert "straddles the minimum 300" in check.message


def test_point_interval_is_scipy_student_t():
    from scipy import stats

    values = [296.0, 301.0, 306.0]
    (check,) = judge_point(GateSpec(tflops_per_gpu_min=300.0), _repeats(*values)).checks[:1]
    low, high = stats.t.interval(0.95, 2, loc=301.0, scale=stats.sem(values))
    assert check.low == pytest.approx(low) and check.high == pytest.approx(high)


def test_single_repeat_is_judged_as_one_attempt_and_a_failed_repeat_fails_the_point():
    spec = GateSpec(tflops_per_gpu_min=300.0)
    one = judge_point(spec, _repeats(299.0))
    assert one.to_dict() == evaluate(spec, _summary(299.0)).to_dict()
    failed = judge_point(spec, [*_repeats(320, 321), Repeat("repeat 2", "failed", "CUDA OOM", None)])
    assert failed.verdict == "fail" and "repeat 2: run failed: CUDA OOM" in failed.failed[0].message


def _view() -> CampaignView:
    spec = GateSpec(tflops_per_gpu_min=300.0)
    cells = []
    for repeat, tflops in enumerate((296.0, 301.0, 306.0)):
        summary = _summary(tflops)
        cells.append(CellView(cell_id=f"p1-r{repeat}", point_id="p1", repeat=repeat, label="x=1", params={"x": 1},
                              state="completed", attempt=1, summary=summary, gate=evaluate(spec, summary)))  # fmt: skip
    return CampaignView(name="rep", description="", axes=["x"], cells=cells,
                        gates=spec.model_dump(exclude_none=True), window=10)  # fmt: skip


def test_reports_show_one_row_per_point_with_its_verdict():
    view = _view()
    assert [p.verdict for p in view.points] == ["inconclusive"]
    md = markdown_summary(view)
    rows = [line for line in md.splitlines() if line.startswith("| ") and "completed" in line]
    assert len(rows) == 1 and "`p1`" in rows[0]
    assert "| 3 |" in rows[0] and "inconclusive" in rows[0]
    assert "### Inconclusive" in md and "straddles the minimum 300" in md
    page = render_report(view)
    assert page.count('<tr data-point="p1"') == 1 and 'data-verdict="inconclusive"' in page
    assert page.count('data-repeat-cell="p1-r') == 3


# ---------------------------------------------------------------- the CLI, with a command trainer


def _campaign(tmp_path: Path, name: str, gates: dict, file: str = "c.yaml", **extra) -> Path:
    data = {
        "name": name,
        "trainer": {"kind": "command", "log_format": "megatron-lm",
                    "command": [sys.executable, str(FAKE), "--replay", str(LOG), "--sleep-s", "0"]},  # fmt: skip
        "gates": gates,
        "wandb": {"mode": "disabled"},
        **extra,
    }
    path = tmp_path / file
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_missing_baseline_is_bad_input_before_anything_is_written(mbx, tmp_path):
    path = _campaign(tmp_path, "rel", {"tflops_rel_baseline_min": -0.05}, baseline="does-not-exist")
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}: baseline: no campaign named 'does-not-exist' in workspace {workspace.resolve()} (known: none yet)" in (
        result.stderr.replace("\n", "")
    )
    assert not (workspace / "mbx.sqlite").exists() and not (workspace / "rel").exists()
    checked = mbx("campaign", "validate", str(path), "--workspace", str(workspace))
    assert checked.returncode == 2 and "no campaign named 'does-not-exist'" in checked.stderr


def test_inconclusive_is_exit_3_never_pass(mbx, tmp_path):
    workspace = tmp_path / "ws"
    base = _campaign(tmp_path, "base", {}, file="base.yaml", sweep={"axes": {"fail": ["config"]}})
    assert mbx("campaign", "run", str(base), "--workspace", str(workspace), "--no-report").returncode == 1
    path = _campaign(tmp_path, "rel", {"tflops_rel_baseline_min": -0.05}, baseline="base")
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "PASS" not in result.stdout
    assert "INCONCLUSIVE 1/1 completed" in result.stdout
    assert "inconclusive: baseline: no baseline figures for this cell" in result.stdout
    again = mbx("campaign", "resume", "rel", "--workspace", str(workspace), "--no-report", "--inconclusive-ok")
    assert again.returncode == 0, again.stdout + again.stderr
    for command in ("run", "resume"):
        help_text = " ".join(mbx("campaign", command, "--help").stdout.split())
        assert "3 inconclusive" in help_text and "--inconclusive-ok" in help_text


def test_changed_gates_are_applied_to_stored_results(mbx, tmp_path):
    workspace = tmp_path / "ws"
    path = _campaign(tmp_path, "gated", {"tflops_per_gpu_min": 300})
    first = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report")
    assert first.returncode == 0 and "PASS 1/1 completed" in first.stdout, first.stdout + first.stderr
    stricter = _campaign(tmp_path, "gated", {"tflops_per_gpu_min": 360})
    second = mbx("campaign", "run", str(stricter), "--workspace", str(workspace))
    assert second.returncode == 1, second.stdout + second.stderr
    assert "already completed" in second.stdout and "FAIL 1/1 completed" in second.stdout
    assert "is below the minimum 360 TFLOP/s" in second.stdout
    status = json.loads(mbx("campaign", "status", "gated", "--workspace", str(workspace), "--json").stdout)["cells"]
    assert [(c["verdict"], c["point_verdict"]) for c in status] == [("fail", "fail")]
    page = (workspace / "gated" / "report" / "index.html").read_text()
    assert "tflops_per_gpu_min=360.0" in page and 'data-verdict="fail"' in page

    looser = _campaign(tmp_path, "gated", {"tflops_per_gpu_min": 300}, file="looser.yaml")
    regated = mbx("campaign", "regate", "gated", "--workspace", str(workspace), "--file", str(looser))
    assert regated.returncode == 0, regated.stdout + regated.stderr
    assert ": fail → pass" in regated.stdout and "gates updated" in regated.stdout
    report = mbx("report", "gated", "--workspace", str(workspace), "--markdown")
    assert "tflops_per_gpu_min=300.0" in report.stdout and "✅ pass" in report.stdout
    unchanged = mbx("campaign", "regate", "gated", "--workspace", str(workspace))
    assert unchanged.returncode == 0 and "0 verdict(s) changed" in unchanged.stdout
    other = _campaign(tmp_path, "other", {}, file="other.yaml")
    refused = mbx("campaign", "regate", "gated", "--workspace", str(workspace), "--file", str(other))
    assert refused.returncode == 2 and "not 'gated'" in refused.stderr


def test_point_verdict_from_repeats_decides_the_exit(mbx, tmp_path):
    workspace = tmp_path / "ws"
    # every repeat replays the same log: a zero-width interval just above the limit passes
    path = _campaign(tmp_path, "reps", {"tflops_per_gpu_min": TFLOPS - 0.001}, sweep={"repeats": 2})
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report")
    assert result.returncode == 0 and "2/2 completed, 1 point(s), every gate passed" in result.stdout
    table = mbx("campaign", "status", "reps", "--workspace", str(workspace)).stdout
    assert "(2 repeats, means)" in table and table.count("└ ") == 2
