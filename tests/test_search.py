"""Budgeted search (`sweep.search`): the budget arithmetic, decisions by verdicts, the recorded-table replay, and
real searches through `mbx campaign run` (the bundled trainer on the CPU, real Optuna): trials in the store,
the best point flagged, infeasible points recorded and never run, a search run again repeating nothing."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from conftest import TINY_MOE_RECIPE

from orchestrator.flow.search_evaluators import TableEvaluator
from orchestrator.flow.search_strategies import product_space, run_strategy
from orchestrator.judge.compare import Point, Repeat
from orchestrator.judge.search_ledger import Ledger
from orchestrator.judge.search_rank import Candidate, Evidence, metric_of, rank
from orchestrator.run.store import Store
from orchestrator.spec.search import Search, halving_cost, halving_sizes, halving_start, survivors

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "benchmarks" / "data" / "search_budget_cpu.json"


def test_halving_budget_arithmetic() -> None:
    assert [survivors(n, 1 / 3) for n in (0, 1, 2, 3, 4, 48)] == [0, 1, 1, 1, 2, 16]
    assert halving_sizes(48, 3, 1 / 3) == [48, 16, 6]
    assert halving_cost(48, [10, 30, 100], 1 / 3) == 48 * 10 + 16 * 30 + 6 * 100
    assert halving_start(48, [10, 30, 100], 1 / 3, 1, None) == 48
    start = halving_start(48, [10, 30, 100], 1 / 3, 1, 1000)
    assert halving_cost(start, [10, 30, 100], 1 / 3) <= 1000 < halving_cost(start + 1, [10, 30, 100], 1 / 3)
    assert halving_start(48, [10, 30, 100], 1 / 3, 1, None, budget_points=20) == 20


def test_bad_search_settings_are_one_line_each(mbx, write_campaign) -> None:
    path = write_campaign({
        "name": "badsearch", "trainer": {"recipe": TINY_MOE_RECIPE},
        "sweep": {"axes": {"training.micro_batch_size": [1, 2]},
                  "search": {"method": "halving", "halving": {"steps": [30, 10]}, "objective": "loss"}},
    })  # fmt: skip
    result = mbx("campaign", "validate", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "sweep.search.halving.steps" in result.stderr and "strictly increasing" in result.stderr
    assert "sweep.search.objective" in result.stderr and "tflops_per_gpu" in result.stderr


def _point(name: str, values: list[float]) -> Evidence:
    repeats = [Repeat(f"{name}-r{i}", {"tflops_per_gpu": v}, [], {}) for i, v in enumerate(values)]
    point = Point("c", name, name, {}, [r.cell_id for r in repeats], repeats)
    return Evidence(Candidate(name, name, {}), 10, "completed", point, verdict="pass")


def test_rank_puts_points_the_verdicts_cannot_separate_before_points_they_call_worse() -> None:
    leader = _point("leader", [100.0, 100.2, 99.9, 100.1])
    noisy = _point("noisy", [70.0, 120.0, 60.0, 110.0])  # mean 90, spread too wide to call it worse
    worse = _point("worse", [95.0, 95.1, 94.9, 95.0])  # mean 95, but clearly 5% below the leader
    ranked = rank([worse, noisy, leader], metric_of("tflops"), 0.01)
    assert [e.candidate.key for e, _ in ranked] == ["leader", "noisy", "worse"]
    assert (
        ranked[0][1] is None and ranked[1][1].decision != "different" and ranked[2][1].decision == "different"
    )


@pytest.mark.parametrize("method", ["halving", "optuna"])
def test_search_on_the_recorded_table_spends_a_third_of_the_grid(method: str) -> None:
    cands, evaluator, axes = TableEvaluator.load(TABLE, window=50)
    assert len(cands) >= 48 and len(axes) >= 3
    settings = {"halving": {"steps": [10, 30, 100]}} if method == "halving" else {
        "budget": {"steps": 1680}, "optuna": {"warmup_trials": 5, "prune_at": 10}}  # fmt: skip
    search = Search.model_validate({"method": method, "seed": 0, **settings})
    saved: list[list[dict]] = []
    ledger = Ledger(search, saved.append)
    best = run_strategy(evaluator, cands, search, ledger, product_space(axes, []))
    assert best.evidence is not None and best.evidence.steps == 100
    assert ledger.steps <= 0.35 * len(cands) * 100
    rows = saved[-1]
    assert sum(r["best"] for r in rows) == 1 and any(r["pareto"] for r in rows)
    best_row = next(r for r in rows if r["best"])
    assert best_row["label"] == best.evidence.candidate.label
    assert any(how in best_row["reason"] for how in ("runner-up", "not DIFFERENT", "only eligible"))
    stopped = {"halving": "dropped", "optuna": "pruned"}[method]
    assert any(r["state"] == stopped and "vs the leader" in r["reason"] for r in rows)


@pytest.mark.parametrize("method", ["grid", "random"])
def test_grid_and_random_stop_at_their_budget(method: str) -> None:
    cands, evaluator, _axes = TableEvaluator.load(TABLE, window=50)
    search = Search.model_validate({"method": method, "seed": 1, "budget": {"points": 5}})
    ledger = Ledger(search)
    best = run_strategy(evaluator, cands, search, ledger)
    rows = list(ledger.rows.values())
    assert len(rows) == 5 and ledger.steps == 500 and ledger.stop_reason == "budget of 5 point(s) reached (5 ran)"
    in_order = [r["label"] for r in rows] == [c.label for c in cands[:5]]
    assert in_order if method == "grid" else not in_order  # random: the seeded order
    assert best.evidence is not None and sum(r["best"] for r in rows) == 1


def _search_campaign(write_campaign, name: str, search: dict, axes: dict) -> Path:
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 8
    return write_campaign({
        "name": name, "trainer": {"recipe": recipe}, "collect": {"window": 6}, "wandb": {"mode": "disabled"},
        "gates": {"loss_finite": True}, "launchers": {"local": {"parallel": 2}},
        "sweep": {"axes": axes, "search": search},
    }, name=f"{name}.yaml")  # fmt: skip


def test_halving_search_runs_rungs_records_trials_and_resumes_without_rerunning(mbx, write_campaign, tmp_path,
                                                                                 cache_env) -> None:  # fmt: skip
    search = {"method": "halving", "halving": {"steps": [4, 8], "keep": 0.5},
              "constraints": {"peak_memory_gib_max": 0.1, "loss_tolerance": 0.5}}  # fmt: skip
    path = _search_campaign(write_campaign, "halve", search, {"training.micro_batch_size": [1, 2, 4, 512]})
    workspace = tmp_path / "ws"
    first = mbx("campaign", "run", str(path), "--workspace", str(workspace), env=cache_env)
    # one repeat a side on a busy CPU: the last rung's two points may be a tie no figure separates (exit 3)
    assert first.returncode in (0, 3), first.stdout + first.stderr
    tie = first.returncode == 3
    assert "search halving" in first.stdout
    assert ("tie — no figure separates them" in first.stdout) if tie else ("BEST [" in first.stdout)
    with Store(workspace) as store:
        trials = store.trials("halve")
        attempts = store.attempts("halve")
        labels = {c.label for c in store.cells("halve")}
    by_state = {}
    for row in trials:
        by_state.setdefault(row["state"], []).append(row)
    infeasible = by_state["infeasible"]
    assert [r["label"] for r in infeasible] == ["micro_batch_size=512"]
    assert "memory estimate" in infeasible[0]["reason"]
    assert not any("512" in label for label in labels)  # never run
    assert len(by_state["promoted"]) == 2 and len(by_state["dropped"]) == 1
    assert "vs the leader" in by_state["dropped"][0]["reason"]
    best = [r for r in trials if r["best"]]
    assert len(best) == (0 if tie else 1) and all(r["steps"] == 8 and r["rung"] == 1 for r in best)
    assert "micro_batch_size=1, steps=4" in labels and "steps=4" in labels  # rung 0 cells and the base recipe
    assert (workspace / "halve" / "report" / "index.html").exists()

    again = mbx("campaign", "run", str(path), "--workspace", str(workspace), env=cache_env)
    assert again.returncode == first.returncode, again.stdout + again.stderr
    with Store(workspace) as store:
        assert len(store.attempts("halve")) == len(attempts)  # nothing ran twice
        assert [r["label"] for r in store.trials("halve") if r["best"]] == [r["label"] for r in best]


def test_dry_run_of_a_halving_search_renders_its_first_rung_and_writes_nothing(mbx, write_campaign, tmp_path,
                                                                             cache_env) -> None:  # fmt: skip
    search = {"method": "halving", "halving": {"steps": [4, 8], "keep": 0.5},
              "constraints": {"peak_memory_gib_max": 0.1}}  # fmt: skip
    path = _search_campaign(write_campaign, "halve", search, {"training.micro_batch_size": [1, 2, 4, 512]})
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--dry-run", env=cache_env)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "search halving would first run 3 point(s) at 4 steps (3 cell(s))" in out  # 512 is infeasible
    assert "dry run: nothing submitted (3 attempt(s) rendered)" in out
    assert "depends on its results" in out and "the full grid is 24 steps" in out
    assert out.count("steps=4") >= 3 and "steps=8" not in out  # rung 0 only, at its run length
    assert not workspace.exists()  # nothing written, not even the workspace


def test_optuna_search_stays_in_its_point_budget(mbx, write_campaign, tmp_path, cache_env) -> None:
    search = {"method": "optuna", "seed": 3, "budget": {"points": 3},
              "optuna": {"warmup_trials": 2, "prune_at": 4}}  # fmt: skip
    path = _search_campaign(
        write_campaign, "tpe", search, {"training.micro_batch_size": [1, 2, 4], "model.moe.top_k": [1, 2]}
    )
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report", env=cache_env)
    assert result.returncode in (0, 3), result.stdout + result.stderr  # 3: a tie no figure separates
    assert "budget of 3 point(s) reached" in result.stdout or "3 trial(s)" in result.stdout
    with Store(workspace) as store:
        trials = store.trials("tpe")
    assert len({r["trial"] for r in trials}) <= 3
    assert {r["state"] for r in trials} <= {"promoted", "completed", "pruned", "excluded"}
    assert sum(r["best"] for r in trials) == (1 if result.returncode == 0 else 0)
    assert {r["steps"] for r in trials} <= {4, 8}


def test_a_killed_search_resumes_without_repeating_finished_trials(
    write_campaign, tmp_path, cache_env, mbx
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    search = {"method": "halving", "halving": {"steps": [4, 8], "keep": 0.5}}
    path = _search_campaign(write_campaign, "killed", search, {"training.micro_batch_size": [1, 2, 4, 8]})
    workspace = tmp_path / "ws"
    env = {**os.environ, **cache_env, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "campaign",
        "run",
        str(path),
        "-w",
        str(workspace),
        "-j",
        "1",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    deadline = time.time() + 300
    done: list = []
    while time.time() < deadline and len(done) < 2 and proc.poll() is None:
        time.sleep(0.5)
        if (workspace / "mbx.sqlite").exists():
            with Store(workspace) as store:
                done = [a for a in store.attempts("killed") if a.state == "completed"]
    os.killpg(proc.pid, signal.SIGKILL)  # the orchestrator and the trainer it runs, mid-search
    proc.wait()
    assert len(done) >= 2
    resumed = mbx("campaign", "resume", "killed", "--workspace", str(workspace), "--no-report", env=cache_env)
    assert resumed.returncode in (0, 3), resumed.stdout + resumed.stderr  # 3: a tie no figure separates
    assert ("BEST [" if resumed.returncode == 0 else "tie — no figure separates them") in resumed.stdout
    with Store(workspace) as store:
        completed = [a.cell_id for a in store.attempts("killed") if a.state == "completed"]
        trials = store.trials("killed")
    assert len(completed) == len(set(completed))  # no finished run was run again
    assert {a.cell_id for a in done} <= set(completed)
    assert sum(r["best"] for r in trials) == (resumed.returncode == 0) and {r["rung"] for r in trials} == {0, 1}
