"""The one schema of a bundled-trainer recipe (pydantic only: the orchestrator validates it before submitting)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainer.capacity import chunk_sizes, expert_capacity

BLACKWELL_ONLY_PRECISIONS = ("mxfp8", "nvfp4")
QUANTIZED_PRECISIONS = ("fp8", "mxfp8", "nvfp4")  # Transformer Engine modules under te.autocast
RECOMPUTE_MODULES = ("core_attn", "moe_act", "moe_dispatch")
# Lowest compute capability (major·10 + minor) of each Transformer Engine quantized mode.
MIN_ARCH = {"fp8": 89, "fp8/block": 90, "mxfp8": 100, "nvfp4": 100}
FP8_ALIGN = 16  # TE FP8 GEMMs: every GEMM dimension a multiple of 16 (rows of 8, here 16 for the wgrad too)


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
    expert_wgrad: Literal["torch", "te"] = Field(
        "torch", description="The grouped_mm experts' weight-gradient GEMMs: torch (autograd adds each micro-batch's "
        "gradient) or te (Transformer Engine's grouped GEMM accumulating into the gradient in place; needs "
        "optimizer.grad_accumulation_fusion, grouped_gemm: torch, expert_weights: single and a CUDA GPU)."
    )
    dispatch_chunk_tokens: int | None = Field(
        None, ge=1, description="Route/permute tokens in chunks of this many, pipelined against the expert GEMMs "
        "(on a GPU chunk i+1's permutation runs on a dispatcher stream while chunk i's GEMMs run; capacity is "
        "then counted per chunk)."
    )
    dispatch_overlap: bool = Field(
        True, description="With dispatch_chunk_tokens on a GPU: run dispatch/permute/combine on a separate CUDA "
        "stream, overlapped with the expert GEMMs; false = the chunks run one after another on the compute stream."
    )
    dispatcher_sms: int | None = Field(
        None, ge=1, description="Run dispatch/permute/combine on the stream of a CUDA green context of this many "
        "SMs (GPU only; the GEMMs keep the other SMs); without dispatch_chunk_tokens the one chunk's permutation "
        "overlaps only the shared experts."
    )

    @model_validator(mode="after")
    def _check(self) -> MoEConfig:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be ≤ num_experts ({self.num_experts})")
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ValueError("pad_to_capacity needs a capacity_factor (dropless has no capacity to pad to)")
        if self.dispatcher_sms is not None and not self.dispatch_overlap:
            raise ValueError("dispatcher_sms needs dispatch_overlap (the green-context stream is the overlap)")
        if self.expert_wgrad == "te" and (self.grouped_gemm != "torch" or self.expert_weights != "single"):
            raise ValueError("expert_wgrad: te replaces the weight gradient of grouped_gemm: torch with "
                             "expert_weights: single (TE GroupedLinear experts fuse their own)")
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
    expert: int = Field(1, ge=1, description="Expert parallel size (EP), carved out of data × context ranks: "
                        "each EP group of consecutive ranks shards the experts, tokens cross it by all-to-all.")
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
        "default) or in bf16 on the weights (a precision-aware optimizer's bf16 gradients, read by the optimizer "
        "where the backward left them: no fp32 copy of every gradient).",
    )
    moments: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="dtype the Adam moments are stored in (Megatron --exp-avg-dtype / --exp-avg-sq-dtype); the "
        "update math stays fp32. bf16 saves 4 bytes per parameter.",
    )
    grad_accumulation_fusion: bool = Field(
        False,
        description="Weight-gradient GEMMs add into the gradient themselves (GEMM with beta = 1, Megatron "
        "--gradient-accumulation-fusion) instead of autograd adding each micro-batch's gradient in a separate "
        "pass: the output layer, TE Linear/GroupedLinear layers, and grouped_mm experts with "
        "model.moe.expert_wgrad: te. Needs the gradients on the weights (main_grads: bf16, or no master "
        "weights). With more than one rank the fused weights stay out of DDP and are all-reduced by the trainer "
        "(started inside the last micro-batch's backward).",
    )


class CheckpointConfig(_Strict):
    """Save the training state after a step, or continue from a saved one (trainer/checkpoint.py)."""

    save_at: int | None = Field(
        None, ge=1, description="Save weights, AdamW moments, RNG and data position after this step, into "
        "<run dir>/checkpoint/step-<N>/ (expert weights per expert: loads into either model.moe.expert_weights)."
    )
    load_from: str | None = Field(
        None, min_length=1, description="Continue from this checkpoint (a checkpoint/step-<N> directory, or a run "
        "directory: its latest checkpoint): training resumes at step N + 1 of training.steps."
    )
    reload_with: dict[str, Any] | None = Field(
        None, description="Dotted recipe keys → values, e.g. {model.moe.expert_weights: discrete}: after saving at "
        "save_at, the same process builds a fresh trainer from the recipe with these changes, loads the checkpoint "
        "just saved and trains the remaining steps (save with one layout, load with another, in one run); {} "
        "reloads unchanged. The model's shape, training.seed and training.steps cannot change."
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
    recompute: Literal["none", "selective", "full"] = Field(
        "none", description="Activation recomputation: none; selective = the modules in recompute_modules "
        "(Megatron --recompute-granularity selective); full = every transformer layer."
    )
    recompute_modules: list[Literal["core_attn", "moe_act", "moe_dispatch"]] | None = Field(
        None, description="With recompute: selective, what is recomputed in the backward instead of kept "
        "(Megatron --recompute-modules): core_attn = softmax(QKᵀ)V, moe_act = the expert activation's output "
        "(the second expert GEMM's input), moe_dispatch = the permuted token buffer (the first expert GEMM's "
        "input; not with parallel.expert > 1); None = all three (without moe_dispatch when parallel.expert > 1)."
    )
    cross_entropy: Literal["native", "fused", "te"] = Field(
        "native", description="Loss: native fp32 CE, fused (vocab-chunked), or TE parallel cross entropy."
    )
    compile: bool = Field(False, description="torch.compile each transformer block.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available, else cpu.")
    cache_dir: str | None = Field(
        None, description="Root of rank-local JIT caches; else $MBX_CACHE_DIR, $XDG_CACHE_HOME/mbx, /tmp/mbx-cache-$USER."
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Save and load the training state (none by default)."
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
        if self.recompute_modules is not None:
            if self.recompute != "selective":
                raise ValueError(f"recompute_modules applies only with recompute: selective (got {self.recompute})")
            if not self.recompute_modules or len(set(self.recompute_modules)) != len(self.recompute_modules):
                raise ValueError(f"recompute_modules must be non-empty without repeats (got {self.recompute_modules})")
        save_at = self.checkpoint.save_at
        if save_at is not None and save_at > self.training.steps:
            raise ValueError(f"checkpoint.save_at ({save_at}) must be ≤ training.steps ({self.training.steps})")
        if self.checkpoint.reload_with is not None:
            self._check_reload()
        return self

    def reloaded(self, load_from: str) -> Recipe:
        """The recipe a `checkpoint.reload_with` run continues with: the overrides applied, loading `load_from`,
        saving nothing."""
        data = self.model_dump(mode="json")
        for key, value in (self.checkpoint.reload_with or {}).items():
            node = data
            *parents, last = key.split(".")
            for part in parents:
                if not isinstance(node.get(part), dict):
                    node[part] = {}
                node = node[part]
            node[last] = value
        data["checkpoint"] = {"load_from": load_from}
        return Recipe.model_validate(data)

    def _check_reload(self) -> None:
        """reload_with: after a save before the last step; what it changes valid and loadable."""
        ckpt, t = self.checkpoint, self.training
        if ckpt.save_at is None or ckpt.save_at >= t.steps:
            raise ValueError(f"checkpoint.reload_with needs checkpoint.save_at before training.steps ({t.steps}): "
                             "the reloaded trainer trains the steps after it")
        if bad := [k for k in ckpt.reload_with if k.split(".")[0] == "checkpoint"]:
            raise ValueError(f"checkpoint.reload_with: {bad[0]}: the checkpoint keys are set by the reload itself")
        try:
            again = self.reloaded("-")
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"checkpoint.reload_with: {where + ': ' if where else ''}{first['msg']}") from None
        changed = [f"model.{k}" for k, v in model_shape(self.model).items() if model_shape(again.model)[k] != v]
        changed += [f"training.{k}" for k in ("seed", "steps") if getattr(again.training, k) != getattr(t, k)]
        if changed:
            raise ValueError(f"checkpoint.reload_with: {changed[0]} cannot change (the checkpoint's weights and "
                             "data position must fit the reloaded trainer)")

    def selective_modules(self) -> frozenset[str]:
        """What selective recompute covers (empty unless recompute is selective)."""
        if self.recompute != "selective":
            return frozenset()
        return frozenset(self.recompute_modules or RECOMPUTE_MODULES)

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


def model_shape(cfg: ModelConfig) -> dict[str, Any]:
    """The model keys that decide the parameters' shapes (resolved: None defaults spelled out); a checkpoint
    loads only into a model with the same ones."""
    moe = cfg.moe
    return {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads, "num_query_groups": cfg.kv_heads,
        "head_dim": cfg.kv_channels, "ffn_hidden_size": cfg.ffn_hidden_size, "activation": cfg.activation,
        "moe": moe is not None,
        "moe.num_experts": moe and moe.num_experts, "moe.ffn_hidden_size": moe and moe.ffn_hidden_size,
        "moe.layer_freq": moe and moe.layer_freq, "moe.num_shared_experts": moe and moe.num_shared_experts,
        "moe.shared_expert_ffn_hidden_size": moe and moe.num_shared_experts and (
            moe.shared_expert_ffn_hidden_size or moe.ffn_hidden_size * moe.num_shared_experts),
    }  # fmt: skip


# What the bundled trainer implements today; pre-submit checks reject the rest.
SUPPORTED_PARALLEL = {"tensor": 1, "pipeline": 1, "context": 1}


def launch_problems(recipe: Recipe, world_size: int, gpu_arch: str | None = None) -> list[str]:
    """Pre-submit checks of one point: every reason it cannot run as asked (empty = fine).

    Each problem names the recipe key path it is about, so callers can print `file: key: problem`.
    """
    problems = layout_problems(recipe, world_size)
    device = "cpu" if recipe.device == "cpu" else None  # "auto" and "cuda" may both land on a GPU
    problems.extend(knob_problems(recipe, device, arch_number(gpu_arch) if gpu_arch else None, gpu_arch))
    return problems


def layout_problems(recipe: Recipe, world_size: int) -> list[str]:
    """The parallel layout on `world_size` ranks: implemented sizes, DP, EP, batch divisibility (no device
    needed, so the pre-submit checks and the trainer's own start-up check say the same)."""
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
    problems.extend(expert_parallel_problems(recipe, dp))
    t = recipe.training
    if t.global_batch_size is not None and t.global_batch_size % (t.micro_batch_size * dp):
        problems.append(
            f"training.global_batch_size: {t.global_batch_size} is not divisible by micro_batch_size × DP = "
            f"{t.micro_batch_size} × {dp} = {t.micro_batch_size * dp}"
        )
    return problems


def expert_parallel_problems(recipe: Recipe, dp: int) -> list[str]:
    """What an EP > 1 layout needs: EP divides DP·CP (experts are sharded inside data parallelism), and
    moe_dispatch recompute (which cannot work across ranks) is off. Everything else runs under EP: TE
    GroupedLinear experts, gradient-accumulation fusion (trainer.grad_reduce reduces the fused gradients),
    TE cross entropy, bf16 moments, compile."""
    p, moe = recipe.parallel, recipe.model.moe
    if p.expert == 1 or moe is None:
        return []
    problems = []
    if (dp * p.context) % p.expert:
        problems.append(f"parallel.expert: EP ({p.expert}) must divide DP·CP ({dp * p.context})")
    if recipe.recompute_modules is not None and "moe_dispatch" in recipe.recompute_modules:
        problems.append("recompute_modules: moe_dispatch re-makes the permuted buffer from local tokens, which "
                        f"expert parallelism (parallel.expert = {p.expert}) receives from other ranks; drop it")
    return problems


def arch_number(arch: str | tuple[int, int]) -> int:
    """Compute capability as major·10 + minor: "sm_90" / "sm_90a" / "9.0" / (9, 0) → 90, "sm_100" → 100."""
    if isinstance(arch, tuple):
        return arch[0] * 10 + arch[1]
    text = arch.strip().lower().removeprefix("sm_").removeprefix("compute_").rstrip("abf")
    if "." in text:
        major, minor = text.split(".", 1)
        return int(major) * 10 + int(minor)
    return int(text)


def _tokens_per_chunk(recipe: Recipe) -> list[int]:
    """The distinct chunk sizes one micro-batch's MoE layer dispatches (the last chunk may be shorter)."""
    moe, t = recipe.model.moe, recipe.training
    tokens = t.micro_batch_size * t.seq_length
    return sorted(set(chunk_sizes(tokens, moe.dispatch_chunk_tokens if moe else None)))


TE_INSTALL = "pip install transformer-engine[pytorch]"


def te_knobs(recipe: Recipe) -> list[str]:
    """The `key: value` settings of this recipe that run through Transformer Engine."""
    knobs = []
    if recipe.precision in QUANTIZED_PRECISIONS:
        knobs.append(f"precision: {recipe.precision}")
    if recipe.cross_entropy == "te":
        knobs.append("cross_entropy: te")
    if recipe.model.moe is not None and recipe.model.moe.grouped_gemm == "te":
        knobs.append("model.moe.grouped_gemm: te")
    if recipe.model.moe is not None and recipe.model.moe.expert_wgrad == "te":
        knobs.append("model.moe.expert_wgrad: te")
    return knobs


def missing_te_problems(recipe: Recipe, te_error: str | None) -> list[str]:
    """One problem per TE knob when Transformer Engine cannot be imported (te_error says why; None = it can)."""
    if te_error is None:
        return []
    return [f"{knob} needs Transformer Engine, which cannot be imported here ({te_error}): {TE_INSTALL}"
            for knob in te_knobs(recipe)]


def knob_problems(recipe: Recipe, device_type: str | None, arch: int | None, arch_name: str | None = None
                  ) -> list[str]:
    """What the performance knobs need of the machine, checked against what is known of it.

    device_type "cpu"/"cuda" or None (unknown), arch = compute capability as major·10 + minor or None.
    Shared by the pre-submit checks (the recipe alone) and the trainer at start-up (the real device).
    Every problem starts with the recipe key path.
    """
    problems: list[str] = []
    moe, prec = recipe.model.moe, recipe.precision
    where = f"the target GPU is {arch_name or f'sm_{arch}'}"
    on_cpu = device_type == "cpu"
    cpu = "this run is on the CPU" if recipe.device != "cpu" else "this recipe sets device: cpu"
    if prec in QUANTIZED_PRECISIONS:
        if on_cpu:
            problems.append(f"precision: {prec} runs Transformer Engine GEMMs on a CUDA GPU; {cpu}")
        need = MIN_ARCH["fp8/block" if prec == "fp8" and recipe.fp8_recipe == "block" else prec]
        if arch is not None and arch < need:
            if prec in BLACKWELL_ONLY_PRECISIONS:
                problems.append(f"precision: {prec} needs a Blackwell GPU (sm_100+); {where}")
            elif need > MIN_ARCH["fp8"]:
                problems.append(f"fp8_recipe: block (Float8BlockScaling) needs Hopper or newer (sm_90+); {where}")
            else:
                problems.append(f"precision: fp8 needs an FP8 GPU (Ada/Hopper, sm_89+); {where}")
        problems.extend(_alignment_problems(recipe))
    if recipe.cross_entropy == "te" and on_cpu:
        problems.append(f"cross_entropy: te (Transformer Engine parallel_cross_entropy) needs a CUDA GPU; {cpu}")
    problems.extend(_fusion_problems(recipe, on_cpu))
    problems.extend(checkpoint_problems(recipe))
    if moe is not None:
        if moe.expert_wgrad == "te" and on_cpu:
            problems.append(f"model.moe.expert_wgrad: te (Transformer Engine grouped GEMM) needs a CUDA GPU; {cpu}")
        if moe.grouped_gemm == "te" and on_cpu:
            problems.append(f"model.moe.grouped_gemm: te (Transformer Engine GroupedLinear) needs a CUDA GPU; {cpu}")
        if moe.dispatcher_sms is not None and on_cpu:
            problems.append(f"model.moe.dispatcher_sms: green contexts need a CUDA GPU; {cpu}")
        side_stream = moe.dispatcher_sms is not None or (moe.dispatch_chunk_tokens is not None and moe.dispatch_overlap)
        if recipe.recompute == "full" and side_stream and not on_cpu and recipe.device != "cpu":
            problems.append("recompute: full would recompute each MoE layer on the dispatcher stream (the backward "
                            "replays a layer on the stream of its last op, the combine); use selective, or "
                            "model.moe.dispatch_overlap: false")
    return problems


def checkpoint_problems(recipe: Recipe) -> list[str]:
    """What checkpoints cannot cover yet: expert-parallel shards and TE GroupedLinear experts."""
    ckpt, moe = recipe.checkpoint, recipe.model.moe
    if ckpt.save_at is None and ckpt.load_from is None:
        return []
    key = "checkpoint.save_at" if ckpt.save_at is not None else "checkpoint.load_from"
    problems = []
    if recipe.parallel.expert > 1:
        problems.append(f"{key}: checkpoints hold every expert on one rank; expert parallelism (parallel.expert "
                        f"= {recipe.parallel.expert}) shards them, which is not supported yet: use parallel.expert: 1")
    if moe is not None and moe.grouped_gemm == "te":
        problems.append(f"{key}: checkpoints of TE GroupedLinear experts (model.moe.grouped_gemm: te) are not "
                        "supported yet: use grouped_gemm: torch or loop")
    return problems


def _fusion_problems(recipe: Recipe, on_cpu: bool) -> list[str]:
    """Gradient-accumulation fusion writes the gradients on the weights: fp32 main grads (hooks) cannot be used."""
    opt, moe = recipe.optimizer, recipe.model.moe
    problems = []
    masters = opt.master_weights if opt.master_weights is not None else recipe.precision != "fp32" and not on_cpu
    if opt.grad_accumulation_fusion and not masters and recipe.precision != "fp32" and not on_cpu:
        problems.append("optimizer.grad_accumulation_fusion: with master_weights: false the weights stay fp32 under "
                        "bf16 autocast and their gradient GEMMs cannot accumulate into them; keep master weights "
                        "(the default) with optimizer.main_grads: bf16")
    if opt.grad_accumulation_fusion and masters and opt.main_grads == "fp32":
        problems.append("optimizer.grad_accumulation_fusion needs the gradients on the weights: set "
                        "optimizer.main_grads: bf16 (fp32 main grads are filled by per-parameter hooks, which the "
                        "fused GEMMs bypass)")
    if moe is not None and moe.expert_wgrad == "te" and not opt.grad_accumulation_fusion:
        problems.append("model.moe.expert_wgrad: te accumulates into the gradient: set "
                        "optimizer.grad_accumulation_fusion: true")
    return problems


def _alignment_problems(recipe: Recipe) -> list[str]:
    """TE's quantized GEMMs need every GEMM dimension aligned (FP8: 16; MXFP8/NVFP4 blocks: 32)."""
    m, moe, t, prec = recipe.model, recipe.model.moe, recipe.training, recipe.precision
    align = FP8_ALIGN if prec == "fp8" else 32
    dims = {
        "model.hidden_size": m.hidden_size,
        "query size (num_attention_heads × head size)": m.num_attention_heads * m.kv_channels,
        "key/value size (num_query_groups × head size)": m.kv_heads * m.kv_channels,
        "tokens per micro-batch (training.micro_batch_size × seq_length)": t.micro_batch_size * t.seq_length,
    }
    has_dense = moe is None or (moe.layer_freq > 1 and m.num_layers > 1)
    if has_dense:
        dims["model.ffn_hidden_size"] = m.ffn_hidden_size
    if moe is not None and moe.num_shared_experts:
        dims["shared-expert hidden size"] = moe.shared_expert_ffn_hidden_size or moe.ffn_hidden_size * moe.num_shared_experts
    if moe is not None and moe.grouped_gemm == "te":
        dims["model.moe.ffn_hidden_size"] = moe.ffn_hidden_size
    problems = [f"precision: {prec} (Transformer Engine) needs {name} divisible by {align} (got {value})"
                for name, value in dims.items() if value % align]
    if moe is not None and moe.grouped_gemm == "te":
        capacities = None
        if moe.capacity_factor is not None and moe.pad_to_capacity:
            capacities = [expert_capacity(n, moe.top_k, moe.num_experts, moe.capacity_factor)
                          for n in _tokens_per_chunk(recipe)]
        if capacities is None or any(c % align for c in capacities):
            got = "dropless: data-dependent group sizes" if capacities is None else f"capacity {capacities}"
            problems.append(
                f"model.moe.grouped_gemm: te under precision {prec} needs every expert's row count divisible by "
                f"{align}: set capacity_factor with pad_to_capacity so the capacity is ({got})"
            )
    return problems
