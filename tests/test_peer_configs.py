"""The peer harness's configuration builders (benchmarks/peers.py) produce the MoE proxy's shapes. No GPU and
no peer library needed; the checks that build the peer's own config class skip when it is absent."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402


@pytest.fixture(scope="module")
def recipe():
    return peers.load_proxy()


def test_hf_kwargs_are_the_proxy_shapes(recipe):
    kw = peers.hf_config_kwargs(recipe)
    assert (kw["vocab_size"], kw["hidden_size"], kw["num_hidden_layers"]) == (151936, 2048, 8)
    assert (kw["num_attention_heads"], kw["num_key_value_heads"], kw["head_dim"]) == (32, 4, 128)
    assert (kw["num_experts"], kw["num_experts_per_tok"], kw["moe_intermediate_size"]) == (128, 8, 768)
    assert kw["decoder_sparse_step"] == 1 and kw["mlp_only_layers"] == []  # every layer MoE, as the proxy
    assert kw["norm_topk_prob"] and kw["output_router_logits"] and not kw["use_cache"]
    assert not kw["tie_word_embeddings"] and kw["max_position_embeddings"] == 4096


def test_mcore_kwargs_are_the_proxy_shapes(recipe):
    kw = peers.mcore_config_kwargs(recipe)
    assert (kw["num_layers"], kw["hidden_size"], kw["num_attention_heads"], kw["num_query_groups"]) == (
        8,
        2048,
        32,
        4,
    )
    assert (kw["kv_channels"], kw["num_moe_experts"], kw["moe_router_topk"], kw["moe_ffn_hidden_size"]) == (
        128,
        128,
        8,
        768,
    )
    assert kw["moe_router_force_load_balancing"] and kw["moe_grouped_gemm"] and kw["qk_layernorm"]
    assert kw["moe_token_dispatcher_type"] == "alltoall"
    assert peers.mcore_config_kwargs(recipe, "allgather")["moe_token_dispatcher_type"] == "allgather"
    assert not kw["add_bias_linear"] and kw["gated_linear_unit"] and kw["bf16"]


def test_parameter_count_matches_the_bundled_model(recipe):
    """The HF config's parameter count (Qwen3-MoE layout, plus its q/k norms) equals the trainer's model."""
    import torch

    from trainer.flops import padded_vocab_size
    from trainer.model import GPT

    kw = peers.hf_config_kwargs(recipe)
    h, layers, heads, kv, d = (
        kw["hidden_size"],
        kw["num_hidden_layers"],
        kw["num_attention_heads"],
        kw["num_key_value_heads"],
        kw["head_dim"],
    )
    e, f = kw["num_experts"], kw["moe_intermediate_size"]
    per_layer = h * (heads + 2 * kv) * d + heads * d * h + 2 * h + h * e + e * 3 * h * f
    hf_params = 2 * kw["vocab_size"] * h + h + layers * per_layer
    with torch.device("meta"):
        model = GPT(recipe.model, recipe.training.seq_length, padded_vocab_size(recipe.model.vocab_size, 1))
    ours = sum(p.numel() for p in model.parameters())
    assert padded_vocab_size(recipe.model.vocab_size, 1) == kw["vocab_size"]  # 151936 needs no padding
    assert ours == hf_params
    assert layers * 2 * d == 2048  # what HF adds: q_norm and k_norm weights per layer


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_hf_config_builds(recipe):
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(**peers.hf_config_kwargs(recipe))
    assert cfg.num_experts == 128 and cfg.head_dim == 128 and cfg.num_key_value_heads == 4


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or importlib.util.find_spec("megatron") is None,
    reason="megatron-core (and triton, which it imports) not installed",
)
def test_mcore_config_builds(recipe):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        **peers.mcore_config_kwargs(recipe),
        activation_func=F.silu,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
    )
    assert cfg.num_moe_experts == 128 and cfg.moe_ffn_hidden_size == 768


def test_ep_peers_are_listed_with_their_layout_and_batch(recipe):
    """Issue 24: megatron-core with EP = 2 on 2 GPUs, 16 sequences per GPU per step, the same shapes."""
    listed = peers.describe()
    for name, overlap in (("mcore-te-ep2", False), ("mcore-te-ep2-a2a-overlap", True)):
        peer = listed[name]
        cfg = peer["config"]
        assert cfg["expert_model_parallel_size"] == 2 and cfg["moe_token_dispatcher_type"] == "alltoall"
        assert cfg["moe_permute_fusion"] and cfg["moe_grouped_gemm"] and cfg["num_moe_experts"] == 128
        assert cfg.get("overlap_moe_expert_parallel_comm", False) is overlap
        assert cfg.get("delay_wgrad_compute", False) is overlap
        assert peer["layout"] == {"gpus": 2, "expert_parallel": 2, "data_parallel": 2, "experts_per_gpu": 64}
        assert (peer["micro_batch"], peer["accumulation_per_rank"], peer["global_batch"]) == (2, 8, 32)
        assert peer["sequences_per_gpu_per_step"] == 16 and peer["ddp"]["overlap_grad_reduce"]
        assert peer["env"]["NCCL_NVLS_ENABLE"] == "0" and peer["env"]["NVTE_USE_CUTLASS_GROUPED_GEMM"] == "1"
    assert "expert_model_parallel_size" not in peers.mcore_config_kwargs(recipe)  # the 1-GPU peers unchanged
    argv = peers.peer_argv("mcore-te-ep2", 12)
    assert argv[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    assert argv[-3:] == ["_child", "mcore-te-ep2", "12"] and peers.peer_argv("mcore-te", 12)[2:] == ["_child",
                                                                                                   "mcore-te", "12"]


def test_ep_peer_flops_are_per_gpu_of_the_doubled_batch(recipe):
    from trainer.flops import step_flops

    doubled = peers.load_proxy(gpus=2)
    assert doubled.training.global_batch_size == 2 * recipe.training.global_batch_size
    assert step_flops(doubled, 2).total / 2 == pytest.approx(step_flops(recipe, 1).total)


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
def test_mcore_ep_config_builds(recipe):
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(**peers.mcore_config_kwargs(recipe, ep=2), activation_func=F.silu)
    assert cfg.expert_model_parallel_size == 2
