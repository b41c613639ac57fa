"""Model FLOPs per training step, with Megatron-LM's accounting (pure Python: no torch).

This is `num_floating_point_operations(args, batch_size)` of Megatron-LM
megatron/training/training.py (read at commit 001b00c2734d8f0fad096fe48a382fedf755d321),
its non-hybrid `transformer_flops()` path without MLA, MTP, linear attention or MoE latent:

    total = B · s · [ 6h·( ffn·f·L_dense + moe_ffn·k·f·L_moe + shared_ffn·f·L_moe )
                      + L · 6·( h·(q + 2·kv) + q·s/2·2 + q·h )
                      + 6·h·V_padded ]

with B sequences per step (the global batch), s the sequence length, h the hidden size,
f = 3 for SwiGLU (gate and up GEMMs stacked: h→2·ffn and ffn→h) else 2,
q = kv_channels · heads and kv = kv_channels · query_groups (GQA), k = router top-k.
The factor 6 = 3 (forward, backward dgrad, backward wgrad) × 2 (one FMA = 2 FLOPs).
Causal attention counts half the s² score matrix (s/2), for QKᵀ and for (QKᵀ)V.
Not counted, as in Megatron: router GEMM, norms, RoPE, softmax, activations,
activation recomputation and the zero rows of capacity padding.

Vocabulary: Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by (128)
× TP (`_vocab_size_with_padding`, megatron/training/tokenizer/tokenizer.py) and counts the logits
GEMM with `args.padded_vocab_size`. We do the same, and the bundled model pads its embedding and
output layer the same way, so our numbers compare with published Megatron TFLOP/s/GPU figures.

TFLOP/s/GPU = flops_per_step / step_time_s / world_size / 1e12.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from trainer.recipe import Recipe

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128  # Megatron's --make-vocab-size-divisible-by default


def padded_vocab_size(vocab_size: int, tensor_parallel: int = 1,
                      divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> int:
    """Megatron's `_vocab_size_with_padding`: round up to a multiple of divisible_by × TP."""
    multiple = divisible_by * tensor_parallel
    return int(math.ceil(vocab_size / multiple) * multiple)


def moe_layer_pattern(num_layers: int, layer_freq: int) -> list[int]:
    """1 where the layer is MoE: layers 0, freq, 2·freq, ... (Megatron's int --moe-layer-freq)."""
    return [1 if i % layer_freq == 0 else 0 for i in range(num_layers)]


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one optimizer step (forward + backward), split by where they go."""

    attention: int  # QKV and output projections plus the causal core (QKᵀ, ·V)
    mlp_dense: int  # dense-layer MLPs
    moe_routed: int  # routed experts: top-k × expert MLP per token
    moe_shared: int  # shared experts
    logits: int  # output layer over the padded vocabulary
    total: int
    batch_size: int  # sequences per step (global batch)
    seq_length: int
    padded_vocab_size: int

    def to_dict(self) -> dict:
        return asdict(self)


def transformer_flops(*, tokens: int, seq_length: int, hidden: int, num_layers: int, moe_layers: int, ffn: int,
                      q: int, kv: int, padded_vocab: int, moe_ffn: int = 0, top_k: int = 0, shared_ffn: int = 0,
                      gated: bool = True) -> dict[str, int]:
    """The formula above, by part, for `tokens` tokens of `seq_length` (the one place it is written: the bundled
    recipe's `step_flops` and a Megatron command's shape, orchestrator/spec/bridge_config.py, both call it)."""
    f = 3 if gated else 2
    dense_layers = num_layers - moe_layers
    # Megatron writes the core term `q * s / 2 * 2`; we keep it in integers (q·s) to stay exact.
    attn_per_layer = 6 * (hidden * (q + 2 * kv) + q * seq_length + q * hidden)
    return {
        "attention": tokens * attn_per_layer * num_layers,
        "mlp_dense": tokens * 6 * hidden * ffn * f * dense_layers,
        "moe_routed": tokens * 6 * hidden * moe_ffn * top_k * f * moe_layers,
        "moe_shared": tokens * 6 * hidden * shared_ffn * f * moe_layers,
        "logits": tokens * 6 * hidden * padded_vocab,
    }


def step_flops(recipe: Recipe, world_size: int = 1) -> StepFlops:
    """FLOPs per optimizer step of `recipe` run on `world_size` GPUs (which fixes the global batch)."""
    m, t = recipe.model, recipe.training
    batch = recipe.global_batch(world_size)
    s = t.seq_length
    if m.moe is None:
        moe_layers, top_k, moe_ffn, shared_ffn = 0, 0, 0, 0
    else:
        moe_layers = sum(moe_layer_pattern(m.num_layers, m.moe.layer_freq))
        top_k, moe_ffn = m.moe.top_k, m.moe.ffn_hidden_size
        shared_ffn = 0  # Megatron: moe_shared_expert_intermediate_size (all shared experts together), None → 0
        if m.moe.num_shared_experts:
            shared_ffn = m.moe.shared_expert_ffn_hidden_size or m.moe.ffn_hidden_size * m.moe.num_shared_experts
    vocab = padded_vocab_size(m.vocab_size, recipe.parallel.tensor)
    parts = transformer_flops(
        tokens=batch * s, seq_length=s, hidden=m.hidden_size, num_layers=m.num_layers, moe_layers=moe_layers,
        ffn=m.ffn_hidden_size, q=m.kv_channels * m.num_attention_heads, kv=m.kv_channels * m.kv_heads,
        padded_vocab=vocab, moe_ffn=moe_ffn, top_k=top_k, shared_ffn=shared_ffn,
        gated=m.activation == "swiglu",  # Megatron: 3 if args.swiglu else 2 (squared ReLU is not SwiGLU)
    )
    return StepFlops(**parts, total=sum(parts.values()), batch_size=batch, seq_length=s, padded_vocab_size=vocab)


def tflops_per_gpu(flops_per_step: float, step_time_s: float, world_size: int) -> float:
    """Model TFLOP/s per GPU, as Megatron logs it ("throughput per GPU (TFLOP/s/GPU)")."""
    return flops_per_step / step_time_s / world_size / 1e12


def main(recipe: Recipe, world_size: int) -> int:
    """`python -m trainer flops`: print the step FLOPs and their parts as JSON."""
    result = step_flops(recipe, world_size).to_dict()
    result["world_size"] = world_size
    result["flops_per_gpu"] = result["total"] / world_size
    print(json.dumps(result, indent=2))
    return 0
