"""A Megatron-Bridge command campaign through submitit on the real one-node Slurm, 2 ranks: every rank runs a fake
Bridge (tests/fixtures_cmd/fake_bridge.py) that prints a real Bridge log (tests/data/megatron/logs/, Bridge's own
iteration, memory and `Step Time` lines) with the campaign's overrides, and writes the recorded resolved config
where `logger.save_config_filepath` says. mbx parses the ranks' logs, adds its own FLOPs count beside Bridge's
printed TFLOP/s, and gives each rank its own JIT caches under the run dir."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from orchestrator.spec import bridge_config
from trainer import rundir

pytest_plugins = ["slurm_cluster"]
pytestmark = pytest.mark.slurm

FAKE = ROOT / "tests" / "fixtures_cmd" / "fake_bridge.py"
LOG = ROOT / "tests" / "data" / "megatron" / "logs" / "megatron_bridge__pr841_profiler_wrapped__excerpt.log"
CONFIG = ROOT / "tests" / "data" / "bridge-0.6.2" / "bridge-config.yaml"


def test_a_bridge_campaign_on_slurm(slurm, mbx, tmp_path: Path, write_campaign) -> None:
    command = [sys.executable, str(FAKE), "--replay", str(LOG), "--config", str(CONFIG), "--recipe",
               "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", "--dataset", "mock",
               "logger.save_config_filepath={run_dir}/bridge-config.yaml", "{params}"]  # fmt: skip
    data = slurm.campaign("bridge-slurm")
    data.pop("sweep")
    data["trainer"] = {"kind": "command", "command": command, "style": "megatron-bridge",
                       "log_format": "megatron-bridge", "seq_length": 4096,
                       "params": {"train": {"train_iters": 20}, "model": {"num_layers": 4}}}  # fmt: skip
    data["sweep"] = {"axes": {"model.moe_token_dispatcher_type": ["alltoall", "allgather"]}}
    workspace = tmp_path / "ws"
    done = mbx("campaign", "run", str(write_campaign(data)), "--launcher", "submitit", "-w", str(workspace),
               env=slurm.env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2/2 completed" in done.stdout
    flops = bridge_config.step_flops(bridge_config.read(CONFIG), 2)
    run_dirs = sorted(p for p in (workspace / "bridge-slurm").glob("*/1") if p.is_dir())
    assert len(run_dirs) == 2
    for run in run_dirs:
        assert (run / rundir.BRIDGE_CONFIG).read_text() == CONFIG.read_text()
        rows = [json.loads(line) for line in (run / rundir.METRICS).read_text().splitlines()]
        assert [r["step"] for r in rows] == [10, 20]
        # Bridge's printed figure stays the figure: its `Step Time : 14.26s ... 58.2` equals iteration 20's elapsed
        # time (14260.3 ms), not iteration 10's, so it joins that row (reports/parsers/megatron_bridge.py)
        assert [r["tflops_per_gpu"] for r in rows] == [None, 58.2]
        for row in rows:  # mbx's own count beside it, over the same step time and 2 GPUs
            expected = flops / (row["step_time_ms"] / 1000) / 2 / 1e12
            assert row["extra"]["mbx_tflops_per_gpu"] == pytest.approx(expected)
        for rank in (0, 1):
            record = json.loads((run / "logs" / f"jit-cache-rank{rank}.json").read_text())
            assert record["env"]["TRITON_CACHE_DIR"] == str(run / rundir.JIT_CACHE / f"rank-{rank}" / "triton")
        launch = json.loads((run / rundir.LAUNCH).read_text())
        assert launch["jit_caches"]["root"] == str(run / rundir.JIT_CACHE)
