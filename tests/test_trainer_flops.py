"""FLOPs per step against hand-computed Megatron-LM `num_floating_point_operations` values."""

from __future__ import annotations

import json
import subprocess
import sys

from trainer_helpers import ROOT, trainer_env, write_recipe

from trainer.flops import padded_vocab_size, step_flops
from trainer.recipe import Recipe

# Dense: MHA, squared ReLU (not SwiGLU: 2 stacked GEMMs), vocab 50257 padded to 50304, 4 GPUs × micro 2.
DENSE = {
    "model": {"vocab_size": 50257, "hidden_size": 1024, "num_layers": 4, "num_attention_heads": 16,
              "ffn_hidden_size": 4096, "activation": "squared_relu"},
    "training": {"seq_length": 2048, "micro_batch_size": 2},
}
# MoE: GQA 32 q / 4 kv heads of 128, SwiGLU, 16 experts top-4 of 768, one 1024 shared expert,
# MoE every 2nd layer (layers 0 and 2 of 4), dense layers 6144 wide, Qwen vocabulary 151936 (= 1187 · 128).
MOE = {
    "model": {"vocab_size": 151936, "hidden_size": 2048, "num_layers": 4, "num_attention_heads": 32,
              "num_query_groups": 4, "head_dim": 128, "ffn_hidden_size": 6144, "activation": "swiglu",
              "moe": {"num_experts": 16, "top_k": 4, "ffn_hidden_size": 768, "layer_freq": 2,
                      "num_shared_experts": 1, "shared_expert_ffn_hidden_size": 1024}},
    "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 4},
}


def test_padded_vocab_is_megatrons():
    assert padded_vocab_size(50257) == 50304  # ceil(50257 / 128) · 128 = 393 · 128
    assert padded_vocab_size(50257, tensor_parallel=2) == 50432  # multiple of 128 · 2: 197 · 256
    assert padded_vocab_size(151936) == 151936  # already 1187 · 128
    assert padded_vocab_size(200) == 256


def test_dense_flops_by_hand():
    f = step_flops(Recipe.model_validate(DENSE), world_size=4)
    tokens = 8 * 2048  # global batch = micro 2 × DP 4 = 8 sequences of 2048
    # Per token; q = kv = 16 heads · 64 = 1024; 6 = 3 (fwd, dgrad, wgrad) × 2 (FMA).
    # attention: 6·(h·(q + 2kv) + q·s/2·2 + q·h) = 6·(1024·3072 + 1024·2048 + 1024·1024) = 37,748,736 per layer
    attention = 4 * 37_748_736
    # dense MLP, not SwiGLU: 6·h·ffn·2 = 6·1024·4096·2 = 50,331,648 per layer
    mlp = 4 * 50_331_648
    # logits: 6·h·V_padded = 6·1024·50304
    logits = 309_067_776
    assert f.attention == tokens * attention
    assert f.mlp_dense == tokens * mlp
    assert f.moe_routed == 0 and f.moe_shared == 0
    assert f.logits == tokens * logits
    assert f.total == tokens * (attention + mlp + logits) == 10_836_202_487_808
    assert f.batch_size == 8 and f.padded_vocab_size == 50304


def test_moe_flops_by_hand():
    f = step_flops(Recipe.model_validate(MOE), world_size=1)
    tokens = 4 * 4096
    # q = 32·128 = 4096, kv = 4·128 = 512 (GQA).
    # attention: 6·(2048·(4096 + 2·512) + 4096·4096 + 4096·2048) = 6·35,651,584 = 213,909,504 per layer, 4 layers
    attention = 4 * 213_909_504
    # SwiGLU: factor 3. Layers 0, 2 are MoE; 1, 3 dense.
    mlp_dense = 2 * (6 * 2048 * 6144 * 3)  # = 2 · 226,492,416
    moe_routed = 2 * (6 * 2048 * 768 * 4 * 3)  # top-4 experts of 768: 2 · 113,246,208
    moe_shared = 2 * (6 * 2048 * 1024 * 3)  # 2 · 37,748,736
    logits = 6 * 2048 * 151936  # = 1,866,989,568
    assert (mlp_dense, moe_routed, moe_shared) == (452_984_832, 226_492_416, 75_497_472)
    assert f.attention == tokens * attention == tokens * 855_638_016
    assert f.mlp_dense == tokens * mlp_dense
    assert f.moe_routed == tokens * moe_routed
    assert f.moe_shared == tokens * moe_shared
    assert f.logits == tokens * logits
    assert f.total == tokens * (855_638_016 + 452_984_832 + 226_492_416 + 75_497_472 + 1_866_989_568)


def _megatron_transcription(a: dict, batch_size: int) -> float:
    """Megatron's transformer_flops() expression, transcribed term by term (floats, `s / 2 * 2`)."""
    m, s = a["model"], a["training"]["seq_length"]
    moe = m.get("moe")
    h, layers, heads = m["hidden_size"], m["num_layers"], m["num_attention_heads"]
    groups = m.get("num_query_groups") or heads
    kv_channels = m.get("head_dim") or h // heads
    pattern = [1 if i % moe["layer_freq"] == 0 else 0 for i in range(layers)] if moe else [0] * layers
    num_moe, num_dense = sum(pattern), layers - sum(pattern)
    topk = moe["top_k"] if moe else 0
    moe_ffn = moe["ffn_hidden_size"] if moe else m["ffn_hidden_size"]
    shared = (moe or {}).get("shared_expert_ffn_hidden_size") or 0
    ffn_factor = 3 if m["activation"] == "swiglu" else 2
    qp, kp = kv_channels * heads, kv_channels * groups
    self_attn = 3 * 2 * (h * (qp + kp + kp) + qp * s / 2 * 2 + qp * h) * layers
    return batch_size * s * (
        3 * 2 * h * (m["ffn_hidden_size"] * ffn_factor * num_dense + moe_ffn * topk * ffn_factor * num_moe
                     + shared * ffn_factor * num_moe)
        + self_attn
        + 3 * 2 * h * padded_vocab_size(m["vocab_size"])
    )


def test_matches_megatron_expression():
    assert step_flops(Recipe.model_validate(DENSE), 4).total == _megatron_transcription(DENSE, 8)
    assert step_flops(Recipe.model_validate(MOE), 1).total == _megatron_transcription(MOE, 4)


def test_flops_cli_prints_json_without_importing_torch(tmp_path):
    recipe = write_recipe(tmp_path / "dense.yaml", DENSE)
    code = (
        "import sys; from trainer.__main__ import run; "
        f"rc = run(['flops', '--recipe', {str(recipe)!r}, '--world-size', '4']); "
        "assert 'torch' not in sys.modules, 'the flops path imported torch'; sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=trainer_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["total"] == 10_836_202_487_808
    assert out["attention"] + out["mlp_dense"] + out["moe_routed"] + out["moe_shared"] + out["logits"] == out["total"]
    assert out["world_size"] == 4 and out["batch_size"] == 8
