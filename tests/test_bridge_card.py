"""A Megatron-Bridge campaign frozen into a card item of Bridge's own shape (issue 33 #4): `mbx freeze` → a
reproducing campaign; `mbx card export` → `items.pretrain_performance.<GPU>` with the last-10-step figures, the
portable gates, the precision read from the run's resolved Bridge config and the trainer's own command line; then
`mbx card validate` and `mbx card check`. The trainer is tests/fixtures_cmd/fake_bridge.py replaying a real
Megatron log (Bridge prints Megatron-LM's iteration lines too) and writing the resolved config Bridge 0.6.2 wrote
on an H100 (tests/data/bridge-0.6.2/)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from conftest import MEGATRON_LOG, ROOT

FAKE = ROOT / "tests" / "fixtures_cmd" / "fake_bridge.py"
CONFIG = ROOT / "tests" / "data" / "bridge-0.6.2" / "bridge-config.yaml"


def test_freeze_and_card_of_a_bridge_campaign(tmp_path: Path, mbx, write_campaign) -> None:
    """Paths relative to the campaign file (a card is published: it keeps them relative)."""
    for src, name in ((FAKE, "fake_bridge.py"), (MEGATRON_LOG, "replay.log"), (CONFIG, "bridge-config.yaml")):
        shutil.copy(src, tmp_path / name)
    command = ["python3", "./fake_bridge.py", "--replay", "./replay.log", "--config", "./bridge-config.yaml", "--recipe",
               "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", "--dataset", "mock",
               "logger.save_config_filepath={run_dir}/bridge-config.yaml", "{params}"]  # fmt: skip
    campaign = {"name": "bridgecard", "trainer": {"kind": "command", "command": command, "style": "megatron-bridge",
                "log_format": "megatron-bridge", "params": {"train": {"train_iters": 15}, "model": {"num_layers": 4}}},
                "sweep": {"axes": {"model.moe_token_dispatcher_type": ["alltoall", "allgather"]}},
                "gates": {"loss_finite": True}, "wandb": {"mode": "disabled"}}  # fmt: skip
    ws = tmp_path / "ws"
    done = mbx("campaign", "run", str(write_campaign(campaign)), "-w", str(ws))
    assert done.returncode == 0, done.stdout + done.stderr
    cells = json.loads(mbx("campaign", "status", "bridgecard", "-w", str(ws), "--json").stdout)["cells"]
    point = cells[0]["point_id"]
    card_file = tmp_path / "bridgecard.card.yaml"
    exported = mbx("card", "export", "bridgecard", "-p", point, "-w", str(ws), "-o", str(card_file))
    assert exported.returncode == 0, exported.stderr
    card = yaml.safe_load(card_file.read_text())
    (body,) = card["items"]["pretrain_performance"].values()
    assert body["precision"] == "bf16" and body["window_steps"] == 10
    assert body["trainer_command"].startswith("python3 ./fake_bridge.py --replay ./replay.log")
    assert "logger.save_config_filepath={run_dir}/bridge-config.yaml" in body["trainer_command"]
    assert "model.moe_token_dispatcher_type=" in body["trainer_command"]
    assert set(body["metrics"]) >= {"last_10_steps_step_time_ms_avg", "last_10_steps_model_tflops_per_gpu_avg"}
    assert body["campaign"]["trainer"]["style"] == "megatron-bridge"  # the frozen campaign reruns it
    assert mbx("card", "validate", str(card_file)).returncode == 0
    checked = mbx("card", "check", "bridgecard", str(card_file), "-w", str(ws))
    assert checked.returncode == 0 and "PASS" in checked.stdout, checked.stdout + checked.stderr
    as_json = json.loads(mbx("card", "check", "bridgecard", str(card_file), "-w", str(ws), "--json").stdout)
    assert as_json["closing"].startswith(f"PASS bridgecard against {card_file.name}: ") and as_json["exit_code"] == 0
