"""Issue 31, search budgets: a `points` budget counts points that ran (never infeasible ones that never started), a
`gpu_hours` budget is checked before each trial with its predicted cost, and a search that spent its budget with
nothing failed is inconclusive (exit 3, one closing line), not a failure. On the recorded CPU table
(benchmarks/data/search_budget_cpu.json) and through `mbx campaign run` with the bundled trainer and real Optuna."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from conftest import TINY_MOE_RECIPE

from orchestrator.flow.search_evaluators import TableEvaluator
from orchestrator.flow.search_strategies import run_strategy
from orchestrator.judge.search_ledger import Ledger
from orchestrator.judge.search_rank import Evidence
from orchestrator.run.store import Store
from orchestrator.spec.search import Search

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "benchmarks" / "data" / "search_budget_cpu.json"


def test_a_points_budget_does_not_count_infeasible_points() -> None:
    cands, evaluator, _axes = TableEvaluator.load(TABLE, window=50)
    search = Search.model_validate({"method": "grid", "budget": {"points": 5}})
    ledger = Ledger(search)
    for cand in cands[-6:]:  # six points the memory estimate ruled out: recorded, never run
        ledger.record(Evidence(cand, 100, "infeasible", reason="memory estimate over the GPU"), 0)
    run_strategy(evaluator, cands[:-6], search, ledger)
    ran = [r for r in ledger.rows.values() if r["state"] != "infeasible"]
    assert len(ran) == 5 and ledger.steps == 500, [r["state"] for r in ledger.rows.values()]
    assert ledger.stop_reason == "budget of 5 point(s) reached (5 ran)"


def test_a_gpu_hours_budget_checks_each_trial_before_it_starts() -> None:
    cands, evaluator, _axes = TableEvaluator.load(TABLE, window=50)
    first = evaluator.evaluate(cands[:1], 100, False)[0][cands[0].key].gpu_hours
    budget = 3 * first
    search = Search.model_validate({"method": "grid", "budget": {"gpu_hours": budget}})
    ledger = Ledger(search)
    run_strategy(evaluator, cands, search, ledger)
    # the recorded costs are 1.0, 1.2 and 0.84 × the first: after two trials (2.2×) the third is predicted at the
    # rate paid so far (1.1×) and would pass the budget: it never starts (spending until the budget is gone would
    # have run it and ended at 3.04×)
    assert len(ledger.rows) == 2 and ledger.gpu_hours <= budget
    assert "the next trial would take" in (ledger.stop_reason or "")


def _search_campaign(write_campaign, name: str, search: dict, axes: dict) -> Path:
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 8
    return write_campaign({
        "name": name, "trainer": {"recipe": recipe}, "collect": {"window": 6}, "wandb": {"mode": "disabled"},
        "gates": {"loss_finite": True}, "launchers": {"local": {"parallel": 2}},
        "sweep": {"axes": axes, "search": search},
    }, name=f"{name}.yaml")  # fmt: skip


def test_an_optuna_points_budget_counts_points_that_ran(mbx, write_campaign, tmp_path, cache_env) -> None:
    """Three of seven points cannot fit (peak memory constraint): the budget of 3 points runs 3 feasible ones
    (before issue 31 the three infeasible ones used it up and nothing ran)."""
    search = {"method": "optuna", "seed": 3, "budget": {"points": 3}, "optuna": {"prune": False},
              "constraints": {"peak_memory_gib_max": 0.1}}  # fmt: skip
    axes = {"training.micro_batch_size": [1, 2, 3, 4, 512, 768, 1024]}
    path = _search_campaign(write_campaign, "tpe-infeasible", search, axes)
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report", env=cache_env)
    assert result.returncode in (0, 3), result.stdout + result.stderr  # 3: a tie no figure separates
    with Store(workspace) as store:
        trials = store.trials("tpe-infeasible")
    infeasible = {r["label"] for r in trials if r["state"] == "infeasible"}
    ran = {r["label"] for r in trials if r["state"] != "infeasible"}
    assert len(infeasible) == 3 and len(ran) == 3, trials
    assert "budget of 3 point(s) reached (3 ran)" in result.stdout
    closing = result.stdout.strip().splitlines()[-1]
    assert closing.startswith("PASS" if result.returncode == 0 else "INCONCLUSIVE"), closing


def test_a_search_that_spent_its_budget_with_nothing_failed_exits_3(mbx, write_campaign, tmp_path,
                                                                    cache_env) -> None:  # fmt: skip
    """A halving whose GPU-hours run out in its first rung: no trial reached full length and none failed, so
    there is no best point yet, and that is undecided (exit 3, one closing line), not a failure (exit 1)."""
    search = {"method": "halving", "halving": {"steps": [4, 8], "keep": 0.5}, "budget": {"gpu_hours": 1e-9}}
    path = _search_campaign(write_campaign, "spent", search, {"training.micro_batch_size": [1, 2, 4]})
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report", env=cache_env)
    assert result.returncode == 3, result.stdout + result.stderr
    closings = [line for line in result.stdout.splitlines() if line.startswith(("PASS", "FAIL", "INCONCLUSIVE"))]
    assert len(closings) == 1 and closings[0].startswith("INCONCLUSIVE search halving: ")
    assert "budget of 1e-09 GPU-hours reached" in closings[0] and "no trial failed" in closings[0]
    assert closings[0].endswith("(exit 3; --inconclusive-ok accepts it)")
    again = mbx("campaign", "resume", "spent", "--workspace", str(workspace), "--no-report", "--inconclusive-ok",
                env=cache_env)  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    # freeze says the same: its short run was kept for a full-length run that never came, so nothing is frozen
    # and that is undecided (3), not "every point failed" (1)
    frozen = mbx("freeze", "spent", "--workspace", str(workspace), "--json")
    assert frozen.returncode == 3, frozen.stdout + frozen.stderr
    told = json.loads(frozen.stdout)
    assert (told["verdict"], told["exit_code"]) == ("inconclusive", 3), told
    assert [r["kind"] for r in told["rejected"]] == ["short run"] and "not decided" in told["rejected"][0]["why"]


def test_the_halving_front_keeps_points_that_stopped_early_for_memory() -> None:
    """Memory does not depend on run length: a point dropped at a short rung that no run of that length beats on
    both figures is on the front for memory (its row flagged, its TFLOP/s never compared with a full-length one)."""
    from orchestrator.judge.search_rank import memory_of

    cands, evaluator, _axes = TableEvaluator.load(TABLE, window=5)
    search = Search.model_validate({"method": "halving", "halving": {"steps": [10, 30, 100], "keep": 1 / 3}})
    ledger = Ledger(search)
    best = run_strategy(evaluator, cands, search, ledger)
    assert best.pareto and all(e.steps == 100 for e in best.pareto)
    assert best.memory_front and all(e.steps < 100 for e in best.memory_front)
    lowest_full = min(memory_of(e.point) or 0 for e in best.pareto)
    assert min(memory_of(e.point) or 0 for e in best.memory_front) < lowest_full  # the front reaches lower memory
    flagged = [r for r in ledger.rows.values() if r.get("pareto_by") == "memory"]
    assert len(flagged) == len(best.memory_front) and all(r["pareto"] and r["steps"] < 100 for r in flagged)
    assert all("on the Pareto front for memory (measured at" in r["reason"] for r in flagged)
