"""A Megatron-Bridge command campaign through submitit on the real one-node Slurm, 2 ranks: every rank runs a fake
Bridge (tests/fixtures_cmd/fake_bridge.py) that prints the log of a real Megatron-Bridge 0.6.2 run on one H100
(tests/data/bridge-0.6.2/h100_sweep/, the base point: Bridge's config print, start-up, its own iteration, memory and
`Step Time` lines) up to the campaign's train.train_iters, and writes the resolved config Bridge wrote there where
`logger.save_config_filepath` says. mbx parses the ranks' logs, adds its own FLOPs count beside Bridge's
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
BRIDGE = ROOT / "tests" / "data" / "bridge-0.6.2"
LOG = BRIDGE / "h100_sweep" / "d1a49eaa0e_moe-token-dispatcher-type-alltoall.log"
CONFIG = BRIDGE / "bridge-config.yaml"


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
        assert [r["step"] for r in rows] == list(range(1, 21))  # stopped at train.train_iters, as Bridge does
        # Bridge's printed figure stays the figure: `Step Time : 1.28s GPU utilization: 93.1MODEL_TFLOP/s/GPU`,
        # printed before iteration 20's line (1276.6 ms), joins that row (reports/parsers/megatron_bridge.py)
        figures = [(r["step_time_ms"], r["tflops_per_gpu"], r["loss"]) for r in (rows[9], rows[19])]
        assert figures == [(1285.2, 92.5, 9.478099), (1276.6, 93.1, 8.282305)]
        assert all(r["tflops_per_gpu"] > 0 for r in rows)
        for row in rows:  # mbx's own count beside it, over the same step time and this run's 2 GPUs
            expected = flops / (row["step_time_ms"] / 1000) / 2 / 1e12
            assert row["extra"]["mbx_tflops_per_gpu"] == pytest.approx(expected)
        # the replayed log is one GPU's: its printed figure is twice the count over 2 GPUs (1% over steps 11-20)
        window = rows[10:]
        printed = sum(r["tflops_per_gpu"] * r["step_time_ms"] for r in window)
        counted = sum(2 * r["extra"]["mbx_tflops_per_gpu"] * r["step_time_ms"] for r in window)
        assert counted == pytest.approx(printed, rel=0.01)
        # every rank's log stops where Bridge would: no `Step Time` line of an iteration 21 it would not run
        printed_lines = [log.read_text().count("MODEL_TFLOP/s/GPU") for log in (run / "logs").glob("*.log")]
        assert printed_lines and set(printed_lines) == {20}, printed_lines
        for rank in (0, 1):
            record = json.loads((run / "logs" / f"jit-cache-rank{rank}.json").read_text())
            assert record["env"]["TRITON_CACHE_DIR"] == str(run / rundir.JIT_CACHE / f"rank-{rank}" / "triton")
        launch = json.loads((run / rundir.LAUNCH).read_text())
        assert launch["jit_caches"]["root"] == str(run / rundir.JIT_CACHE)
