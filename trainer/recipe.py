"""The one schema of a bundled-trainer recipe (pydantic only: the orchestrator validates it before submitting)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PRECISIONS = ("fp32", "bf16", "fp8", "mxfp8", "nvfp4")
BLACKWELL_ONLY_PRECISIONS = ("mxfp8", "nvfp4")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RouterConfig(_Strict):
    """How tokens choose experts."""

    score_function: Literal["softmax"] = Field("softmax", description="Router score function over expert logits.")
    force_balance: bool = Field(
        False,
        description="Route uniformly (round-robin token→expert assignment), as published MoE benchmark tables do; "
        "removes routing imbalance from throughput measurements.",
    )
    aux_loss_coeff: float = Field(1e-2, ge=0.0, description="Coefficient of the load-balancing auxiliary loss.")


class MoEConfig(_Strict):
    """Mixture-of-experts MLP settings; present ⇒ MoE layers are used."""

    num_experts: int = Field(..., ge=1, description="Routed experts per MoE layer.")
    top_k: int = Field(2, ge=1, description="Experts each token is routed to.")
    ffn_hidden_size: int = Field(..., ge=1, description="Hidden size of each routed expert's MLP.")
    layer_freq: int = Field(1, ge=1, description="Every N-th layer (0, N, 2N, ...) is MoE; the others are dense.")
    num_shared_experts: int = Field(0, ge=0, description="Shared experts applied to every token.")
    shared_expert_ffn_hidden_size: int | None = Field(
        None, ge=1, description="Hidden size of the shared-expert MLP (all shared experts together); default ffn_hidden_size × num_shared_experts."
    )
    router: RouterConfig = Field(default_factory=RouterConfig, description="Router settings.")
    capacity_factor: float | None = Field(
        None, gt=0.0, description="Expert capacity = ceil(tokens × top_k / experts × factor); None = dropless."
    )
    drop_policy: Literal["probs", "position"] = Field(
        "probs", description="Which tokens an over-full expert keeps: highest router probability, or earliest position."
    )
    pad_to_capacity: bool = Field(
        False, description="Pad every expert to its capacity (static shapes, no device→host sync in the MoE layer)."
    )
    grouped_gemm: Literal["torch", "loop", "te"] = Field(
        "torch", description="Expert GEMMs: torch grouped_mm, a Python loop of matmuls, or TE GroupedLinear."
    )
    expert_weights: Literal["single", "discrete"] = Field(
        "single", description="One [E, N, K] parameter per projection, or one parameter per expert."
    )
    dispatch_chunk_tokens: int | None = Field(
        None, ge=1, description="Route/permute tokens in chunks of this many, pipelined against the expert GEMMs."
    )
    dispatcher_sms: int | None = Field(
        None, ge=1, description="Run dispatch/permute/combine in a CUDA green context of this many SMs (GPU only)."
    )

    @model_validator(mode="after")
    def _check(self) -> MoEConfig:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be ≤ num_experts ({self.num_experts})")
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ValueError("pad_to_capacity needs a capacity_factor (dropless has no capacity to pad to)")
        return self


class ModelConfig(_Strict):
    """Decoder-only GPT shape."""

    vocab_size: int = Field(32000, ge=2, description="Vocabulary size.")
    hidden_size: int = Field(256, ge=1, description="Model width.")
    num_layers: int = Field(2, ge=1, description="Transformer layers.")
    num_attention_heads: int = Field(4, ge=1, description="Query heads.")
    num_query_groups: int | None = Field(None, ge=1, description="Key/value heads (GQA); None = num_attention_heads.")
    head_dim: int | None = Field(None, ge=1, description="Per-head size (Megatron kv_channels); None = hidden/heads.")
    ffn_hidden_size: int = Field(1024, ge=1, description="Hidden size of dense MLPs.")
    activation: Literal["swiglu", "squared_relu"] = Field("swiglu", description="MLP activation.")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base.")
    norm_eps: float = Field(1e-6, gt=0, description="RMSNorm epsilon.")
    init_std: float = Field(0.02, gt=0, description="Std of the normal weight init.")
    moe: MoEConfig | None = Field(None, description="MoE settings; absent = dense model.")

    @property
    def kv_heads(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def kv_channels(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by num_query_groups ({self.kv_heads})"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}) unless head_dim is set"
            )
        if self.kv_channels % 2:
            raise ValueError(f"head size ({self.kv_channels}) must be even for RoPE")
        return self


class ParallelConfig(_Strict):
    """Parallel layout; world size = tensor × pipeline × context × data (expert parallelism lives inside data)."""

    tensor: int = Field(1, ge=1, description="Tensor parallel size (TP).")
    pipeline: int = Field(1, ge=1, description="Pipeline parallel size (PP).")
    context: int = Field(1, ge=1, description="Context parallel size (CP).")
    expert: int = Field(1, ge=1, description="Expert parallel size (EP), carved out of data × context ranks.")
    data: int | None = Field(None, ge=1, description="Data parallel size (DP); None = world / (TP·PP·CP).")

    def world_size(self, data: int | None = None) -> int:
        return self.tensor * self.pipeline * self.context * (data or self.data or 1)


class TrainingConfig(_Strict):
    """Batch, length and loop settings."""

    seq_length: int = Field(256, ge=2, description="Tokens per sequence.")
    micro_batch_size: int = Field(1, ge=1, description="Sequences per micro-batch per data-parallel rank.")
    global_batch_size: int | None = Field(
        None, ge=1, description="Sequences per optimizer step; None = micro_batch_size × DP (no accumulation)."
    )
    steps: int = Field(20, ge=1, description="Optimizer steps to run (Megatron train_iters).")
    seed: int = Field(1234, description="Seed of weights, mock data and routing.")
    eval_interval: int | None = Field(None, ge=1, description="Evaluate every N steps; None = never.")
    eval_iters: int = Field(2, ge=1, description="Micro-batches per evaluation.")
    log_interval: int = Field(1, ge=1, description="Print a step line every N steps (metrics.jsonl gets every step).")


class OptimizerConfig(_Strict):
    """AdamW with linear warm-up then cosine decay."""

    lr: float = Field(3e-4, gt=0, description="Peak learning rate.")
    min_lr: float = Field(3e-5, ge=0, description="Final learning rate of the cosine decay.")
    warmup_steps: int = Field(2, ge=0, description="Linear warm-up steps.")
    weight_decay: float = Field(0.1, ge=0, description="Decoupled weight decay.")
    beta1: float = Field(0.9, ge=0, lt=1, description="Adam beta1.")
    beta2: float = Field(0.95, ge=0, lt=1, description="Adam beta2.")
    eps: float = Field(1e-8, gt=0, description="Adam epsilon.")
    clip_grad: float = Field(1.0, ge=0, description="Global gradient-norm clip; 0 = off.")
    master_weights: bool | None = Field(
        None,
        description="bf16 model weights with fp32 master copies in the optimizer (Megatron --bf16); "
        "None = on for bf16 on GPU, off otherwise.",
    )
    main_grads: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="With master weights: accumulate micro-batch gradients in fp32 main grads (Megatron's "
        "default) or in bf16 on the weights (a precision-aware optimizer's bf16 gradients; less memory traffic).",
    )


class Recipe(_Strict):
    """Everything one bundled-trainer run needs; the resolved recipe is written to recipe.yaml in the run dir."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Model shape.")
    parallel: ParallelConfig = Field(default_factory=ParallelConfig, description="Parallel layout.")
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="Batch, length and loop.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="Optimizer and schedule.")
    precision: Literal["fp32", "bf16", "fp8", "mxfp8", "nvfp4"] = Field(
        "bf16", description="Compute precision: bf16 autocast on GPU (fp32 on CPU), fp8 via TE on Hopper, "
        "mxfp8/nvfp4 Blackwell only."
    )
    fp8_recipe: Literal["current", "delayed", "block"] = Field(
        "current", description="TE FP8 scaling recipe when precision is fp8."
    )
    recompute: Literal["none", "selective", "full"] = Field("none", description="Activation recomputation.")
    cross_entropy: Literal["native", "fused", "te"] = Field(
        "native", description="Loss: native fp32 CE, fused (vocab-chunked), or TE parallel cross entropy."
    )
    compile: bool = Field(False, description="torch.compile each transformer block.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available, else cpu.")
    cache_dir: str | None = Field(
        None, description="Root of rank-local JIT caches; else $MBX_CACHE_DIR, $XDG_CACHE_HOME/mbx, /tmp/mbx-cache-$USER."
    )

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        moe = self.model.moe
        if moe is not None and self.parallel.expert > 1 and moe.num_experts % self.parallel.expert:
            raise ValueError(
                f"model.moe.num_experts ({moe.num_experts}) must be divisible by parallel.expert ({self.parallel.expert})"
            )
        if moe is None and self.parallel.expert > 1:
            raise ValueError("parallel.expert > 1 needs model.moe")
        return self

    def data_parallel_size(self, world_size: int) -> int:
        """DP implied by a world size, raising ValueError when the layout does not tile it."""
        p = self.parallel
        model_parallel = p.tensor * p.pipeline * p.context
        if world_size % model_parallel:
            raise ValueError(
                f"world size {world_size} is not divisible by TP·PP·CP = {p.tensor}·{p.pipeline}·{p.context}"
            )
        dp = world_size // model_parallel
        if p.data is not None and p.data != dp:
            raise ValueError(
                f"world size {world_size} ≠ TP·PP·CP·DP = {p.tensor}·{p.pipeline}·{p.context}·{p.data} = "
                f"{p.world_size()}"
            )
        return dp

    def global_batch(self, world_size: int) -> int:
        dp = self.data_parallel_size(world_size)
        return self.training.global_batch_size or self.training.micro_batch_size * dp


# What the bundled trainer implements today; pre-submit checks reject the rest.
SUPPORTED_PARALLEL = {"tensor": 1, "pipeline": 1, "context": 1}


def launch_problems(recipe: Recipe, world_size: int, gpu_arch: str | None = None) -> list[str]:
    """Pre-submit checks of one point: every reason it cannot run as asked (empty = fine).

    Each problem names the recipe key path it is about, so callers can print `file: key: problem`.
    """
    problems: list[str] = []
    p = recipe.parallel
    for name, only in SUPPORTED_PARALLEL.items():
        size = getattr(p, name)
        if size != only:
            problems.append(f"parallel.{name}: the bundled trainer supports only {name} = {only} (got {size})")
    try:
        dp = recipe.data_parallel_size(world_size)
    except ValueError as err:
        problems.append(f"parallel: {err}")
        return problems
    if p.expert > 1 and (dp * p.context) % p.expert:
        problems.append(f"parallel.expert: EP ({p.expert}) must divide DP·CP ({dp * p.context})")
    if p.expert > 1:
        problems.append(f"parallel.expert: expert parallelism (EP = {p.expert}) is not implemented yet; use 1")
    t = recipe.training
    if t.global_batch_size is not None and t.global_batch_size % (t.micro_batch_size * dp):
        problems.append(
            f"training.global_batch_size: {t.global_batch_size} is not divisible by micro_batch_size × DP = "
            f"{t.micro_batch_size} × {dp} = {t.micro_batch_size * dp}"
        )
    if recipe.precision in BLACKWELL_ONLY_PRECISIONS and gpu_arch is not None and not gpu_arch.startswith("sm_10"):
        problems.append(f"precision: {recipe.precision} needs a Blackwell GPU (sm_100+); this point targets {gpu_arch}")
    return problems


def load_recipe(data: dict) -> Recipe:
    """Validate a recipe mapping (as read from recipe.yaml)."""
    return Recipe.model_validate(data)
