"""A Megatron-Bridge campaign frozen into a card item of Bridge's own shape (issue 33 #4): `mbx freeze` picks the
winner and writes a reproducing campaign; `mbx card export` → `items.pretrain_performance.<GPU>` with the
last-10-step figures, the portable gates, the precision read from the run's resolved Bridge config and the trainer's
own command line; then `mbx card validate` and `mbx card check`. The trainer is tests/fixtures_cmd/fake_bridge.py
replaying the logs of two real Megatron-Bridge 0.6.2 points trained on one H100 (tests/data/bridge-0.6.2/h100_sweep/:
the base point and micro-batch 2, each point its own log) and writing the resolved config Bridge wrote there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

FAKE = ROOT / "tests" / "fixtures_cmd" / "fake_bridge.py"
BRIDGE = ROOT / "tests" / "data" / "bridge-0.6.2"
BASE_LOG = BRIDGE / "h100_sweep" / "d1a49eaa0e_moe-token-dispatcher-type-alltoall.log"
MB2_LOG = BRIDGE / "h100_sweep" / "b38ba50a06_micro-batch-size-2.log"
CONFIG = BRIDGE / "bridge-config.yaml"


def test_freeze_and_card_of_a_bridge_campaign(tmp_path: Path, mbx, write_campaign) -> None:
    """Paths relative to the campaign file (a card is published: it keeps them relative). 15 iterations: the
    window is steps 6-15 of each real log."""
    copies = ((FAKE, "fake_bridge.py"), (BASE_LOG, "replay.log"), (MB2_LOG, "replay-mb2.log"),
              (CONFIG, "bridge-config.yaml"))  # fmt: skip
    for src, name in copies:
        shutil.copy(src, tmp_path / name)
    command = ["python3", "./fake_bridge.py", "--replay", "./replay.log", "--replay-when", "train.micro_batch_size=2",
               "./replay-mb2.log", "--config", "./bridge-config.yaml", "--recipe",
               "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", "--dataset", "mock",
               "logger.save_config_filepath={run_dir}/bridge-config.yaml", "{params}"]  # fmt: skip
    campaign = {"name": "bridgecard", "trainer": {"kind": "command", "command": command, "style": "megatron-bridge",
                "log_format": "megatron-bridge", "seq_length": 4096,
                "params": {"train": {"train_iters": 15, "micro_batch_size": 1}, "model": {"num_layers": 4}}},
                "sweep": {"axes": {"train.micro_batch_size": [1, 2]}},
                "gates": {"loss_finite": True}, "wandb": {"mode": "disabled"}}  # fmt: skip
    ws = tmp_path / "ws"
    done = mbx("campaign", "run", str(write_campaign(campaign)), "-w", str(ws))
    assert done.returncode == 0, done.stdout + done.stderr
    frozen = mbx("freeze", "bridgecard", "-w", str(ws), "--json")  # the best by the verdicts, as on the H100
    assert frozen.returncode == 0, frozen.stdout + frozen.stderr
    chosen = json.loads(frozen.stdout)
    (lost,) = chosen["rejected"]
    point = {1: lost["point_id"], 2: chosen["point_id"]}
    labels = [chosen["label"], lost["label"], lost["kind"]]
    assert labels == ["micro_batch_size=2", "micro_batch_size=1", "slower"]
    how = f"best TFLOP/s/GPU: the runner-up {point[1]} differs by -3"  # -37.6% over steps 6-15 (-38.8% at 21-30)
    assert chosen["how"].startswith(how), chosen["how"]
    assert "DIFFERENT" in chosen["how"]
    text = (ws / "bridgecard" / "frozen" / "FROZEN.md").read_text()
    assert text.startswith(f"# Frozen: bridgecard point `{point[2]}` [micro_batch_size=2]"), text
    card_file = tmp_path / "bridgecard.card.yaml"
    exported = mbx("card", "export", "bridgecard", "-p", point[2], "-w", str(ws), "-o", str(card_file))
    assert exported.returncode == 0, exported.stderr
    card = yaml.safe_load(card_file.read_text())
    (body,) = card["items"]["pretrain_performance"].values()
    assert body["precision"] == "bf16" and body["window_steps"] == 10
    metrics = body["metrics"]  # steps 6-15 of the micro-batch-2 log, read off it by hand
    assert metrics["last_10_steps_step_time_ms_avg"] == pytest.approx(826.64)
    assert metrics["last_10_steps_model_tflops_per_gpu_avg"] == pytest.approx(143.849, abs=5e-4)
    assert (metrics["initial_loss"], metrics["final_loss"]) == (12.3219, 8.20774)
    assert [(r["point"], r["kind"]) for r in body["rejected"]] == [(point[1], "slower")]
    assert body["trainer_command"].startswith("python3 ./fake_bridge.py --replay ./replay.log --replay-when")
    assert "logger.save_config_filepath={run_dir}/bridge-config.yaml" in body["trainer_command"]
    assert "train.micro_batch_size=2" in body["trainer_command"]
    assert body["campaign"]["trainer"]["style"] == "megatron-bridge"  # the frozen campaign reruns it
    assert mbx("card", "validate", str(card_file)).returncode == 0
    # the card gates every point: the frozen one passes, the base point (90 TFLOP/s, not 144) fails its thresholds
    checked = mbx("card", "check", "bridgecard", str(card_file), "-w", str(ws), "--json")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    as_json = json.loads(checked.stdout)
    assert as_json["exit_code"] == 1
    assert as_json["closing"].startswith(f"FAIL bridgecard against {card_file.name}: ")
    verdicts = {p["point_id"]: (p["verdict"], p["why"]) for p in as_json["points"]}
    assert verdicts[point[2]] == ("pass", "")
    assert verdicts[point[1]][0] == "fail" and "tflops_per_gpu_min: 89.8 TFLOP/s" in verdicts[point[1]][1]
