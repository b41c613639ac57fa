"""`mbx compare` end to end on stores built from the real H200 run dirs (tests/data/h200-samples): exit
codes, the table, --json, --markdown, --pair, the fingerprint line, the diagnosis and hardware refusal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from orchestrator.run.store import CellRow, Store
from reports.window import summarize
from trainer import rundir

SAMPLES = ROOT / "tests" / "data" / "h200-samples" / "aa-samples-h200"
BASE, CAPACITY, FUSED = "45ad6c6851", "a8ddbee1ab", "7db0e86111"
PARAMS = {
    BASE: {"model.moe.capacity_factor": None, "model.moe.pad_to_capacity": False},
    CAPACITY: {"model.moe.capacity_factor": 1.0, "model.moe.pad_to_capacity": True},
    FUSED: {"cross_entropy": "fused"},
}
# `mbx compare` through the real entry point (orchestrator.cli.app.main: clean errors, exit codes).
RUNNER = (
    "import sys\n"
    "from orchestrator.cli.app import main\n"
    "sys.argv[0] = 'mbx'\n"
    "main()\n"
)

pytestmark = pytest.mark.skipif(not SAMPLES.is_dir(), reason="h200 samples not present")


def add_campaign(workspace: Path, name: str, cells: list[tuple[str, int]], *, gpu: str | None = None,
                 fingerprint: dict | None = None) -> None:  # fmt: skip
    """Register `name` with the recorded repeats [(point, repeat)], copy their run dirs in, record results."""
    rows = [CellRow(campaign=name, cell_id=f"{p}-r{r}", point_id=p, repeat=r, ordinal=i, label=p,
                    params=PARAMS[p], recipe={}, resources={}, env={}) for i, (p, r) in enumerate(cells)]  # fmt: skip
    with Store(workspace) as store:
        store.register_campaign(name, None, {"collect": {"window": 10}}, "local", rows)
        for cell in rows:
            attempt = store.reserve_attempt(name, cell.cell_id, "local",
                                            lambda n, c=cell: workspace / name / c.cell_id / str(n))  # fmt: skip
            run_dir = Path(attempt.run_dir)
            for item in (SAMPLES / cell.cell_id / "1").iterdir():
                shutil.copy(item, run_dir / item.name)
            if gpu:
                status = rundir.read_status(run_dir) or {}
                rundir.write_json(run_dir / rundir.STATUS, {**status, "gpu_name": gpu})
            if fingerprint:
                launch = rundir.read_launch(run_dir) or {}
                launch["fingerprint"] = {**launch.get("fingerprint", {}), **fingerprint}
                rundir.write_launch(run_dir, launch)
            summary = summarize(rundir.read_metrics(run_dir)).to_dict()
            store.record_outcome(name, cell.cell_id, attempt.attempt, "completed", None, None, summary, None)


def compare(workspace: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run([sys.executable, "-c", RUNNER, "compare", "--workspace", str(workspace), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("cmp")
    add_campaign(ws, "base", [(BASE, r) for r in range(4)])
    add_campaign(ws, "base-early", [(BASE, r) for r in (0, 1)])
    add_campaign(
        ws, "base-late", [(BASE, r) for r in (2, 3)], fingerprint={"torch": "2.12.0", "git_sha": "b" * 7}
    )
    add_campaign(ws, "capacity", [(CAPACITY, r) for r in range(4)])
    add_campaign(ws, "fused", [(FUSED, r) for r in range(4)])
    add_campaign(ws, "sweep", [(p, r) for p in (BASE, CAPACITY, FUSED) for r in range(4)])
    add_campaign(ws, "sweep-fused-only", [(FUSED, r) for r in range(2)])
    add_campaign(ws, "other-gpu", [(BASE, r) for r in range(4)], gpu="NVIDIA B200")
    add_campaign(ws, "one", [(BASE, 0)])
    add_campaign(ws, "one-fused", [(FUSED, 0)])
    return ws


def test_identical_campaigns_are_same(workspace: Path) -> None:
    proc = compare(workspace, "base", "base")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1] == ("PASS base → base (practical threshold 1.0%), compare SAME: "
                                                     "every metric SAME, below the threshold or better")
    assert "fingerprint: no difference" in proc.stdout


def test_fused_cross_entropy_is_worse_with_recompute_diagnosis(workspace: Path) -> None:
    proc = compare(workspace, "base", "fused", "--json")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    (pair,) = data["pairs"]
    metrics = pair["metrics"]
    assert metrics["step_time"]["decision"] == "different" and metrics["step_time"]["change"] > 0.15
    assert metrics["tflops"]["decision"] == "different" and metrics["tflops"]["change"] < -0.13
    assert metrics["peak_alloc"]["decision"] == "different" and metrics["peak_alloc"]["change"] < -0.14
    assert metrics["final_loss"]["decision"] in ("same", "below-practical")
    assert set(pair["worse"]) == {"step_time", "tflops"}
    assert any("recompute (or offload) newly on?" in line for line in pair["diagnosis"])
    assert data["exit_code"] == 1
    low, high = metrics["step_time"]["ci_low"], metrics["step_time"]["ci_high"]
    assert low < metrics["step_time"]["change"] < high


def test_static_capacity_needs_more_repeats(workspace: Path) -> None:
    proc = compare(workspace, "base", "capacity", "--metric", "step_time", "--metric", "peak_alloc")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "needs more samples" in proc.stdout and "more repeat(s) per side suggested" in proc.stdout
    (row,) = [line for line in proc.stdout.splitlines() if "peak allocated" in line]
    assert "exact, floor ±1.00%" in row and "SAME" in row  # +0.02% (8 MiB), within the 1% floor
    assert "final loss" not in proc.stdout


def test_per_metric_practical_thresholds(workspace: Path) -> None:
    proc = compare(workspace, "base", "capacity", "--metric", "step_time", "--metric", "tflops",
                   "--min-effect", "0.5%,step_time=5%", "--json")  # fmt: skip
    data = json.loads(proc.stdout)
    assert data["min_effect"] == 0.005 and data["min_effects"] == {"step_time": 0.05}
    metrics = data["pairs"][0]["metrics"]
    assert metrics["step_time"]["decision"] == "same"  # +1.7%, its CI inside ±5%
    assert metrics["tflops"]["decision"] == "unknown"  # -1.7% against 0.5%: more repeats needed
    assert proc.returncode == 3
    table = compare(workspace, "base", "capacity", "--metric", "step_time", "--min-effect", "step_time=5%")
    assert table.returncode == 0 and "practical threshold 1.0%; step_time 5.0%" in table.stdout


def test_sweep_points_matched_by_swept_values_and_markdown(workspace: Path) -> None:
    proc = compare(workspace, "sweep", "sweep-fused-only", "--markdown")
    # fused vs fused repeats, an A/A of 4 vs 2: the step-time CI [-0.80%, +1.31%] is not inside ±1%, so UNKNOWN
    # (not SAME: a high p is no evidence of sameness), and nothing DIFFERENT
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.startswith("### mbx compare sweep → sweep-fused-only")
    assert "**sweep/7db0e86111 (7db0e86111, 4 rep) vs sweep-fused-only/7db0e86111" in proc.stdout
    assert "| step time (ms) |" in proc.stdout and "DIFFERENT (" not in proc.stdout
    assert proc.stdout.count("- unmatched:") == 2  # base and capacity have no partner


def test_explicit_pairs_within_one_campaign(workspace: Path) -> None:
    proc = compare(
        workspace, "sweep", "sweep", "--pair", f"{BASE}:{FUSED}", "--pair", f"{BASE}-r0:{BASE}", "--json"
    )
    assert proc.returncode == 1, proc.stderr
    pairs = json.loads(proc.stdout)["pairs"]
    assert [p["b"]["point_id"] for p in pairs] == [FUSED, BASE]
    assert pairs[1]["metrics"]["step_time"]["decision"] == "same"


def test_fingerprint_difference_is_the_first_suspect(workspace: Path) -> None:
    proc = compare(workspace, "base-early", "base-late")
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    assert "config: no difference in the resolved configuration" in proc.stdout
    assert "fingerprint differs (first suspect): torch: 2.11.0+cu130 → 2.12.0" in proc.stdout
    assert "git_sha: ? → bbbbbbb" in proc.stdout


def test_single_repeat_large_effect_and_small_effect(workspace: Path) -> None:
    data = json.loads(compare(workspace, "one", "one-fused", "--json").stdout)
    assert data["pairs"][0]["metrics"]["step_time"]["decision"] == "different"
    proc = compare(workspace, "one", "base", "--pair", f"{BASE}:{BASE}-r1", "--json")
    step = json.loads(proc.stdout)["pairs"][0]["metrics"]["step_time"]
    assert step["n_b"] == 4 and step["n_a"] == 1 and step["decision"] == "unknown"


def test_different_hardware_is_refused_unless_allowed(workspace: Path) -> None:
    proc = compare(workspace, "base", "other-gpu")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[0].startswith("error: ")
    assert "different GPU models are not compared" in proc.stderr and "Traceback" not in proc.stderr
    allowed = compare(workspace, "base", "other-gpu", "--allow-different-hardware")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "gpu_name: NVIDIA H200 → NVIDIA B200" in allowed.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("base", "nope"), "campaign 'nope' is not in the store"),
        (("base", "fused", "--metric", "latency"), "--metric latency: unknown"),
        (("base", "fused", "--min-effect", "150"), "--min-effect 150: 150 is not a percent in [0, 100)"),
        (("base", "fused", "--min-effect", "latency=1%"), "unknown metric 'latency'"),
        (("base", "fused", "--min-effect", "step_time=x"), "'x' is not a number"),
        (("base", "fused", "--min-effect", "final_loss=200%"), "200 is not a percent in [0, 100)"),
        (("base", "fused", "--pair", "x"), "expected A_POINT_OR_CELL:B_POINT_OR_CELL"),
        (("base", "fused", "--pair", "zzz:7db0e86111"), "A has no point or cell 'zzz'"),
        (
            ("sweep", "capacity", "--pair", f"{CAPACITY}:{CAPACITY}", "--pair", f"{FUSED}:{BASE}"),
            "B has no point or cell",
        ),
    ],
)
def test_bad_input_exits_2_with_one_clean_line(workspace: Path, args: tuple[str, ...], message: str) -> None:
    proc = compare(workspace, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    first = proc.stderr.strip().splitlines()[0]
    assert first.startswith("error: ") and message in first and "Traceback" not in proc.stderr


def test_missing_workspace_is_bad_input(tmp_path: Path) -> None:
    proc = compare(tmp_path / "nothing", "a", "b")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
