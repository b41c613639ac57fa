"""Issue 23: one best point from search to report to freeze, headroom judged on estimates, ties broken only on a
figure that separates them, budgets checked before each trial, parity in the closing line, and the seed-000
template's tolerances catching a learning rate × 1.5.

The seed-003 H200 template's flow is replayed from recorded figures: the search runs through the real strategy,
store, regate, report, freeze and status; only the GPU runs are replaced by run dirs whose metrics.jsonl is
written through trainer/rundir.py from the figures of tests/data/seed003_h200_search.json."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.flow import lifecycle
from orchestrator.flow.search_evaluators import TableEvaluator
from orchestrator.flow.search_strategies import run_strategy
from orchestrator.judge.best import choose, metric
from orchestrator.judge.compare import Point, Repeat
from orchestrator.judge.search_ledger import Ledger
from orchestrator.run.feasibility import check_points, limits_of, with_gpu_memory
from orchestrator.run.store import Store, cell_rows
from orchestrator.spec.loader import load_campaign
from orchestrator.spec.search import Search
from orchestrator.trainers import expand
from reports.window import summarize
from trainer import rundir

ROOT = Path(__file__).resolve().parent.parent
H200_TEMPLATE = ROOT / "campaigns" / "seed003_parallel_search_h200.yaml"
FIGURES = ROOT / "tests" / "data" / "seed003_h200_search.json"
PARITY_CUT = ROOT / "tests" / "data" / "parity" / "seed000_cut.yaml"
TABLE = ROOT / "benchmarks" / "data" / "search_budget_cpu.json"
TFLOPS, MEMORY = metric("tflops"), metric("peak_alloc")


# ---- the seed-003 H200 template, replayed -------------------------------------------------------------------
def _rows(fig: dict[str, Any], steps: int, short: float) -> list[dict[str, Any]]:
    """A run's metrics rows: the first step slow (never in the window), ±0.3% step-to-step, the recorded
    TFLOP/s (× `short` for a run shorter than the template's 40 steps) and peak allocated memory."""
    tflops = fig["tflops"] * short
    ms = 1000.0 * 300.0 / tflops
    rows = []
    for step in range(1, steps + 1):
        wobble = 1 + 0.003 * math.sin(step * 1.7)
        time = ms * (3.0 if step == 1 else wobble)
        rows.append({"step": step, "step_time_ms": time, "tflops_per_gpu": tflops * ms / time,
                     "loss": 11.0 - 0.05 * step, "grad_norm": 1.0, "mem_max_allocated_gib": fig["peak_gib"],
                     "mem_max_reserved_gib": fig["peak_gib"] + 1.0})  # fmt: skip
    return rows


def replay(figures: dict[str, Any], workspace: Path, file: Path, gpu: str | None = None,
           strict: bool = False) -> Any:  # fmt: skip
    """A stand-in for the lifecycle's rung (prepare + execute) that records each cell as run from the recorded
    figures: the same feasibility step and store registration, then one completed attempt per cell (run dir
    and result)."""

    def run(campaign: Any, points: list[Any]) -> None:
        campaign = with_gpu_memory(campaign, gpu)
        assessment = check_points(points, gpu, strict, str(file), limits_of(campaign))
        cells = cell_rows(campaign, assessment.runnable)
        spec = campaign.model_dump(mode="json")
        with Store(workspace) as store:
            done = store.latest_attempts(campaign.name)
            store.register_campaign(campaign.name, str(file), spec, "local", cells)
            store.record_estimates(campaign.name, assessment.records())
            for cell in cells:
                if cell.cell_id in done:
                    continue
                p = cell.params
                fig = figures[f"{p['training.micro_batch_size']}/{p['cross_entropy']}/{p['recompute']}"]
                steps = int(p.get("training.steps", 40))
                rows = _rows(fig, steps, figures["short_run_factor"] if steps < 40 else 1.0)
                run_dir = Path(workspace) / campaign.name / cell.cell_id / "1"
                run_dir.mkdir(parents=True)
                rundir.write_metrics(run_dir, rows)
                summary = summarize(rows, campaign.collect.window).to_dict()
                store.record_ingested(spec, cell, 1, str(run_dir), "completed", None, None, summary, None)

    return run


def search_replayed(workspace: Path, file: Path, figures: dict[str, Any], make_report: bool = True) -> Any:
    """The search of campaign `file` prepared and executed by the lifecycle (its lock, trial rows, registration,
    report and closing), each rung's cells replayed from `figures`; returns the search's answer."""
    plan = lifecycle.prepare(file, lifecycle.Options(workspace, make_report=make_report))
    plan.search.evaluator.runner = replay(figures, plan.workspace, file)
    finished = lifecycle.execute(plan)
    assert finished.search is not None and finished.judged == finished.search.outcome()
    return finished.search


def test_the_h200_search_its_report_status_and_freeze_name_one_full_length_best(tmp_path, mbx) -> None:
    figures = json.loads(FIGURES.read_text())
    campaign = load_campaign(H200_TEMPLATE)
    workspace = tmp_path / "ws"
    found = search_replayed(workspace, H200_TEMPLATE, figures)
    best = found.best.evidence
    assert best is not None and found.exit_code() == 0 and found.outcome().verdict == "pass"
    assert best.steps == 40  # a full-length trial, not a 5-step first-rung run that looked faster
    label = best.candidate.label
    # MBS 16 fused is 2.7% ahead of MBS 4 native in TFLOP/s at one run a side: not DIFFERENT once the interval is
    # widened by the run-to-run floor (1%: the workspace has no A/A repeats), so a tie, broken by less memory
    assert label == "micro_batch_size=4, cross_entropy=native, recompute=none"
    assert "TIE: 2 points are not DIFFERENT" in found.best.how and "broken by lower peak allocated" in found.best.how
    front = {e.candidate.label for e in found.best.pareto}
    assert label in front and "micro_batch_size=16, cross_entropy=fused, recompute=none" in front

    with Store(workspace) as store:
        trials = store.trials(campaign.name)
        spec = store.campaign(campaign.name)["spec"]
    finals = [r for r in trials if r["steps"] == 40 and r["objective"] is not None]
    dominated = {r["label"] for r in finals for o in finals
                 if o is not r and o["objective"] >= r["objective"] and o["peak_gib"] <= r["peak_gib"]}  # fmt: skip
    assert {r["label"] for r in finals if r["pareto"]} == {r["label"] for r in finals} - dominated
    assert spec["gates"]["gpu_memory_gib"] == pytest.approx(139.8)  # the headroom gate knows the H200

    status = mbx("campaign", "status", campaign.name, "--workspace", str(workspace))
    assert status.returncode == 0, status.stderr
    assert "inconclusive" not in status.stdout and "not known" not in status.stdout
    assert f"best: {best.point.point_id} [{label}]" in status.stdout

    frozen = mbx("freeze", campaign.name, "--workspace", str(workspace), "--out", str(tmp_path / "frozen"))
    assert frozen.returncode == 0, frozen.stdout + frozen.stderr
    assert f"point {best.point.point_id} [{label}]" in frozen.stdout.splitlines()[0]
    assert "(short run): a 5-step trial" in frozen.stdout

    report = workspace / campaign.name / "report"
    summary = (report / "summary.md").read_text()
    assert f"**{best.point.point_id}**" in summary.split("### Performance result")[0] or best.point.point_id in \
        summary.split("### Frozen configuration")[1].split("###")[0]  # fmt: skip
    page = (report / "index.html").read_text()
    assert f'data-point="{best.point.point_id}"' in page.split('id="best-cell"')[1][:300]
    assert page.index('id="trials"') < page.index('id="cells"')  # a search leads with its result and trials


def test_freeze_judges_headroom_on_the_campaigns_gb200(tmp_path, mbx) -> None:
    """resources.gpu: GB200 with a headroom gate: the gate knows the GPU's memory (the feasibility table), so
    every point passes and freeze picks the best instead of refusing 'the GPU's memory is not known'."""
    figures = json.loads(FIGURES.read_text())
    raw = yaml.safe_load(H200_TEMPLATE.read_text())
    raw["resources"]["gpu"] = "GB200"
    raw["sweep"]["search"] = {**raw["sweep"]["search"], "method": "grid"}
    raw["sweep"]["axes"]["training.micro_batch_size"] = [4, 16]
    path = tmp_path / "gb200.yaml"
    path.write_text(yaml.safe_dump(raw))
    campaign = load_campaign(path)
    workspace = tmp_path / "ws"
    found = search_replayed(workspace, path, figures, make_report=False)
    assert found.best.evidence is not None
    status = mbx("campaign", "status", campaign.name, "--workspace", str(workspace))
    assert "inconclusive" not in status.stdout and "not known" not in status.stdout
    frozen = mbx("freeze", campaign.name, "--workspace", str(workspace), "--out", str(tmp_path / "frozen"))
    assert frozen.returncode == 0, frozen.stdout + frozen.stderr


# ---- headroom on estimates --------------------------------------------------------------------------------
def test_plan_marks_points_under_the_headroom_gate_and_the_search_constraint_as_run_skips(tmp_path, mbx) -> None:
    raw = yaml.safe_load(H200_TEMPLATE.read_text())
    raw["gates"]["headroom_gib_min"] = 70  # MBS 4 native: ~78.6 GiB estimated, 61 GiB of headroom
    path = tmp_path / "headroom.yaml"
    path.write_text(yaml.safe_dump(raw))
    plan = mbx("campaign", "plan", str(path))
    assert plan.returncode == 0, plan.stderr
    assert "gates.headroom_gib_min 70" in plan.stdout and "estimated headroom" in plan.stdout
    rows = json.loads(mbx("campaign", "plan", str(path), "--json").stdout)
    mbs4 = next(r["estimate"] for r in rows if r["params"] == {
        "training.micro_batch_size": 4, "cross_entropy": "native", "recompute": "none"})  # fmt: skip
    assert not mbs4["feasible"] and "headroom" in mbs4["reason"]
    campaign = load_campaign(path)
    runnable = check_points(expand(campaign, path, None), None, False, str(path), limits_of(campaign)).runnable
    assert mbs4 and all(p.params != {"training.micro_batch_size": 4, "cross_entropy": "native", "recompute": "none"}
                        for p in runnable)  # the run skips what plan marks  # fmt: skip

    cpu = mbx("campaign", "plan", str(ROOT / "campaigns" / "seed003_parallel_search.yaml"))
    assert cpu.returncode == 0, cpu.stderr
    assert "4 of 20 point(s) infeasible" in cpu.stdout and "peak_memory_gib_max 0.19" in cpu.stdout


# ---- ties -------------------------------------------------------------------------------------------------
def _point(name: str, tflops: list[float], memory: float, samples: list[float] | None = None) -> Point:
    rows = [{"step": i + 2, "step_time_ms": 100.0, "tflops_per_gpu": v} for i, v in enumerate(samples or [])]
    repeats = [Repeat(f"{name}-r{i}", {"tflops_per_gpu": v, "peak_alloc_gib": memory}, rows, {})
               for i, v in enumerate(tflops)]  # fmt: skip
    return Point("c", name, name, {}, [r.cell_id for r in repeats], repeats)


def test_a_tie_on_zero_memory_is_said_and_not_broken() -> None:
    a, b = _point("a", [100.0, 100.3, 99.9], 0.0), _point("b", [100.1, 99.8, 100.2], 0.0)
    choice = choose([a, b], TFLOPS)
    assert choice.winner is None and choice.undecided
    assert "tie — no figure separates them" in choice.how and "not known for a, b" in choice.how


def test_a_tie_on_equal_memory_is_not_broken_and_a_separating_memory_breaks_it() -> None:
    a, b = _point("a", [100.0, 100.3, 99.9], 40.92), _point("b", [100.1, 99.8, 100.2], 40.92)
    assert choose([a, b], TFLOPS).winner is None
    c = _point("c", [100.1, 99.8, 100.2], 30.0)
    choice = choose([a, c], TFLOPS)
    assert choice.winner is c and "broken by lower peak allocated" in choice.how


def test_one_run_a_side_is_a_tie_unless_different_with_the_run_to_run_floor() -> None:
    """One repeat a side whose steps alone put the change's interval below −1% (the old rule: a loss "by its
    whole interval") is a tie: the one tie rule reads the verdict, UNKNOWN once the run-to-run floor (1% without
    A/A repeats) widens the interval; equal memory cannot break it. A runner-up 10% behind is DIFFERENT: a loss."""
    steps = [100.0 + 0.2 * math.sin(i) for i in range(20)]
    leader = _point("lead", [100.0], 40.92, steps)
    runner = _point("run", [98.0], 40.92, [98.0 + 0.2 * math.cos(i) for i in range(20)])
    choice = choose([runner, leader], TFLOPS)
    assert choice.winner is None and choice.undecided, choice.how
    assert "TIE: 2 points are not DIFFERENT" in choice.how and "some UNKNOWN" in choice.how
    far = _point("far", [90.0], 40.92, [90.0 + 0.2 * math.cos(i) for i in range(20)])
    choice = choose([far, leader], TFLOPS)
    assert choice.winner is leader and not choice.is_tie
    assert "DIFFERENT" in choice.how and "1 run a side: within-run CI widened by the run-to-run floor 1.00%" in \
        choice.how  # fmt: skip


# ---- budgets ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["halving", "grid"])
def test_a_gpu_hours_budget_ends_at_most_one_trial_over(method: str) -> None:
    cands, evaluator, _axes = TableEvaluator.load(TABLE, window=50)
    first = evaluator.evaluate(cands[:1], 100, False)[0][cands[0].key].gpu_hours
    budget = 5 * first
    search = Search.model_validate({"method": method, "budget": {"gpu_hours": budget},
                                    "halving": {"steps": [10, 30, 100]}})  # fmt: skip
    ledger = Ledger(search)
    run_strategy(evaluator, cands, search, ledger)
    costs = [r["gpu_hours"] for r in ledger.rows.values()]
    assert ledger.gpu_hours <= budget + max(costs) and "GPU-hours" in (ledger.stop_reason or "")


# ---- parity in the closing line, and the seed-000 tolerances ----------------------------------------------
def test_parity_says_fail_in_the_closing_line_and_regate_and_status_and_lr_x1_5_fails(tmp_path, mbx,
                                                                                     cache_env) -> None:  # fmt: skip
    """The cut-down seed-000 template (its tolerances): the toggle passes, lr × 1.5 fails; the closing line
    says FAIL with parity (exit 1), regate re-judges parity (exit 1), status shows it."""
    workspace = tmp_path / "ws"
    run = mbx("campaign", "run", str(PARITY_CUT), "--workspace", str(workspace), "--no-report", env=cache_env)
    assert run.returncode == 1, run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert "parity PASS optimizer.master_weights: false → true" in run.stdout
    assert "parity FAIL optimizer.master_weights: false → false, optimizer.lr: 0.003 → 0.0045" in run.stdout
    closing = next(line for line in lines if line.startswith(("PASS", "FAIL", "INCONCLUSIVE")))
    assert closing.startswith("FAIL") and "parity FAIL: 1 of 2 pair(s) failed" in closing
    assert not any(line.startswith("PASS") for line in lines)

    regate = mbx("campaign", "regate", "seed000-cut", "--workspace", str(workspace))
    assert regate.returncode == 1 and "parity FAIL: 1 of 2 pair(s) failed" in regate.stdout
    status = mbx("campaign", "status", "seed000-cut", "--workspace", str(workspace))
    assert "parity FAIL: 1 of 2 pair(s) failed" in status.stdout and "optimizer.lr: 0.003 → 0.0045" in status.stdout
    template = yaml.safe_load((ROOT / "campaigns" / "seed000_precision_parity.yaml").read_text())
    cut = yaml.safe_load(PARITY_CUT.read_text())
    assert cut["parity"]["metrics"]["loss"] == template["parity"]["metrics"]["loss"]  # the template's band
