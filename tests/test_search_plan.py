"""A search as a campaign like any other (issue 34, item 1; issue 31 review defects 3 and 4): a point its node
refuses (the GPU check: exit 78, class infeasible, the trainer never started) costs the search nothing and is
counted as infeasible, not as ran; `campaign regate` of a search says what `campaign status` says (the one
outcome owner, orchestrator/judge/outcome.py) and every `--json` exit_code is the process's exit code. No GPU
needed: a stand-in nvidia-smi (tests/fixtures_cmd/fake_nvidia_smi.py) reports an H100 80 GB to a search planned
for an H200; the fake Megatron replays a real log. And `mbx campaign plan` and `mbx campaign run --dry-run` share
lifecycle.prepare (the same estimates, the same attempt numbers), a search's included; the search itself
takes no lock, registers nothing and writes no report of its own (lifecycle.execute does, once)."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from conftest import FAKE_MEGATRON, MEGATRON_LOG, ROOT

from orchestrator.run.store import Store

FAKE_SMI = ROOT / "tests" / "fixtures_cmd" / "fake_nvidia_smi.py"
H100 = "NVIDIA H100 80GB HBM3"


def _h100_env(tmp_path: Path) -> dict[str, str]:
    """PATH with an `nvidia-smi` that lists one H100 80 GB (81,559 MiB → 79.6 GiB)."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "nvidia-smi"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE_SMI))} "$@"\n')
    shim.chmod(0o755)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "FAKE_NVIDIA_SMI_GPUS": f"{H100}|81559",
    }


def h200_search(budget_points: int = 2) -> dict:
    """A grid search planned for an H200: hidden 10240 (93 GiB by its estimate) fits the H200 but not the H100 the
    node reports, so the node refuses it; hidden 1024 and 8192 fit both. A budget of 2 points."""
    params = {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 2048,
              "vocab_size": 32000, "micro_batch_size": 1, "global_batch_size": 8, "bf16": True}  # fmt: skip
    command = [sys.executable, str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0"]
    return {
        "name": "search-h100",
        "trainer": {"kind": "command", "command": command, "steps": 15, "params": params,
                    "log_format": "megatron-lm"},  # fmt: skip
        "resources": {"gpu": "H200"},
        "sweep": {"axes": {"params.hidden_size": [10240, 1024, 8192]},
                  "search": {"method": "grid", "budget": {"points": budget_points}, "steps_key": "trainer.steps"}},
        "gates": {"headroom_gib_min": 10},
        "wandb": {"mode": "disabled"},
    }  # fmt: skip


@pytest.fixture
def refused_search(mbx, write_campaign, tmp_path):
    """The H200 search run on the H100 node: (the run's result, the workspace, the environment)."""
    env = _h100_env(tmp_path)
    workspace = tmp_path / "ws"
    result = mbx(
        "campaign", "run", str(write_campaign(h200_search())), "-w", str(workspace), "--no-report", env=env
    )
    return result, workspace, env


def test_a_point_its_node_refuses_costs_the_search_nothing(refused_search) -> None:
    result, workspace, _env = refused_search
    out = result.stdout
    assert result.returncode in (0, 3), (
        out + result.stderr
    )  # 3: the two fitting points may tie (same replayed log)
    with Store(workspace) as store:
        trials = {r["label"]: r for r in store.trials("search-h100")}
        active = {c.label for c in store.cells("search-h100")}
    refused = trials["hidden_size=10240"]
    assert refused["state"] == "infeasible" and f"exceeds the {H100}'s 79.6 GiB" in refused["reason"]
    assert refused["cost_steps"] == 0 and refused["gpu_hours"] == 0
    # the budget of 2 points went to the two points that ran (before the fix: the refused one and 1024 only)
    assert trials["hidden_size=1024"]["state"] == trials["hidden_size=8192"]["state"] == "completed"
    assert "3 trial(s) (1 infeasible, 2 completed); 30 steps spent" in out
    assert "(1 ran)" not in out and "(2 ran)" not in out  # every point was tried: the budget stopped nothing
    # the refused point stays out of the campaign's active cells (status, report, freeze): not a failed cell
    assert active == {"hidden_size=1024", "hidden_size=8192"}


def test_regate_of_a_search_says_what_status_says(refused_search, mbx) -> None:
    result, workspace, env = refused_search
    status = mbx("campaign", "status", "search-h100", "-w", str(workspace), "--json", env=env)
    assert status.returncode == 0, status.stderr
    said = json.loads(status.stdout)
    assert said["exit_code"] == result.returncode and said["verdict"] in ("pass", "inconclusive")
    regate = mbx("campaign", "regate", "search-h100", "-w", str(workspace), "--json", env=env)
    judged = json.loads(regate.stdout)
    assert regate.returncode == judged["exit_code"] == said["exit_code"], regate.stdout + regate.stderr
    assert judged["verdict"] == said["verdict"] and judged["closing"] == said["closing"]
    plain = mbx("campaign", "regate", "search-h100", "-w", str(workspace), env=env)
    assert plain.returncode == said["exit_code"] and said["closing"] in plain.stdout
    accepted = mbx(
        "campaign", "regate", "search-h100", "-w", str(workspace), "--json", "--inconclusive-ok", env=env
    )
    assert accepted.returncode == json.loads(accepted.stdout)["exit_code"] == 0


def test_a_search_best_that_fails_a_new_gate_is_no_best_anywhere(refused_search, mbx, write_campaign) -> None:
    """regate --file with a gate the best (and its tie) fails: the search's answer is judged again by freeze's
    rule, so regate, status, the report and freeze all say FAIL (before: the stored PASS/tie, exit 0/3)."""
    _result, workspace, env = refused_search
    data = h200_search()
    data["gates"]["tflops_per_gpu_min"] = 400  # the replayed log makes 349 TFLOP/s
    regate = mbx("campaign", "regate", "search-h100", "-w", str(workspace), "-f", str(write_campaign(data)),
                 "--no-report", "--json", env=env)  # fmt: skip
    assert regate.returncode == 1, regate.stdout + regate.stderr
    said = json.loads(regate.stdout)
    assert said["verdict"] == "fail" and "search FAIL: no best point" in said["closing"], said["closing"]
    assert "2 trial(s) failed" in said["closing"] and said["closing"] in regate.stderr
    status = mbx("campaign", "status", "search-h100", "-w", str(workspace), "--json", env=env)
    now = json.loads(status.stdout)
    assert (now["verdict"], now["exit_code"], now["closing"]) == ("fail", 1, said["closing"])
    summary = mbx("report", "search-h100", "-w", str(workspace), "-m", env=env).stdout
    assert "**FAIL** search grid" in summary and "exit 1" not in summary
    freeze = mbx("freeze", "search-h100", "-w", str(workspace), "-o", str(workspace.parent / "fz"), env=env)
    assert freeze.returncode == 1, freeze.stdout + freeze.stderr
    # the other way: a search whose every trial failed that gate, regated with a looser one, is no longer FAIL
    data["name"] = "search-strict"
    strict = mbx("campaign", "run", str(write_campaign(data, name="strict.yaml")), "-w", str(workspace),
                 "--no-report", "--no-wandb", env=env)  # fmt: skip
    assert strict.returncode == 1, strict.stdout + strict.stderr
    del data["gates"]["tflops_per_gpu_min"]
    loose = mbx("campaign", "regate", "search-strict", "-w", str(workspace), "-f", str(write_campaign(data)),
                "--no-report", "--json", env=env)  # fmt: skip
    said = json.loads(loose.stdout)
    assert said["verdict"] != "fail" and "(judged again with the current gates)" in said["closing"], said["closing"]
    freeze = mbx("freeze", "search-strict", "-w", str(workspace), "-o", str(workspace.parent / "fz2"), env=env)
    assert freeze.returncode == loose.returncode, freeze.stdout + freeze.stderr  # both: the best, or the tie


def test_a_command_searchs_steps_key_fits_its_trainer_or_is_refused_before_anything_is_written(
    mbx, write_campaign, tmp_path
) -> None:
    """Optuna prunes after a short run, set through sweep.search.steps_key: on a Megatron-LM command it defaults to
    params.train_iters (not the bundled trainer's training.steps, which the run refused only after it had made
    the workspace); a trainer.steps that overrides it is refused by validate, plan and run, naming what to set."""
    data = h200_search()
    data["sweep"]["search"] = {"method": "optuna", "budget": {"points": 2}}
    path = write_campaign(data)
    workspace = tmp_path / "ws"
    for command in (("campaign", "validate", str(path)), ("campaign", "plan", str(path)),
                    ("campaign", "run", str(path), "-w", str(workspace), "--no-wandb")):  # fmt: skip
        refused = mbx(*command)
        assert refused.returncode == 2, command
        assert "sweep.search.steps_key: 'params.train_iters' does not set a 5-step trial's length" in refused.stderr
        assert "trainer.steps (15) overrides params.train_iters" in refused.stderr and "prune: false" in refused.stderr
        assert "Traceback" not in refused.stderr
    assert not workspace.exists()  # nothing left behind
    del data["trainer"]["steps"]
    data["trainer"]["params"]["train_iters"] = 15
    path = write_campaign(data)
    assert mbx("campaign", "validate", str(path)).returncode == 0
    dry = mbx("campaign", "run", str(path), "-w", str(workspace), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "--train-iters 5" in dry.stdout and "at 5 steps" in dry.stdout  # the short run, its length set


# ---- `campaign plan` and `run --dry-run` share prepare --------------------------------------------------------
def _estimate_rows(text: str, first: str, count: int) -> list[str]:
    """The estimate columns (world, est GiB, gpu, headroom, feasible) of the `count` rows of the table whose
    header line starts with `first`, as text."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(first))
    column = lines[at].index("world")
    return [" ".join(line[column:].split()) for line in lines[at + 2 : at + 2 + count]]


def test_plan_and_dry_run_show_the_same_estimates_and_attempt_numbers(mbx, write_campaign, tmp_path) -> None:
    """`mbx campaign plan` and `mbx campaign run --dry-run` both go through lifecycle.prepare: the same memory
    estimates (hidden 12288 under the headroom gate on the H200) and the same attempt numbers (a run dir left on
    disk at attempt 1 makes both say 2)."""
    data = h200_search()
    del data["sweep"]["search"]
    data["name"] = "plain-h200"
    data["sweep"]["axes"]["params.hidden_size"] = [1024, 10240, 12288]
    path = write_campaign(data)
    workspace = tmp_path / "ws"
    plan_json = mbx("campaign", "plan", str(path), "-w", str(workspace), "--json")
    assert plan_json.returncode == 0, plan_json.stderr
    cells = {c["cell_id"]: c for c in json.loads(plan_json.stdout)}
    (first, second, third) = cells
    (workspace / "plain-h200" / first / "1").mkdir(
        parents=True
    )  # a leftover run dir: a run would number it 2
    plan_json = mbx("campaign", "plan", str(path), "-w", str(workspace), "--json")
    plan_text = mbx("campaign", "plan", str(path), "-w", str(workspace))
    dry = mbx("campaign", "run", str(path), "-w", str(workspace), "--dry-run")
    assert plan_text.returncode == dry.returncode == 0, plan_text.stderr + dry.stdout + dry.stderr
    attempts = {c["cell_id"]: c["attempt"] for c in json.loads(plan_json.stdout)}
    assert attempts == {first: 2, second: 1, third: None}  # the infeasible point is not run: no attempt
    rendered = dict(re.findall(r"--run-dir \S+/plain-h200/([0-9a-f]+-r\d+)/(\d+) ", dry.stdout))
    assert {cell: int(n) for cell, n in rendered.items()} == {first: 2, second: 1}
    planned = _estimate_rows(plan_text.stdout, "#  cell id", 3)
    dry_rows = _estimate_rows(dry.stdout, "point ", 3)
    assert planned == dry_rows, (planned, dry_rows)
    assert planned[0].endswith(" ok") and planned[1].endswith(" ok") and "INFEASIBLE" in planned[2], planned
    why = "point [hidden_size=12288]: memory: estimated headroom 7.91 GiB on the H200"
    assert why in plan_text.stdout and why in dry.stdout


def test_a_searchs_plan_and_dry_run_rule_out_the_same_points(mbx, write_campaign, tmp_path) -> None:
    data = h200_search(budget_points=3)
    data["sweep"]["axes"]["params.hidden_size"] = [1024, 12288, 8192]
    path = write_campaign(data)
    plan = mbx("campaign", "plan", str(path), "--json")
    assert plan.returncode == 0, plan.stderr
    feasible = [c["estimate"]["feasible"] for c in json.loads(plan.stdout)]
    assert feasible == [True, False, True]
    dry = mbx("campaign", "run", str(path), "-w", str(tmp_path / "ws"), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "search grid over 2 feasible point(s) (1 infeasible)" in dry.stdout
    assert "search grid would first run 2 point(s) at 15 steps (2 cell(s))" in dry.stdout
    assert not (tmp_path / "ws").exists()  # nothing written


def test_the_search_takes_no_lock_registers_nothing_and_writes_no_report_of_its_own() -> None:
    """Registration, locking, the report and the W&B outcome happen in lifecycle.execute only; the search's
    modules decide and record trials, and reach the lifecycle only through the runner it passes them."""
    for name in ("search_run.py", "search_evaluators.py", "search_strategies.py"):
        source = (ROOT / "orchestrator" / "flow" / name).read_text()
        for word in ("CampaignLock", "register_campaign", "write_report", "log_outcome", "flow.lifecycle"):
            assert word not in source, f"orchestrator/flow/{name} names {word}"


def test_compare_run_of_two_search_files_runs_every_point_of_each(mbx, write_campaign, tmp_path) -> None:
    """`mbx compare --run` compares points, it does not search: each side's whole grid runs, as before issue 34."""
    files = []
    for name in ("ab-a", "ab-b"):
        data = h200_search()
        data["name"] = name
        data["sweep"]["axes"]["params.hidden_size"] = [1024, 8192]
        files.append(str(write_campaign(data, name=f"{name}.yaml")))
    workspace = tmp_path / "ws"
    proc = mbx("compare", "--run", *files, "-w", str(workspace))
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr  # 3: the replayed logs are the same (a tie)
    with Store(workspace) as store:
        for name in ("ab-a", "ab-b"):
            assert {a.state for a in store.attempts(name)} == {"completed"}
            assert len(store.attempts(name)) == 2 and store.trials(name) == []
