"""Decoder-only GPT with optional MoE MLPs, all of it here, bottom-up: norm, RoPE, attention, MLP, block, model.

The shape comes from one config, `trainer.recipe.ModelConfig` (pydantic, shared with the orchestrator).
Architecture as Megatron-LM/Llama/Qwen3 use it: pre-norm RMSNorm, rotary embeddings (rotate-half
layout), grouped-query attention through `F.scaled_dot_product_attention(is_causal=True)`, SwiGLU or
squared-ReLU MLPs, MoE MLPs in every `layer_freq`-th layer from layer 0, untied input embedding and
output layer over a vocabulary padded like Megatron's (see `trainer/flops.py`), no biases, no dropout.
Init as Megatron: N(0, init_std), and init_std / sqrt(2·layers) for the projections that write into the
residual stream (attention output, MLP down projections).

No distributed code lives here: data parallelism, activation recomputation and torch.compile are
applied from outside by `trainer/parallelize.py`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from trainer.flops import moe_layer_pattern
from trainer.loss import cross_entropy
from trainer.moe import MoELayer, activate, compute_dtype
from trainer.recipe import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Weight cast to the input dtype so the fused kernel applies (it accumulates in fp32 anyway).
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


class Rotary(nn.Module):
    """RoPE tables for positions [0, seq_length); `apply` rotates [B, S, heads, D] with rotate-half."""

    def __init__(self, head_dim: int, seq_length: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(seq_length, dtype=torch.float32), inv_freq)  # [S, D/2]
        angles = torch.cat([angles, angles], dim=-1)  # [S, D]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1]
        cos = self.cos[:seq, None, :].to(x.dtype)
        sin = self.sin[:seq, None, :].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class CoreAttention(nn.Module):
    """softmax(QKᵀ/√d + causal mask)·V; its own module so selective recompute can wrap exactly this."""

    def __init__(self, gqa: bool):
        super().__init__()
        self.gqa = gqa

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # [B, heads, S, D]; enable_gqa lets flash/cuDNN kernels read the shared KV heads without copies.
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: Rotary, output_std: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.kv_heads, cfg.kv_channels
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)  # one GEMM for Q, K and V
        self.out = nn.Linear(q_size, cfg.hidden_size, bias=False)
        nn.init.normal_(self.qkv.weight, 0.0, cfg.init_std)
        nn.init.normal_(self.out.weight, 0.0, output_std)
        self.rotary = rotary
        self.core = CoreAttention(gqa=self.kv_heads != self.heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1
        )
        q = self.rotary(q.view(b, s, self.heads, self.head_dim))
        k = self.rotary(k.view(b, s, self.kv_heads, self.head_dim))
        v = v.view(b, s, self.kv_heads, self.head_dim)
        o = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # [B, heads, S, D]
        return self.out(o.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class MLP(nn.Module):
    """Dense MLP: up (gate|up for SwiGLU, one GEMM) → activation → down."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, activation: str, init_std: float,
                 output_std: float):
        super().__init__()
        self.activation = activation
        up = 2 * ffn_hidden_size if activation == "swiglu" else ffn_hidden_size
        self.up = nn.Linear(hidden_size, up, bias=False)
        self.down = nn.Linear(ffn_hidden_size, hidden_size, bias=False)
        nn.init.normal_(self.up.weight, 0.0, init_std)
        nn.init.normal_(self.down.weight, 0.0, output_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(activate(self.up(x), self.activation))


class Block(nn.Module):
    """Pre-norm transformer layer. Returns (x, aux_loss, dropped pairs); the last two are None when dense."""

    def __init__(self, cfg: ModelConfig, rotary: Rotary, is_moe: bool):
        super().__init__()
        output_std = cfg.init_std / math.sqrt(2 * cfg.num_layers)
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attn = Attention(cfg, rotary, output_std)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.is_moe = is_moe
        if is_moe:
            moe = cfg.moe
            shared = None
            if moe.num_shared_experts:
                shared_ffn = moe.shared_expert_ffn_hidden_size or moe.ffn_hidden_size * moe.num_shared_experts
                shared = MLP(cfg.hidden_size, shared_ffn, cfg.activation, cfg.init_std, output_std)
            self.mlp = MoELayer(cfg.hidden_size, cfg.activation, moe, cfg.init_std, output_std, shared)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.ffn_hidden_size, cfg.activation, cfg.init_std, output_std)

    def forward(self, x: torch.Tensor):
        x = x + self.attn(self.attn_norm(x))
        if not self.is_moe:
            return x + self.mlp(self.mlp_norm(x)), None, None
        out, aux, dropped = self.mlp(self.mlp_norm(x))
        return x + out, aux, dropped


class ModelOutput(NamedTuple):
    loss: torch.Tensor  # mean next-token cross entropy (what is logged as `loss`)
    aux_loss: torch.Tensor  # sum of the MoE layers' load-balancing losses (added to the objective)
    tokens_dropped: torch.Tensor  # (token, slot) pairs dropped by expert capacity, all MoE layers
    tokens_routed: int  # (token, slot) pairs routed, all MoE layers (0 for a dense model)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, seq_length: int, padded_vocab_size: int, cross_entropy: str = "native"):
        super().__init__()
        self.cfg, self.vocab_size, self.cross_entropy = cfg, padded_vocab_size, cross_entropy
        self.embedding = nn.Embedding(padded_vocab_size, cfg.hidden_size)
        nn.init.normal_(self.embedding.weight, 0.0, cfg.init_std)
        rotary = Rotary(cfg.kv_channels, seq_length, cfg.rope_theta)
        pattern = moe_layer_pattern(cfg.num_layers, cfg.moe.layer_freq) if cfg.moe else [0] * cfg.num_layers
        self.layers = nn.ModuleList(Block(cfg, rotary, bool(is_moe)) for is_moe in pattern)
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.output = nn.Linear(cfg.hidden_size, padded_vocab_size, bias=False)  # untied from the embedding
        nn.init.normal_(self.output.weight, 0.0, cfg.init_std)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> ModelOutput:
        """tokens, targets [B, S] int64 → loss and MoE statistics."""
        x = self.embedding(tokens)
        # The residual stream runs in the compute dtype (bf16 under autocast), as Megatron's.
        x = x.to(compute_dtype(x))
        aux_loss = x.new_zeros((), dtype=torch.float32)
        dropped = torch.zeros((), dtype=torch.long, device=x.device)
        routed = 0
        for layer in self.layers:
            x, aux, drop = layer(x)
            if aux is not None:
                aux_loss = aux_loss + aux
                dropped = dropped + drop
                routed += tokens.numel() * self.cfg.moe.top_k
        loss = cross_entropy(self.final_norm(x), self.output.weight, targets, self.cross_entropy)
        return ModelOutput(loss, aux_loss, dropped, routed)
