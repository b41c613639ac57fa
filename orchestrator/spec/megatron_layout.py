"""Megatron layout checks of a command trainer's flags, worded as the bundled trainer's: TP·PP·CP·DP = world,
experts % EP, EP·ETP vs DP·CP·TP, global batch % (micro-batch × DP), pipeline and virtual-pipeline rules."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Megatron-Bridge config names (the last part of a Hydra key) → the Megatron-LM flag they mean.
BRIDGE_NAMES = {
    "num_moe_experts": "num-experts",
    "virtual_pipeline_model_parallel_size": "num-virtual-stages-per-pipeline-rank",
    "gated_linear_unit": "swiglu",
    "num_layers_in_first_pipeline_stage": "decoder-first-pipeline-num-layers",
    "num_layers_in_last_pipeline_stage": "decoder-last-pipeline-num-layers",
}
UNEVEN_PIPELINE = ("decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers",
                   "pipeline-model-parallel-layout", "account-for-embedding-in-pipeline-split",
                   "account-for-loss-in-pipeline-split")  # fmt: skip


HYDRA_RE = re.compile(r"^[+~]?[A-Za-z_][\w.\-]*=")  # `key.path=value` (Hydra overrides; + adds, ~ deletes)


def _value(text: str) -> Any:
    """An argv value as a number or boolean where it reads as one (Hydra's true/false/null too)."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def megatron_args(argv: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(flags, spelled) of an argv: `--flag-name value` (a bare flag is True, several values a list) and Hydra
    `a.b.name=value` overrides, keyed by Megatron-LM flag name without dashes (`tensor-model-parallel-size`);
    `spelled` gives each name as the argv wrote it, for messages. The last occurrence wins, as in argparse."""
    args: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    flag: str | None = None
    for item in argv:
        if item == "--":
            flag = None
        elif item.startswith("--"):
            name, eq, text = item[2:].partition("=")
            flag = _normal(name)
            spelled[flag] = item.partition("=")[0]
            args[flag] = _value(text) if eq else True
            if eq:
                flag = None
        elif flag is not None and args[flag] is True:
            args[flag] = _value(item)
        elif HYDRA_RE.match(item):
            flag = None
            key, _, text = item.partition("=")
            last = key.lstrip("+~").rsplit(".", 1)[-1]
            name = _normal(BRIDGE_NAMES.get(last, last))
            spelled[name] = key.lstrip("+~")
            args[name] = _value(text)
            args.update(_bridge_implied(name, args[name]))
        elif flag is not None:  # a flag's further values (nargs="+")
            args[flag] = [*_as_list(args[flag]), _value(item)]
    return args, spelled


def _bridge_implied(name: str, value: Any) -> dict[str, Any]:
    """Megatron-LM flags a Megatron-Bridge setting implies: its query groups are GQA without a separate switch,
    and `mixed_precision: bf16_mixed` (or a `bf16*` / `fp16*` recipe name) means bf16 / fp16 weights."""
    if name == "num-query-groups":
        return {"group-query-attention": True}
    if name == "mixed-precision" and isinstance(value, str):
        return {flag: True for flag in ("bf16", "fp16") if flag in value.lower()}
    return {}


def _normal(name: str) -> str:
    return name.strip().replace("_", "-").lower()


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@dataclass(frozen=True)
class Layout:
    """The parallel sizes and batch settings read from Megatron flags (Megatron's defaults where unset)."""

    world: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    layers: int | None
    experts: int | None
    mbs: int
    gbs: int | None

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)


def _int(args: dict[str, Any], name: str, default: int | None) -> int | None:
    value = args.get(name, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def layout_of(args: dict[str, Any], world: int) -> Layout:
    tp = _int(args, "tensor-model-parallel-size", 1) or 1
    return Layout(
        world=world,
        tp=tp,
        pp=_int(args, "pipeline-model-parallel-size", 1) or 1,
        cp=_int(args, "context-parallel-size", 1) or 1,
        ep=_int(args, "expert-model-parallel-size", 1) or 1,
        etp=_int(args, "expert-tensor-parallel-size", tp) or tp,
        layers=_int(args, "num-layers", None),
        experts=_int(args, "num-experts", None),
        mbs=_int(args, "micro-batch-size", 1) or 1,
        gbs=_int(args, "global-batch-size", None),
    )


def layout_problems(args: dict[str, Any], spelled: dict[str, str], world: int) -> list[str]:
    """Every reason Megatron would refuse this layout on `world` ranks (empty: fine), each starting with the
    flag it is about as the argv spells it."""

    def key(name: str) -> str:
        return spelled.get(name, f"--{name}")

    lay = layout_of(args, world)
    if world % (lay.tp * lay.pp * lay.cp):
        sizes = ", ".join(key(f"{n}-parallel-size") for n in ("tensor-model", "pipeline-model", "context")
                          if f"{n}-parallel-size" in args)  # fmt: skip
        return [f"parallel ({sizes or 'defaults'}): world size {world} is not divisible by TP·PP·CP = "
                f"{lay.tp}·{lay.pp}·{lay.cp}"]  # fmt: skip
    problems = _model_split(args, key, lay) + _expert_problems(key, lay) + _batch_problems(key, lay)
    return problems + _virtual_pipeline(args, key, lay)


def _model_split(args: dict[str, Any], key: Any, lay: Layout) -> list[str]:
    """Heads over TP, layers over PP."""
    problems = []
    for name in ("num-attention-heads", "num-query-groups"):
        count = _int(args, name, None)
        if count is not None and count % lay.tp:
            problems.append(f"{key(name)}: {count} is not divisible by TP ({lay.tp})")
    uneven = any(args.get(name) not in (None, False) for name in UNEVEN_PIPELINE)
    if lay.layers is not None and lay.layers % lay.pp and not uneven:
        problems.append(f"{key('num-layers')}: {lay.layers} is not divisible by PP ({lay.pp}) (an uneven split "
                        "needs --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers)")  # fmt: skip
    return problems


def _expert_problems(key: Any, lay: Layout) -> list[str]:
    """Experts over EP; the expert layers' EP·ETP ranks tile the dense layers' DP·CP·TP (MoE parallel folding)."""
    if not lay.experts:
        return []
    problems = []
    if lay.experts % lay.ep:
        problems.append(f"{key('num-experts')} ({lay.experts}) must be divisible by "
                        f"{key('expert-model-parallel-size')} ({lay.ep})")  # fmt: skip
    dense = lay.dp * lay.cp * lay.tp
    if dense % (lay.ep * lay.etp):
        problems.append(f"{key('expert-model-parallel-size')}: EP·ETP ({lay.ep}·{lay.etp} = {lay.ep * lay.etp}) "
                        f"must divide DP·CP·TP ({lay.dp}·{lay.cp}·{lay.tp} = {dense})")  # fmt: skip
    return problems


def _batch_problems(key: Any, lay: Layout) -> list[str]:
    if lay.gbs is not None and lay.gbs % (lay.mbs * lay.dp):
        return [f"{key('global-batch-size')}: {lay.gbs} is not divisible by micro_batch_size × DP = "
                f"{lay.mbs} × {lay.dp} = {lay.mbs * lay.dp}"]  # fmt: skip
    return []


def _virtual_pipeline(args: dict[str, Any], key: Any, lay: Layout) -> list[str]:
    """The interleaved schedule: one way of asking for it, PP > 2 (> 1 with --overlap-p2p-comm), layers that
    split evenly into virtual stages, at least PP micro-batches per step."""
    per_stage = _int(args, "num-layers-per-virtual-pipeline-stage", None)
    stages = _int(args, "num-virtual-stages-per-pipeline-rank", None)
    if per_stage is None and (stages is None or stages <= 1):
        return []
    vp_key = key(
        "num-layers-per-virtual-pipeline-stage" if per_stage else "num-virtual-stages-per-pipeline-rank"
    )
    problems = []
    if per_stage is not None and stages is not None:
        problems.append(f"{vp_key}: only one of --num-layers-per-virtual-pipeline-stage and "
                        "--num-virtual-stages-per-pipeline-rank may be set")  # fmt: skip
    least = 1 if args.get("overlap-p2p-comm") else 2
    if lay.pp <= least:
        problems.append(f"{vp_key}: the interleaved (virtual pipeline) schedule needs PP > {least} (got PP = "
                        f"{lay.pp}){'' if least == 1 else '; or > 1 with --overlap-p2p-comm'}")  # fmt: skip
    if lay.layers is not None and lay.pp and not lay.layers % lay.pp:
        per_rank = lay.layers // lay.pp
        if per_stage is not None and per_rank % per_stage:
            problems.append(f"{vp_key}: the {per_rank} layers of a pipeline stage (num_layers / PP = "
                            f"{lay.layers} / {lay.pp}) are not divisible by {per_stage} layers per virtual stage")  # fmt: skip
        if per_stage is None and stages and per_rank % stages:
            problems.append(f"{vp_key}: the {per_rank} layers of a pipeline stage (num_layers / PP = "
                            f"{lay.layers} / {lay.pp}) do not split into {stages} virtual stages")  # fmt: skip
    if lay.gbs is not None and lay.pp > 1 and lay.gbs // (lay.mbs * lay.dp) < lay.pp:
        micro = lay.gbs // (lay.mbs * lay.dp)
        problems.append(f"{key('global-batch-size')}: the interleaved schedule needs at least PP ({lay.pp}) "
                        f"micro-batches per step; global batch {lay.gbs} / (micro_batch_size × DP = "
                        f"{lay.mbs} × {lay.dp}) gives {micro}")  # fmt: skip
    return problems


MODEL_FLAGS = ("hidden-size", "num-layers", "num-attention-heads", "seq-length")


def estimate_args(args: dict[str, Any], world: int) -> dict[str, Any] | None:
    """The flags trainer.memory.estimate_megatron reads (world size added), or None when they do not give the
    model's shape (hidden size, layers, heads, sequence length, vocabulary)."""
    if any(_int(args, name, None) is None for name in MODEL_FLAGS):
        return None
    if _int(args, "vocab-size", None) is None and _int(args, "padded-vocab-size", None) is None:
        return None
    return {**args, "world-size": world}
