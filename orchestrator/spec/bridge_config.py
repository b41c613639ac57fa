"""A Megatron-Bridge ConfigContainer read without Bridge: the YAML Bridge writes (`logger.save_config_filepath`, or
`--dryrun` of trainer/bridge_entry.py and run_recipe.py), a point's overrides applied to it, its Megatron-LM flags
(for trainer.memory.estimate_megatron before submission) and mbx's own Megatron FLOPs count per step (to check the
TFLOP/s Bridge prints). Pure Python: no torch, no Bridge."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from trainer.bridge_args import field_overrides
from trainer.flops import padded_vocab_size, transformer_flops
from trainer.memory import megatron_shape

SECTIONS = ("model", "train")  # what a ConfigContainer YAML must have for mbx to use it


class BridgeConfigError(ValueError):
    """A file that is not a Bridge ConfigContainer YAML (or lacks the model shape)."""


def read(path: Path) -> dict[str, Any]:
    """The YAML as a mapping; BridgeConfigError when it is not one with `model` and `train` sections."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise BridgeConfigError(f"{path}: cannot read a Bridge ConfigContainer: {err}") from None
    if not isinstance(doc, dict) or any(not isinstance(doc.get(s), dict) for s in SECTIONS):
        raise BridgeConfigError(f"{path}: not a Bridge ConfigContainer YAML (no {' and '.join(SECTIONS)} sections)")
    return doc


def _value(text: str) -> Any:
    """An override's value as Hydra reads the common cases: true/false, null, numbers, [a,b], else the string."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def with_overrides(config: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """A copy of `config` with the argv's run_recipe.py short options and `a.b.c=value` overrides applied."""
    out = copy.deepcopy(config)
    for dotted, text in field_overrides(argv):
        node = out
        *parents, last = dotted.split(".")
        for key in parents:
            child = node.get(key)
            if not isinstance(child, dict):
                child = node[key] = {}
            node = child
        node[last] = _value(text)
    return out


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def megatron_flags(config: dict[str, Any], world: int) -> dict[str, Any]:
    """The Megatron-LM flags of a resolved config (names as trainer.memory reads them)."""
    m, train = config["model"], config["train"]
    mp, optim = config.get("mixed_precision") or {}, config.get("optimizer") or {}
    heads = m.get("num_attention_heads")
    groups = m.get("num_query_groups") or heads
    freq = m.get("moe_layer_freq", 1)
    flags = {
        "num-layers": m.get("num_layers"), "hidden-size": m.get("hidden_size"),
        "ffn-hidden-size": m.get("ffn_hidden_size"), "num-attention-heads": heads,
        "group-query-attention": groups != heads, "num-query-groups": groups, "kv-channels": m.get("kv_channels"),
        "seq-length": _first((config.get("dataset") or {}).get("seq_length"), m.get("seq_length")),
        "micro-batch-size": train.get("micro_batch_size", 1), "global-batch-size": train.get("global_batch_size"),
        "vocab-size": m.get("vocab_size"), "make-vocab-size-divisible-by": m.get("make_vocab_size_divisible_by", 128),
        "num-experts": m.get("num_moe_experts"), "moe-router-topk": m.get("moe_router_topk"),
        "moe-ffn-hidden-size": m.get("moe_ffn_hidden_size"),
        "moe-shared-expert-intermediate-size": m.get("moe_shared_expert_intermediate_size"),
        "moe-layer-freq": freq if isinstance(freq, int) else 1, "swiglu": bool(m.get("gated_linear_unit")),
        "untie-embeddings-and-output-weights": not m.get("share_embeddings_and_output_weights", True),
        "tensor-model-parallel-size": m.get("tensor_model_parallel_size", 1),
        "pipeline-model-parallel-size": m.get("pipeline_model_parallel_size", 1),
        "context-parallel-size": m.get("context_parallel_size", 1),
        "expert-model-parallel-size": m.get("expert_model_parallel_size", 1),
        "expert-tensor-parallel-size": m.get("expert_tensor_parallel_size") or m.get("tensor_model_parallel_size", 1),
        "recompute-granularity": m.get("recompute_granularity"), "recompute-method": m.get("recompute_method"),
        "recompute-num-layers": m.get("recompute_num_layers"),
        "cross-entropy-loss-fusion": bool(m.get("cross_entropy_loss_fusion")),
        "bf16": bool(_first(mp.get("bf16"), m.get("bf16"))), "fp8-format": _first(mp.get("fp8"), m.get("fp8")),
        "use-distributed-optimizer": bool(optim.get("use_distributed_optimizer")), "world-size": world,
    }  # fmt: skip
    return {k: v for k, v in flags.items() if v is not None}


def step_flops(config: dict[str, Any], world: int) -> int:
    """Model FLOPs of one optimizer step (trainer/flops.py: Megatron-LM's accounting) of a resolved config."""
    flags = megatron_flags(config, world)
    sh = megatron_shape(flags)
    batch = int(flags.get("global-batch-size") or sh.b * sh.dp)
    vocab = padded_vocab_size(sh.vocab, 1, 1)  # megatron_shape already padded it for TP
    parts = transformer_flops(
        tokens=batch * sh.s, seq_length=sh.s, hidden=sh.h, num_layers=sh.layers, moe_layers=sh.moe_layers,
        ffn=sh.ffn, q=sh.q, kv=sh.kv, padded_vocab=vocab, moe_ffn=sh.moe_ffn, top_k=sh.top_k,
        shared_ffn=sh.shared_ffn, gated=sh.glu == 3,
    )
    return sum(parts.values())


FP8_RECIPES = {"tensorwise": "fp8_cs", "delayed": "fp8_ds", "mxfp8": "fp8_mx", "blockwise": "fp8_bs"}


def precision(config: dict[str, Any]) -> str:
    """The precision as Bridge's cards name it: bf16, fp16, fp8_cs (current scaling), fp8_ds, fp8_mx, fp8_bs."""
    m, mp = config.get("model") or {}, config.get("mixed_precision") or {}
    fp8 = _first(mp.get("fp8"), m.get("fp8"))
    if fp8:
        recipe = _first(mp.get("fp8_recipe"), m.get("fp8_recipe"), "delayed")
        return FP8_RECIPES.get(str(recipe), f"fp8_{recipe}")
    if _first(mp.get("bf16"), m.get("bf16")):
        return "bf16"
    return "fp16" if _first(mp.get("fp16"), m.get("fp16")) else "fp32"
