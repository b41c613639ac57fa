"""A Megatron-Bridge ConfigContainer read without Bridge: overrides, Megatron flags, FLOPs, the plan's estimate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from orchestrator.spec import bridge_config
from trainer.bridge_args import field_overrides
from trainer.memory import estimate_megatron

CONFIG = ROOT / "tests" / "data" / "bridge-0.6.2" / "bridge-config.yaml"
CAMPAIGN = ROOT / "campaigns" / "bridge_qwen3_30b_a3b_1gpu.yaml"


def test_field_overrides_follow_run_recipe_grammar():
    argv = ["python3", "-m", "trainer.bridge_entry", "--recipe", "r", "--dataset", "mock", "-mb", "2",
            "--global_batch_size=16", "model.num_layers=4", "+extra.key=1", "~dropped=1", "--mode", "pretrain"]
    assert field_overrides(argv) == [
        ("dataset.mock", "true"), ("train.micro_batch_size", "2"), ("train.global_batch_size", "16"),
        ("model.num_layers", "4"), ("extra.key", "1"),
    ]  # fmt: skip


def test_overrides_change_a_copy_with_hydra_values():
    base = bridge_config.read(CONFIG)
    out = bridge_config.with_overrides(base, ["model.num_layers=8", "model.cuda_graph_scope=[]",
                                              "model.moe_flex_dispatcher_backend=null", "-mb", "2"])  # fmt: skip
    assert (out["model"]["num_layers"], out["model"]["cuda_graph_scope"]) == (8, [])
    assert out["model"]["moe_flex_dispatcher_backend"] is None and out["train"]["micro_batch_size"] == 2
    assert base["model"]["num_layers"] == 4 and base["train"]["micro_batch_size"] == 1


def test_flags_and_flops_of_the_shrunk_qwen3_recipe():
    config = bridge_config.read(CONFIG)
    flags = bridge_config.megatron_flags(config, 1)
    assert flags["num-experts"] == 128 and flags["moe-router-topk"] == 8 and flags["swiglu"] is True
    assert flags["group-query-attention"] and flags["num-query-groups"] == 4 and flags["kv-channels"] == 128
    # Megatron-LM's accounting by hand: 8 × 4096 tokens, 4 MoE layers of Qwen3-30B-A3B, vocab 151936
    tokens, h, s, q, kv, moe_ffn, k, vocab = 8 * 4096, 2048, 4096, 4096, 512, 768, 8, 151936
    per_token = 4 * 6 * (h * (q + 2 * kv) + q * s + q * h) + 4 * 6 * h * moe_ffn * k * 3 + 6 * h * vocab
    assert bridge_config.step_flops(config, 1) == tokens * per_token
    assert 50 < estimate_megatron(flags).peak_gib < 79  # fits an 80 GB card, as the campaign says


def test_not_a_config_is_refused(tmp_path: Path):
    bad = tmp_path / "x.yaml"
    bad.write_text(yaml.safe_dump({"model": 1}))
    with pytest.raises(bridge_config.BridgeConfigError, match="not a Bridge ConfigContainer"):
        bridge_config.read(bad)


def test_plan_estimates_each_point_from_the_resolved_config(tmp_path: Path, mbx):
    """With trainer.resolved_config the plan has an estimate per point (without it: none), and a point too
    large for the card is infeasible with the reason."""
    doc = yaml.safe_load(CAMPAIGN.read_text())
    shutil.copy(CONFIG, tmp_path / "base.yaml")
    doc["trainer"]["resolved_config"] = "base.yaml"
    doc["sweep"]["cells"] = [{"model.num_layers": 4}, {"train.micro_batch_size": 2}, {"model.num_layers": 12}]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = mbx("campaign", "plan", str(tmp_path / "c.yaml"), "--json")
    assert done.returncode == 0, done.stderr
    cells = {json.dumps(c["params"]): c for c in json.loads(done.stdout)}
    est = {k: (c.get("estimate") or {}).get("estimate_gib") for k, c in cells.items()}
    assert all(v for v in est.values()), est
    four, mb2, twelve = (est[json.dumps(p)] for p in ({"model.num_layers": 4}, {"train.micro_batch_size": 2},
                                                     {"model.num_layers": 12}))  # fmt: skip
    assert four < mb2 < twelve
    twelve_cell = cells[json.dumps({"model.num_layers": 12})]["estimate"]
    assert not twelve_cell["feasible"] and "GiB" in twelve_cell["reason"]
    del doc["trainer"]["resolved_config"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    plain = json.loads(mbx("campaign", "plan", str(tmp_path / "c.yaml"), "--json").stdout)
    assert all(not (c.get("estimate") or {}).get("estimate_gib") for c in plain)


def test_a_missing_resolved_config_is_bad_input(tmp_path: Path, mbx):
    doc = yaml.safe_load(CAMPAIGN.read_text())
    doc["trainer"]["resolved_config"] = "nowhere.yaml"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = mbx("campaign", "validate", str(tmp_path / "c.yaml"))
    assert done.returncode == 2 and "trainer.resolved_config" in done.stderr and "Traceback" not in done.stderr
