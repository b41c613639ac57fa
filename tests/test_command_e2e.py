"""Command trainers end to end: a real program replays a real Megatron log; launch, log following, collection,
gates, status and report run for real, and the collected window equals what the replayed log says."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from reports.parsers import parse_log
from trainer import rundir

FAKE = ROOT / "tests" / "fixtures_cmd" / "fake_megatron.py"
LOGS = ROOT / "tests" / "data" / "megatron" / "logs"
LM_LOG = LOGS / "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"  # 15 steps, argument dump
BRIDGE_LOG = LOGS / "megatron_bridge__pr841_profiler_wrapped__excerpt.log"  # wrapped lines, Bridge Step Time
ITERATION = re.compile(
    r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+) \| "
    r"throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+) \|.*?global batch size:\s+(\d+)"
)


def hostile(tmp_path: Path) -> str:
    return f"a b 'c' \"d\" $(touch {tmp_path}/pwned) `touch {tmp_path}/pwned2`; rm -rf {tmp_path}/x\nnext {{x}} ${{HOME}}"


def expected_window(slowdown: float, window: int = 10) -> dict[str, float]:
    """The window figures recomputed from the raw log text, as the fake program rewrites it."""
    steps = []
    for line in LM_LOG.read_text().splitlines():
        m = ITERATION.search(line)
        if m:
            ms = float(f"{float(m.group(2)) * slowdown:.1f}")
            tflops = float(f"{float(m.group(3)) / slowdown:.1f}")
            steps.append((int(m.group(1)), ms, tflops, int(m.group(4))))
    assert [s[0] for s in steps] == list(range(1, 16))
    win = [s for s in steps if s[0] > 1][-window:]
    total = sum(ms for _, ms, _, _ in win)
    seq_length, world = 2048, 1  # from the log's argument dump
    return {
        "window_first_step": win[0][0],
        "window_last_step": win[-1][0],
        "step_time_ms": total / len(win),
        "tflops_per_gpu": sum(t * ms for _, ms, t, _ in win) / total,
        "tokens_per_s_per_gpu": sum((gbs * seq_length / (ms / 1000) / world) * ms for _, ms, _, gbs in win)
        / total,
    }


def test_command_campaign_replays_megatron_log(mbx, write_campaign, tmp_path):
    value = hostile(tmp_path)
    path = write_campaign(
        {
            "name": "replay",
            "trainer": {
                "kind": "command",
                "command": [
                    sys.executable,
                    str(FAKE),
                    "--replay",
                    str(LM_LOG),
                    "--echo",
                    "{run_dir}/echo.json",
                ],
                "params": {
                    "run_name": value,
                    "use_mcore_models": True,
                    "moe_layer_freq": [1, 0],
                    "bf16": False,
                },
                "log_format": "megatron-lm",
            },
            "sweep": {"axes": {"fake_slowdown": [1.0, 2.0], "env.NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": [64]}},
            "env": {"values": {"HOSTILE_VALUE": value}},
            "gates": {"tflops_per_gpu_min": 200, "nan_iterations_max": 0},
            "launchers": {"local": {"parallel": 2}},
            "wandb": {"mode": "disabled"},
        }
    )
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace))
    assert result.returncode == 1, result.stdout + result.stderr  # slowdown 2 halves TFLOP/s: gate fails
    assert "FAIL 2/2 completed" in result.stdout
    assert "tflops_per_gpu_min: 174.7 TFLOP/s is below the minimum 200" in result.stdout

    status = json.loads(mbx("campaign", "status", "replay", "--workspace", str(workspace), "--json").stdout)["cells"]
    by_slowdown = {cell["params"]["fake_slowdown"]: cell for cell in status}
    assert by_slowdown[1.0]["verdict"] == "pass" and by_slowdown[2.0]["verdict"] == "fail"
    for slowdown, cell in by_slowdown.items():
        assert cell["state"] == "completed" and cell["failure_class"] is None
        summary, want = cell["summary"], expected_window(slowdown)
        assert summary["steps"] == 15 and summary["window_steps"] == 10
        assert summary["window_first_step"] == want["window_first_step"] == 6
        assert summary["window_last_step"] == want["window_last_step"] == 15
        for key in ("step_time_ms", "tflops_per_gpu", "tokens_per_s_per_gpu"):
            assert summary[key] == pytest.approx(want[key], rel=1e-9), key
        assert summary["peak_alloc_gib"] == pytest.approx(20306.24 / 1024)

        run = Path(cell["run_dir"])
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == list(range(1, 16))
        run_status = json.loads((run / "status.json").read_text())
        assert (
            run_status["exit_code"] == 0
            and run_status["steps_completed"] == run_status["steps_planned"] == 15
        )

        # the argv arrived as a list: every hostile value verbatim, nothing run by a shell
        echo = json.loads((run / "echo.json").read_text())
        argv = echo["argv"][1:]
        assert argv[argv.index("--run-name") + 1] == value
        assert argv[argv.index("--fake-slowdown") + 1] == str(slowdown)
        assert "--use-mcore-models" in argv and "--bf16" not in argv
        assert argv[argv.index("--moe-layer-freq") + 1 : argv.index("--moe-layer-freq") + 3] == ["1", "0"]
        assert echo["env"]["HOSTILE_VALUE"] == value
        assert echo["env"]["NUM_OF_TOKENS_PER_CHUNK_COMBINE_API"] == "64"
        recipe = (run / "recipe.yaml").read_text()
        assert str(run / "echo.json") in recipe, "recipe.yaml records the argv that ran"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()

    page = (workspace / "replay" / "report" / "index.html").read_text()
    assert all(cell["cell_id"] in page for cell in status)
    report = mbx("report", "replay", "--workspace", str(workspace), "--markdown")
    assert report.returncode == 0 and "replay" in report.stdout

    again = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report")
    assert "2 skipped: already completed" in again.stdout


def test_bridge_style_command_and_log(mbx, write_campaign, tmp_path):
    value = hostile(tmp_path)
    path = write_campaign(
        {
            "name": "bridge",
            "trainer": {
                "kind": "command",
                "command": [
                    sys.executable,
                    str(FAKE),
                    "--replay",
                    str(BRIDGE_LOG),
                    "--echo",
                    "{run_dir}/echo.json",
                ],
                "style": "megatron-bridge",
                "log_format": "megatron-bridge",
                "params": {"model": {"moe_flex_dispatcher_num_sms": 16}, "logger.name": value},
            },
            "sweep": {"axes": {"model.moe_expert_rank_capacity_factor": [1.5]}},
            "wandb": {"mode": "disabled"},
        }
    )
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report")
    assert result.returncode == 0, result.stdout + result.stderr
    (cell,) = json.loads(mbx("campaign", "status", "bridge", "--workspace", str(workspace), "--json").stdout)["cells"]
    run = Path(cell["run_dir"])
    echo = json.loads((run / "echo.json").read_text())
    # the swept key joins its section (params are nested by dotted path), the hostile value stays verbatim
    assert echo["unknown"] == [
        "model.moe_flex_dispatcher_num_sms=16",
        "model.moe_expert_rank_capacity_factor=1.5",
        f"logger.name={value}",
    ]
    rows = rundir.read_metrics(run)
    # the rows collected while the program ran equal the parser's reading of the replayed file
    assert rows == json.loads(json.dumps(parse_log(BRIDGE_LOG, "megatron-bridge")))
    assert [r["step"] for r in rows] == [10, 20]
    assert rows[-1]["tflops_per_gpu"] == 58.2  # from Bridge's "Step Time ... GPU utilization" line
    assert cell["summary"]["window_steps"] == 1 and cell["summary"]["tflops_per_gpu"] == 58.2


def test_hung_after_finish_is_cancelled_and_keeps_results(mbx, write_campaign, tmp_path):
    path = write_campaign(
        {
            "name": "hangs",
            "trainer": {
                "kind": "command",
                "command": [sys.executable, str(FAKE), "--replay", str(LM_LOG), "--sleep-s", "0.01"],
                "params": {"hang_s": 120},
            },
            "collect": {"exit_grace_s": 1},
            "wandb": {"mode": "disabled"},
        }
    )
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hung after finishing: all 15/15 steps logged, no exit in 1 s" in result.stdout
    (cell,) = json.loads(mbx("campaign", "status", "hangs", "--workspace", str(workspace), "--json").stdout)["cells"]
    assert cell["state"] == "completed" and cell["failure_class"] == "hung_after_finish"
    assert cell["verdict"] == "pass" and cell["summary"]["window_steps"] == 10
    assert cell["summary"]["tflops_per_gpu"] == pytest.approx(
        expected_window(1.0)["tflops_per_gpu"], rel=1e-9
    )
    run = Path(cell["run_dir"])
    exit_info = json.loads((run / "exit.json").read_text())
    assert exit_info["exit_code"] != 0, "the hung process was stopped"
    table = mbx("campaign", "status", "hangs", "--workspace", str(workspace))
    assert "hung_after_finish" in table.stdout
    assert "hung_after_finish" in (workspace / "hangs" / "report" / "index.html").read_text()
