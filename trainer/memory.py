"""Per-GPU peak memory estimate of a bundled-trainer recipe, and of Megatron-LM flags (torch-free: login node).

`estimate(recipe, world_size)` models what the bundled trainer really allocates (trainer/model.py, moe.py,
loss.py, master.py, loop.py, parallelize.py, expert_parallel.py), as PyTorch's `max_memory_allocated` counts it:

- model states: parameters in the model dtype (bf16 with master weights, else fp32), fp32 master weights, the
  Adam moments (two fp32 or bf16 (`optimizer.moments`) tensors per optimizer parameter, plus fused AdamW's
  4-byte `step` per tensor; the precision-aware AdamW of trainer/adamw_pa.py keeps one step counter), fp32
  main grads (`optimizer.main_grads: fp32` on one rank: allocated once, kept) or bf16 gradients (kept across the
  micro-batches of a step), DDP's gradient buckets (DP > 1: kept for the whole run);
- per micro-batch, what autograd keeps for the backward, tensor by tensor (attention, MLP / experts, the MoE
  dispatch buffers sized by top-k, capacity and padding), by recompute mode, compile and precision;
- logits and cross entropy: native keeps the fp32 log-softmax [N, V] and its backward holds three fp32 [N, V]
  buffers at once; fused holds ≤ 1 GiB chunks plus an fp32 [V, h] weight gradient; TE's kernel one [N, V];
- the peak: the larger of the forward/backward of the last micro-batch (walked layer by layer backwards: the
  cross-entropy backward, then each layer with the gradients made so far) and the optimizer step (every
  gradient beside everything else; bf16 gradients are read in place, trainer/adamw_pa.py).

Sharding as the trainer implements it: EP divides the expert parameters, their gradients and their optimizer
state (each rank still computes ~N·k rows under balanced routing); DP replicates everything (no ZeRO, no
distributed optimizer) and only adds DDP's buckets; TP, PP and CP are refused by the trainer, so `estimate`
raises ValueError for them rather than pretend. `estimate_megatron(args)` follows Megatron-LM's published
reasoning instead (Korthikanti et al. 2022 activations, the distributed optimizer's bytes per parameter).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

from trainer.capacity import chunk_sizes, expert_capacity
from trainer.flops import moe_layer_pattern, padded_vocab_size
from trainer.recipe import QUANTIZED_PRECISIONS, Recipe, layout_problems

GIB = 1 << 30
MIB = 1 << 20
CUBLAS_WORKSPACE = (
    32 * MIB
)  # torch's default cuBLAS workspace on Hopper (":4096:8"), one per (thread, stream)
FUSED_CHUNK_BYTES = 1 << 30  # trainer/loss.py: budget of one fp32 logits chunk of the fused cross entropy


MAX_LAYERS = 2_000  # more is no real model: the estimate, which walks every layer, refuses it


def check_layers(layers: int) -> None:
    """ValueError for a layer count the estimate will not walk (more than MAX_LAYERS, or none)."""
    if not 0 < layers <= MAX_LAYERS:
        raise ValueError(f"{layers} layers: the memory estimate models 1 to {MAX_LAYERS:,} layers")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU: `parts` is what is allocated at the peak (it sums to `peak_bytes`)."""

    parts: dict[str, int]
    peak_bytes: int
    peak_at: str
    phases: dict[str, int] = field(default_factory=dict)  # the peak of each phase
    sizes: dict[str, int] = field(
        default_factory=dict
    )  # reference figures (counts and per-micro-batch bytes)
    notes: tuple[str, ...] = ()
    reserve_bytes: int = 0  # caching-allocator slack to allow for: 2 × the largest single buffer

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    def headroom(self, gpu_bytes: int) -> int:
        """GPU memory left after the peak and the allocator's slack (negative: expect an out-of-memory error)."""
        return gpu_bytes - self.peak_bytes - self.reserve_bytes

    def lines(self) -> list[str]:
        """Human lines: the peak, then each part in GiB with one decimal."""
        out = [f"peak {self.peak_gib:.1f} GiB per GPU at {self.peak_at}"]
        width = max((len(k) for k in self.parts), default=0)
        out += [f"  {name:<{width}}  {size / GIB:6.1f} GiB" for name, size in self.parts.items() if size]
        out += [f"  {name}: {size / GIB:.1f} GiB" for name, size in self.phases.items()]
        out.append(f"  allocator slack to allow for (2 × largest buffer): {self.reserve_bytes / GIB:.1f} GiB")
        out += [f"  note: {n}" for n in self.notes]
        return out

    def to_dict(self) -> dict:
        return {
            "peak_bytes": self.peak_bytes,
            "reserve_bytes": self.reserve_bytes,
            "peak_at": self.peak_at,
            "parts": dict(self.parts),
            "phases": dict(self.phases),
            "sizes": dict(self.sizes),
            "notes": list(self.notes),
        }


def _pick_peak(candidates: dict[str, dict[str, int]], **extra) -> MemoryEstimate:
    """The candidate moment with the most bytes becomes the peak; every moment's total is a phase."""
    totals = {name: sum(parts.values()) for name, parts in candidates.items()}
    at = max(totals, key=lambda name: totals[name])
    parts = {k: v for k, v in candidates[at].items() if v}
    return MemoryEstimate(parts=parts, peak_bytes=totals[at], peak_at=at, phases=totals, **extra)


# ---------------------------------------------------------------------------------------------
# Parameters of the bundled GPT (trainer/model.py, trainer/moe.py), per rank.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """Parameter counts of one rank's model (experts already divided by EP)."""

    embedding: int
    output: int
    norms: int  # RMSNorm weights (2 per layer + final)
    attention: list[int]  # per layer: QKV + output projection
    mlp: list[int]  # per layer: dense MLP, or shared experts of a MoE layer
    router: list[int]
    experts: list[int]  # per layer: this rank's routed experts
    tensors: int  # parameter tensors (fused AdamW keeps a 4-byte `step` per tensor)

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.output
            + self.norms
            + sum(self.attention)
            + sum(self.mlp)
            + sum(self.router)
            + sum(self.experts)
        )

    def layer(self, i: int) -> int:
        """Layer i's parameters without its two norm weights."""
        return self.attention[i] + self.mlp[i] + self.router[i] + self.experts[i]

    def largest_tensor(self, i: int, recipe: Recipe) -> int:
        """Elements of layer i's largest parameter tensor (its gradient is the biggest one made at once)."""
        m, moe, ep = recipe.model, recipe.model.moe, recipe.parallel.expert
        up = 2 if m.activation == "swiglu" else 1  # the up projection's share of an MLP: up / (up + 1)
        qkv = m.hidden_size * (m.num_attention_heads + 2 * m.kv_heads) * m.kv_channels
        largest = max(qkv, self.mlp[i] * up // (up + 1))
        if self.experts[i] and moe is not None:
            w1 = self.experts[i] * up // (up + 1)
            largest = max(largest, w1 // (moe.num_experts // ep) if moe.expert_weights == "discrete" else w1)
        return largest


def _mlp_params(h: int, ffn: int, activation: str) -> int:
    return h * (2 * ffn if activation == "swiglu" else ffn) + ffn * h


def count_params(recipe: Recipe) -> Params:
    """What trainer.model.GPT holds on one rank (EP keeps num_experts / EP experts per MoE layer)."""
    m, moe, ep = recipe.model, recipe.model.moe, recipe.parallel.expert
    h, q, kv = m.hidden_size, m.num_attention_heads * m.kv_channels, m.kv_heads * m.kv_channels
    vocab = padded_vocab_size(m.vocab_size, recipe.parallel.tensor)
    pattern = moe_layer_pattern(m.num_layers, moe.layer_freq) if moe else [0] * m.num_layers
    attention, mlp, router, experts = [], [], [], []
    tensors = 3  # embedding, output, final norm; the per-layer ones below
    for is_moe in pattern:
        attention.append(h * (q + 2 * kv) + q * h)
        tensors += 4  # two norms, QKV, output projection
        if not is_moe:
            mlp.append(_mlp_params(h, m.ffn_hidden_size, m.activation))
            router.append(0)
            experts.append(0)
            tensors += 2
            continue
        shared = 0
        if moe.num_shared_experts:
            shared = _mlp_params(
                h,
                moe.shared_expert_ffn_hidden_size or moe.ffn_hidden_size * moe.num_shared_experts,
                m.activation,
            )
            tensors += 2
        local = moe.num_experts // ep
        mlp.append(shared)
        router.append(moe.num_experts * h)
        experts.append(local * _mlp_params(h, moe.ffn_hidden_size, m.activation))
        tensors += 1 + (2 * local if moe.expert_weights == "discrete" else 2)
    return Params(vocab * h, vocab * h, (2 * m.num_layers + 1) * h, attention, mlp, router, experts, tensors)


# ---------------------------------------------------------------------------------------------
# Precision: which dtypes the trainer uses for weights, gradients and activations.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    gpu: bool
    autocast: bool  # bf16 autocast (activations 2 bytes), else fp32 compute
    master: bool  # bf16 weights + fp32 master weights
    fp32_main_grads: bool  # persistent fp32 main grads (one rank only: DDP disables the hooks)
    ddp: bool
    bf16_moments: bool = False  # optimizer.moments: bf16

    @property
    def param_bytes(self) -> int:
        return 2 if self.master else 4

    @property
    def precision_aware(self) -> bool:
        """trainer/master.py and optim.py: fused AdamW only over fp32 main grads (or fp32 weights) with fp32
        moments; otherwise trainer/adamw_pa.py, which reads bf16 gradients in place (no fp32 copy)."""
        return self.bf16_moments or (self.master and not self.fp32_main_grads)

    def optimizer_state_bytes(self, params: int, tensors: int) -> int:
        """Adam m and v (fp32 or bf16) plus fused AdamW's 4-byte `step` per tensor (one step counter for the
        precision-aware optimizer)."""
        if self.precision_aware:
            return 2 * params * (2 if self.bf16_moments else 4) + 4
        return 8 * params + 4 * tensors

    @property
    def act_bytes(self) -> int:
        return 2 if self.autocast else 4


def precision_of(recipe: Recipe, world_size: int, gpu: bool) -> Precision:
    """trainer/loop.py's choices: autocast on GPU for bf16/fp8; master weights default on with autocast."""
    autocast = gpu and recipe.precision != "fp32"
    opt = recipe.optimizer
    master = opt.master_weights if opt.master_weights is not None else autocast
    ddp = world_size > 1
    fp32_main = master and opt.main_grads == "fp32" and not ddp
    return Precision(gpu, autocast, master, fp32_main, ddp, opt.moments == "bf16")


# ---------------------------------------------------------------------------------------------
# Activations kept for the backward, per layer and micro-batch (N tokens of this rank).
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerActs:
    attention: int
    mlp: int  # dense MLP or the experts' GEMM inputs/outputs and the router
    dispatch: int  # MoE permuted rows (dispatch buffer, expert outputs read by the combine) and the plan
    largest: int  # the largest single activation (sizes the backward's gradient buffers)

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.dispatch


def attention_acts(recipe: Recipe, n: int, a: int, gpu: bool) -> tuple[int, int]:
    """(bytes kept, largest tensor) of one attention block: norm input, QKV output (v keeps it), rotated q, k,
    the attention output (kept by the output projection; selective core_attn drops only the softmax stats)."""
    m = recipe.model
    h, q, kv = m.hidden_size, m.num_attention_heads * m.kv_channels, m.kv_heads * m.kv_channels
    b, s = recipe.training.micro_batch_size, recipe.training.seq_length
    kept = n * h * a * 2 + n * (q + 2 * kv) * a + n * (q + kv) * a + n * q * a + 2 * s * m.kv_channels * a
    if "core_attn" not in recipe.selective_modules():
        # Flash/cuDNN keep fp32 row statistics; the CPU's math path keeps the [B, H, S, S] probabilities.
        kept += b * m.num_attention_heads * s * 4 if gpu else b * m.num_attention_heads * s * s * a
    return kept, n * (q + 2 * kv) * a


def dense_mlp_acts(n: int, h: int, ffn: int, activation: str, a: int, compiled: bool) -> tuple[int, int]:
    """(bytes kept, largest) of a dense MLP after its norm: input, up output, SiLU output (eager), activation."""
    if activation == "swiglu":
        kept = n * h * a + n * 2 * ffn * a + n * ffn * a * (1 if compiled else 2)
        return kept, n * 2 * ffn * a
    return n * h * a + 2 * n * ffn * a, n * ffn * a  # squared ReLU keeps relu(h) and h²


def dispatch_rows(recipe: Recipe, n: int) -> int:
    """Rows of the permuted buffer per micro-batch (balanced routing): N·k dropless, E·capacity padded (capacity
    counted per dispatch chunk), N·k·min(1, factor) in the compact buffer."""
    moe = recipe.model.moe
    if moe.capacity_factor is None:
        return n * moe.top_k
    if moe.pad_to_capacity:
        sizes = chunk_sizes(n, moe.dispatch_chunk_tokens)
        return sum(moe.num_experts * expert_capacity(c, moe.top_k, moe.num_experts, moe.capacity_factor) for c in sizes)
    return int(n * moe.top_k * min(1.0, moe.capacity_factor))


def moe_acts(recipe: Recipe, n: int, a: int) -> tuple[int, int, int]:
    """(mlp bytes, dispatch bytes, largest) of one MoE layer after its norm."""
    m, moe = recipe.model, recipe.model.moe
    h, k, ffn = m.hidden_size, moe.top_k, moe.ffn_hidden_size
    rows = dispatch_rows(recipe, n)
    selective = recipe.selective_modules()
    experts_eager = not recipe.compile or bool(selective & {"moe_act", "moe_dispatch"})  # compiler.disable'd
    up = 2 * ffn if m.activation == "swiglu" else ffn
    # Router: its fp32 input copy (dropped under compile), softmax outputs, indices.
    mlp = n * h * 4 * (1 if not recipe.compile else 0) + n * moe.num_experts * 4 + n * k * (8 + 8 + 4)
    mlp += n * h * a  # the norm's input (the residual stream)
    mlp += rows * up * a  # first GEMM's output (the activation's backward keeps it)
    if m.activation == "swiglu" and experts_eager:
        mlp += rows * ffn * a  # silu(gate), kept by the product
    if "moe_act" not in selective:
        mlp += rows * ffn * a  # the activation output: the second GEMM's input
    # The expert outputs (read by the combine) and the plan's indices.
    dispatch = rows * h * a + rows * 8 * 2 + n * k * (8 + 4 + 1)
    if "moe_dispatch" in selective and recipe.parallel.expert == 1:
        dispatch += n * h * a  # the re-gather keeps the chunk's tokens instead of the buffer
    else:
        dispatch += rows * h * a  # the permuted buffer: the first GEMM's input
    if moe.num_shared_experts:
        shared = moe.shared_expert_ffn_hidden_size or ffn * moe.num_shared_experts
        mlp += dense_mlp_acts(n, h, shared, m.activation, a, recipe.compile)[0]
    return mlp, dispatch, rows * max(h, up) * a


def layer_acts(recipe: Recipe, is_moe: bool, gpu: bool, a: int) -> LayerActs:
    """What one layer keeps for the backward with recompute none/selective (full keeps only its input)."""
    m, t = recipe.model, recipe.training
    n = t.micro_batch_size * t.seq_length
    attn, largest = attention_acts(recipe, n, a, gpu)
    if is_moe:
        mlp, dispatch, big = moe_acts(recipe, n, a)
        return LayerActs(attn, mlp, dispatch, max(largest, big))
    mlp, big = dense_mlp_acts(n, m.hidden_size, m.ffn_hidden_size, m.activation, a, recipe.compile)
    return LayerActs(attn, mlp + n * m.hidden_size * a, 0, max(largest, big))


# ---------------------------------------------------------------------------------------------
# Output layer and cross entropy (trainer/loss.py).
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossMemory:
    kept: int  # kept for the backward of the head: final norm input, the normed hidden (native/te)
    forward: int  # extra bytes at the loss's forward peak
    backward: int  # extra bytes at the loss's backward peak


def loss_memory(recipe: Recipe, n: int, vocab: int, prec: Precision) -> LossMemory:
    """native: bf16 logits, their fp32 copy and the fp32 log-softmax in the forward; its backward holds the kept
    log-softmax, the NLL gradient and the log-softmax gradient, three fp32 [N, V] at once.
    fused: chunks of ≤ 1 GiB fp32 logits (logits, softmax, softmax/N and its bf16 copy at once), an fp32 [V, h]
    weight gradient and the [N, h] input gradient, computed in the forward. te: one [N, V] in the compute dtype."""
    h, a, pb = recipe.model.hidden_size, prec.act_bytes, prec.param_bytes
    nv = n * vocab
    if recipe.cross_entropy == "fused":
        rows = min(n, max(1, FUSED_CHUNK_BYTES // (4 * vocab)))
        chunk = rows * vocab * 4
        transient = 3 * chunk + (chunk // 2 if a == 2 else 0)
        cast = vocab * h * a if pb != a else 0  # fp32 weights cast to the compute dtype
        forward = vocab * h * 4 + n * h * a + transient + cast + n * h * a
        kept = n * h * a + vocab * h * pb  # grad(hidden), grad(weight) saved for the backward
        return LossMemory(n * h * a, forward, kept + n * h * a + vocab * h * pb)
    if recipe.cross_entropy == "te":
        return LossMemory(2 * n * h * a, nv * a + n * 8, 2 * nv * a)
    forward = nv * (a + 4 + 4) if a == 2 else nv * 8
    return LossMemory(2 * n * h * a, forward, 3 * nv * 4)


# ---------------------------------------------------------------------------------------------
# Model states and the peak.
# ---------------------------------------------------------------------------------------------


def dispatcher_stream(recipe: Recipe, gpu: bool) -> bool:
    """trainer/loop.py: a side stream with dispatcher_sms, or chunked dispatch with overlap, on a GPU."""
    moe = recipe.model.moe
    return bool(
        gpu
        and moe
        and (
            moe.dispatcher_sms is not None or (moe.dispatch_chunk_tokens is not None and moe.dispatch_overlap)
        )
    )


def fused_gradients(recipe: Recipe, params: Params, prec: Precision) -> tuple[int, list[int]]:
    """(output layer, per layer) parameters whose gradients gradient-accumulation fusion keeps all run long
    (trainer/grad_accum.py: made zeroed before the first micro-batch, never freed): the output layer, the
    experts with expert_wgrad: te, and the TE block linears under quantized precisions; 0s when it is off."""
    layers = len(params.attention)
    weights_in_compute_dtype = prec.master or not prec.autocast
    if not recipe.optimizer.grad_accumulation_fusion or prec.fp32_main_grads:
        return 0, [0] * layers
    output = params.output if recipe.cross_entropy != "fused" and weights_in_compute_dtype else 0
    moe = recipe.model.moe
    experts = moe is not None and moe.expert_wgrad == "te" and weights_in_compute_dtype
    te_linears = recipe.precision in QUANTIZED_PRECISIONS
    per_layer = [(params.experts[i] if experts else 0) + (params.attention[i] + params.mlp[i] if te_linears else 0)
                 for i in range(layers)]
    return output, per_layer


def fused_sharded_experts(recipe: Recipe, params: Params, prec: Precision) -> int:
    """Parameters of the expert-parallel experts whose gradients fusion keeps all run long (0 without EP)."""
    if recipe.parallel.expert == 1:
        return 0
    _, per_layer = fused_gradients(recipe, params, prec)
    moe = recipe.model.moe
    fused = moe is not None and moe.expert_wgrad == "te" and any(per_layer)
    return sum(params.experts) if fused else 0


def static_parts(recipe: Recipe, params: Params, prec: Precision) -> dict[str, int]:
    """Allocated for the whole run after the first optimizer step (Adam's state is made lazily there)."""
    p = params.total
    parts = {
        "parameters": p * prec.param_bytes,
        "master weights (fp32)": 4 * p if prec.master else 0,
        "optimizer state (Adam m, v)": prec.optimizer_state_bytes(p, params.tensors),
        "gradients": 0,
    }
    if prec.fp32_main_grads:
        parts["gradients"] = 4 * p
    elif prec.ddp:  # DDP's buckets (gradient_as_bucket_view) or fused buffers: every non-expert gradient, all run
        # long; the sharded experts' too when fused (trainer/grad_reduce.py reduces them outside DDP)
        sharded = sum(params.experts) if recipe.parallel.expert > 1 else 0
        parts["gradients"] = (p - sharded + fused_sharded_experts(recipe, params, prec)) * prec.param_bytes
    else:  # gradient-accumulation fusion: the fused weights' gradients, all run long
        output, per_layer = fused_gradients(recipe, params, prec)
        parts["gradients"] = (output + sum(per_layer)) * prec.param_bytes
    streams = 2 if dispatcher_stream(recipe, prec.gpu) else 1
    rope = 2 * recipe.training.seq_length * recipe.model.kv_channels * 4
    parts["workspaces (cuBLAS, RoPE)"] = (2 * streams * CUBLAS_WORKSPACE if prec.gpu else 0) + rope
    return parts


def grads_made_in_backward(recipe: Recipe, params: Params, prec: Precision, accum: int) -> int:
    """Gradient bytes not yet allocated when the last micro-batch's backward starts (0 when they persist)."""
    if prec.fp32_main_grads or accum > 1:
        return 0
    if prec.ddp:
        if recipe.parallel.expert == 1 or fused_sharded_experts(recipe, params, prec):
            return 0
        return sum(params.experts) * prec.param_bytes
    output, per_layer = fused_gradients(recipe, params, prec)
    return (params.total - output - sum(per_layer)) * prec.param_bytes


def weight_copies(recipe: Recipe, params: Params, prec: Precision) -> tuple[int, list[int]]:
    """fp32 weights under bf16 autocast (master weights off): (the linear weights' bf16 casts in autocast's cache,
    alive until the backward ends; each layer's expert casts, kept by grouped_mm until that layer's backward)."""
    if prec.master or not prec.autocast:
        return 0, [0] * len(params.experts)
    cached = (
        sum(params.attention) + sum(params.mlp) + (params.output if recipe.cross_entropy != "fused" else 0)
    )
    return 2 * cached, [2 * e for e in params.experts]


@dataclass(frozen=True)
class Step:
    """What one micro-batch keeps and makes, for the walk over its forward and backward."""

    layers: list[LayerActs]  # recompute none/selective sizes of every layer
    kept: list[int]  # what each layer keeps (its input only under full recompute)
    loss: LossMemory
    token_bytes: int  # one [N, h] activation
    copies: int  # bf16 casts of fp32 linear weights alive through the whole micro-batch
    expert_copies: list[int]  # per layer: bf16 casts of fp32 expert weights (freed in that layer's backward)

    @functools.cached_property
    def sums(self) -> dict[str, list[int]]:
        """Prefix sums over the layers (sums[name][k]: layers 0..k-1), so the backward walk is linear."""
        series = {
            "expert_copies": self.expert_copies,
            "kept": self.kept,
            "attention": [la.attention for la in self.layers],
            "mlp": [la.mlp for la in self.layers],
            "dispatch": [la.dispatch for la in self.layers],
        }
        return {name: [0, *itertools.accumulate(values)] for name, values in series.items()}


def micro_batch(recipe: Recipe, params: Params, prec: Precision) -> Step:
    m, t = recipe.model, recipe.training
    n, a = t.micro_batch_size * t.seq_length, prec.act_bytes
    pattern = moe_layer_pattern(m.num_layers, m.moe.layer_freq) if m.moe else [0] * m.num_layers
    layers = [layer_acts(recipe, bool(is_moe), prec.gpu, a) for is_moe in pattern]
    kept = [n * m.hidden_size * a if recipe.recompute == "full" else la.total for la in layers]
    vocab = padded_vocab_size(m.vocab_size, recipe.parallel.tensor)
    copies, expert_copies = weight_copies(recipe, params, prec)
    return Step(
        layers, kept, loss_memory(recipe, n, vocab, prec), n * m.hidden_size * a, copies, expert_copies
    )


def _acts(step: Step, upto: int, full: bool) -> dict[str, int]:
    """Activations kept by layers 0..upto-1, by part (with the experts' bf16 weight casts of fp32 weights)."""
    sums = step.sums
    copies = {"weight copies (bf16, autocast)": step.copies + sums["expert_copies"][upto]}
    if full:
        return {**copies, "activations: layer inputs (full recompute)": sums["kept"][upto]}
    return {
        **copies,
        "activations: attention": sums["attention"][upto],
        "activations: MLP / experts": sums["mlp"][upto],
        "activations: MoE dispatch buffers": sums["dispatch"][upto],
    }


def fwd_bwd_moments(
    recipe: Recipe, params: Params, prec: Precision, base: dict[str, int], accum: int
) -> dict[str, dict[str, int]]:
    """The last micro-batch: its loss forward and backward, then each layer's backward (largest kept)."""
    step = micro_batch(recipe, params, prec)
    full, count = recipe.recompute == "full", len(step.layers)
    new_grads = grads_made_in_backward(recipe, params, prec, accum)
    grad_bytes = 2 if prec.master else 4
    all_acts = {**_acts(step, count, full), "activations: output layer input": step.loss.kept}
    moments = {
        "forward of the cross entropy (last micro-batch)": {
            **base,
            **all_acts,
            "logits + cross entropy": step.loss.forward,
        },
        "backward of the cross entropy (last micro-batch)": {
            **base,
            **all_acts,
            "logits + cross entropy": step.loss.backward,
        },
    }
    best: dict[str, int] | None = None
    layers_from = [*itertools.accumulate(params.layer(j) for j in reversed(range(count)))][::-1]  # j ≥ i
    experts_from = [*itertools.accumulate(reversed(params.experts))][::-1]
    fused_output, fused_layers = fused_gradients(recipe, params, prec)
    fused_from = [*itertools.accumulate(reversed(fused_layers))][::-1]
    for i in reversed(range(count)):
        made = params.output - fused_output + layers_from[i] - fused_from[i]  # fused ones exist already
        if prec.ddp:  # DDP's buckets exist already: only the sharded (unfused) experts' gradients are new
            made = 0 if fused_sharded_experts(recipe, params, prec) else experts_from[i]
        la = step.layers[i]
        buffers = 2 * la.largest + 2 * step.token_bytes
        if not new_grads:  # gradients persist: the layer's largest fresh gradient exists beside them
            buffers += params.largest_tensor(i, recipe) * grad_bytes
        parts = {**base, **_acts(step, i + 1, full), "backward buffers": buffers}
        parts["gradients"] = parts.get("gradients", 0) + (made * grad_bytes if new_grads else 0)
        if full:  # the layer's forward runs again in its backward
            parts["recomputed layer"] = la.total
        if best is None or sum(parts.values()) > sum(best.values()):
            best, at = parts, i
    if best is not None:
        moments[f"backward of layer {at + 1} of {count} (last micro-batch)"] = best
    return moments


def optimizer_moment(recipe: Recipe, params: Params, prec: Precision, base: dict[str, int]) -> dict[str, int]:
    """optimizer.step(): every gradient (bf16 gradients are read in place by the precision-aware optimizer: no
    fp32 copies); with EP over several expert-data-parallel ranks, the flat copy of the expert gradients first."""
    p, experts = params.total, sum(params.experts)
    parts = dict(base)
    if not prec.fp32_main_grads:
        parts["gradients"] = p * prec.param_bytes
    ep_flat = experts * prec.param_bytes if recipe.parallel.expert > 1 and prec.ddp else 0
    parts["expert gradients, flat copy (optimizer step)"] = ep_flat
    return parts


def estimate(recipe: Recipe, world_size: int = 1, *, gpu: bool | None = None) -> MemoryEstimate:
    """Peak allocated bytes per GPU of `recipe` on `world_size` ranks (gpu None: a GPU unless device: cpu).

    Raises ValueError for a layout the bundled trainer refuses (TP/PP/CP > 1, DP or EP not tiling the world)
    and for more than MAX_LAYERS layers (the model walks every layer)."""
    problems = layout_problems(recipe, world_size)
    if problems:
        raise ValueError("; ".join(problems))
    check_layers(recipe.model.num_layers)
    on_gpu = recipe.device != "cpu" if gpu is None else gpu
    prec = precision_of(recipe, world_size, on_gpu)
    params = count_params(recipe)
    dp = recipe.data_parallel_size(world_size)
    accum = recipe.global_batch(world_size) // (recipe.training.micro_batch_size * dp)
    base = static_parts(recipe, params, prec)
    fwd_base = dict(base)
    if accum > 1 and not prec.fp32_main_grads:  # the earlier micro-batches' gradients
        fwd_base["gradients"] = params.total * prec.param_bytes
    moments = fwd_bwd_moments(recipe, params, prec, fwd_base, accum)
    moments["optimizer step"] = optimizer_moment(recipe, params, prec, base)
    step = micro_batch(recipe, params, prec)
    sizes = {
        "parameters": params.total,
        "parameter tensors": params.tensors,
        "micro-batches per step": accum,
        "activations per micro-batch": sum(step.kept) + step.loss.kept,
        "activations per layer (no recompute, largest)": max(la.total for la in step.layers),
        "dispatch rows per MoE layer": dispatch_rows(
            recipe, recipe.training.micro_batch_size * recipe.training.seq_length
        )
        if recipe.model.moe
        else 0,
    }
    sizes["largest buffer"] = largest_buffer(recipe, params, prec, step)
    sizes.update(model_state_bytes(params, prec))
    return _pick_peak(
        moments, sizes=sizes, notes=_notes(recipe, prec), reserve_bytes=2 * sizes["largest buffer"]
    )


def model_state_bytes(params: Params, prec: Precision) -> dict[str, int]:
    """Parameters, the gradients held at the optimizer step (fp32 main grads, or the model-dtype gradients) and
    the optimizer's tensors (fp32 master weights, Adam m and v, a 4-byte step per tensor), in bytes."""
    p = params.total
    return {
        "parameter bytes": p * prec.param_bytes,
        "gradient bytes": 4 * p if prec.fp32_main_grads else p * prec.param_bytes,
        "optimizer bytes": (4 * p if prec.master else 0) + prec.optimizer_state_bytes(p, params.tensors),
    }


def point_record(recipe: Recipe, world_size: int, gpu_bytes: int | None = None) -> dict:
    """One point's estimate as plain data for `mbx campaign plan` and the store: estimated peak allocated GiB,
    where it happens, the allocator slack, and with `gpu_bytes` the headroom and whether the point fits."""
    est = estimate(recipe, world_size)
    record = {
        "est_peak_alloc_gib": round(est.peak_gib, 3),
        "est_peak_at": est.peak_at,
        "est_slack_gib": round(est.reserve_bytes / GIB, 3),
    }
    if gpu_bytes is not None:
        record["est_headroom_gib"] = round(est.headroom(gpu_bytes) / GIB, 3)
        record["fits"] = est.headroom(gpu_bytes) >= 0
    return record


def largest_buffer(recipe: Recipe, params: Params, prec: Precision, step: Step) -> int:
    """The largest single allocation of a step: an fp32 logits buffer (native), a loss chunk (fused), a layer's
    largest activation or parameter gradient. Freed and re-made every micro-batch, it fragments the cache."""
    n = recipe.training.micro_batch_size * recipe.training.seq_length
    vocab = padded_vocab_size(recipe.model.vocab_size, recipe.parallel.tensor)
    if recipe.cross_entropy == "native":
        loss = n * vocab * 4
    elif recipe.cross_entropy == "fused":
        loss = min(n, max(1, FUSED_CHUNK_BYTES // (4 * vocab))) * vocab * 4
    else:
        loss = n * vocab * prec.act_bytes
    grads = max(params.largest_tensor(i, recipe) for i in range(len(step.layers))) * 4
    return max(loss, grads, *(la.largest for la in step.layers))


def _notes(recipe: Recipe, prec: Precision) -> tuple[str, ...]:
    notes = []
    if (
        recipe.precision in ("fp8", "mxfp8", "nvfp4")
        or recipe.cross_entropy == "te"
        or (recipe.model.moe and recipe.model.moe.grouped_gemm == "te")
    ):
        notes.append("Transformer Engine modules are modeled as their bf16 torch equivalents")
    if recipe.model.moe and not recipe.model.moe.router.force_balance:
        notes.append("MoE buffers assume balanced routing (learned routing can overfill some experts)")
    if not prec.gpu:
        notes.append("CPU: fp32 compute, no allocator workspaces")
    return tuple(notes)


# ---------------------------------------------------------------------------------------------
# Megatron-LM flags of command trainers: Megatron's published reasoning, not calibrated.
# ---------------------------------------------------------------------------------------------


def _flag(args: dict, name: str, default=None):
    """args keyed as Megatron flags, with or without leading dashes, dashes or underscores."""
    for key in (name, name.replace("-", "_"), f"--{name}"):
        if key in args and args[key] is not None:
            return args[key]
    return default


@dataclass(frozen=True)
class MegatronShape:
    layers: int
    moe_layers: int
    h: int
    ffn: int
    heads: int
    q: int
    kv: int
    s: int
    b: int
    vocab: int
    experts: int
    top_k: int
    moe_ffn: int
    shared_ffn: int
    glu: int  # 3 with SwiGLU (gate and up), else 2
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    dp: int


def megatron_shape(args: dict) -> MegatronShape:
    """The model and layout of Megatron flags (defaults as Megatron's: ffn 4h, top-k 2, ETP = TP)."""
    h, heads = int(_flag(args, "hidden-size")), int(_flag(args, "num-attention-heads"))
    layers, kv_ch = int(_flag(args, "num-layers")), int(_flag(args, "kv-channels", h // heads))
    check_layers(layers)
    groups = (
        int(_flag(args, "num-query-groups", heads)) if _flag(args, "group-query-attention", False) else heads
    )
    tp, pp, cp = (
        int(_flag(args, f"{n}-parallel-size", 1)) for n in ("tensor-model", "pipeline-model", "context")
    )
    ep = int(_flag(args, "expert-model-parallel-size", 1))
    etp = int(_flag(args, "expert-tensor-parallel-size", tp))
    world = int(_flag(args, "world-size", tp * pp * cp))
    if world % (tp * pp * cp):
        raise ValueError(f"world size {world} is not divisible by TP·PP·CP = {tp}·{pp}·{cp}")
    vocab = _flag(args, "padded-vocab-size")
    if vocab is None:
        vocab = padded_vocab_size(
            int(_flag(args, "vocab-size")), tp, int(_flag(args, "make-vocab-size-divisible-by", 128))
        )
    experts = int(_flag(args, "num-experts", 0) or 0)
    freq = int(_flag(args, "moe-layer-freq", 1))
    ffn = int(_flag(args, "ffn-hidden-size", 4 * h))
    return MegatronShape(
        layers,
        sum(moe_layer_pattern(layers, freq)) if experts else 0,
        h,
        ffn,
        heads,
        heads * kv_ch,
        groups * kv_ch,
        int(_flag(args, "seq-length")),
        int(_flag(args, "micro-batch-size", 1)),
        int(vocab),
        experts,
        int(_flag(args, "moe-router-topk", 2)),
        int(_flag(args, "moe-ffn-hidden-size", ffn)),
        int(_flag(args, "moe-shared-expert-intermediate-size", 0) or 0),
        3 if _flag(args, "swiglu", False) else 2,
        tp,
        pp,
        cp,
        ep,
        etp,
        world // (tp * pp * cp),
    )


def megatron_model_states(sh: MegatronShape, args: dict) -> dict[str, int]:
    """Most loaded rank (first stage, with the embedding; the output layer too when PP = 1 and untied).
    Bytes per parameter as Megatron's distributed-optimizer notes: bf16 params + fp32 main grads + 12 bytes of
    fp32 master and Adam moments = 18; with --use-distributed-optimizer 6 + 12/d (fp32 params: 16, 8 + 8/d),
    d = DP·CP for dense parameters and the expert-data-parallel size for experts."""
    attn = sh.h * (sh.q + 2 * sh.kv) + sh.q * sh.h + 2 * sh.h
    dense_mlp = sh.glu * sh.h * sh.ffn
    expert = sh.glu * sh.h * sh.moe_ffn
    stage_layers, stage_moe = sh.layers / sh.pp, sh.moe_layers / sh.pp
    dense = (
        stage_layers * attn
        + (stage_layers - stage_moe) * dense_mlp
        + stage_moe * (sh.experts * sh.h + sh.glu * sh.h * sh.shared_ffn)
    ) / sh.tp
    embed = (
        sh.vocab
        * sh.h
        / sh.tp
        * (2 if sh.pp == 1 and _flag(args, "untie-embeddings-and-output-weights", False) else 1)
    )
    experts = stage_moe * sh.experts * expert / (sh.ep * sh.etp)
    bf16 = bool(_flag(args, "bf16", False) or _flag(args, "fp16", False))
    fp8 = _flag(args, "fp8-format") is not None or bool(_flag(args, "fp8", False))
    param_b, opt_b = (2, 12) if bf16 or fp8 else (4, 8)
    distributed = bool(_flag(args, "use-distributed-optimizer", False))
    expert_dp = max(1, sh.dp * sh.cp * sh.tp // (sh.ep * sh.etp))
    shard = (sh.dp * sh.cp, expert_dp) if distributed else (1, 1)
    return {
        "parameters": int((dense + embed + experts) * param_b),
        "gradients": int((dense + embed + experts) * 4),
        "optimizer state (master, Adam m, v)": int(
            (dense + embed) * opt_b / shard[0] + experts * opt_b / shard[1]
        ),
        # fp8: a cast and its transpose per GEMM weight.
        "fp8 weight copies": int((dense + experts) * 2) if fp8 else 0,
    }


def megatron_activations(sh: MegatronShape, args: dict) -> dict[str, int]:
    """Korthikanti et al. 2022, per layer and micro-batch on one TP rank with sequence parallelism:
    sbh(34 + 5as/h)/t, selective recompute sbh·34/t, full recompute 2sbh/t (the layer input). The MLP's 19 of
    the 34 scale with the MLP width (top-k × expert FFN for MoE, ×1.5 with SwiGLU); MoE layers add the permuted
    token buffers (in and out, 2·2·s·b·k·h). The first pipeline stage holds PP micro-batches in flight (1F1B),
    i.e. all L layers' worth; CP divides s. The logits: bf16 plus fp32 logits and their gradient, s·b·V/t·10."""
    s, b, h, t = sh.s / sh.cp, sh.b, sh.h, sh.tp
    sbh = s * b * h
    glu = 1.5 if sh.glu == 3 else 1.0
    granularity = _flag(args, "recompute-granularity")
    full_layers = 0
    if granularity == "full":
        per_stage = int(_flag(args, "recompute-num-layers", 1))
        # block: N layers per stage; uniform: every layer.
        block = _flag(args, "recompute-method", "uniform") == "block"
        full_layers = min(sh.layers, per_stage * sh.pp) if block else sh.layers
    # The 5as/h term is the [a, s, s] score matrix: kept only by the unfused attention (flash/fused keep none).
    unfused = _flag(args, "attention-backend", "auto") in ("unfused", "local") and not _flag(
        args, "use-flash-attn"
    )
    score = 5 * sh.heads * s / h if unfused and granularity != "selective" else 0.0

    def layer(mlp_width: float) -> float:
        return sbh * (15 + 19 * mlp_width * glu / (4 * h) + score) / t

    kept_dense, kept_moe = sh.layers - sh.moe_layers, sh.moe_layers
    frac_kept = (sh.layers - full_layers) / sh.layers
    acts = frac_kept * (kept_dense * layer(sh.ffn) + kept_moe * layer(sh.top_k * sh.moe_ffn + sh.shared_ffn))
    dispatch = frac_kept * kept_moe * 4 * s * b * sh.top_k * h / t
    ce = s * b * sh.vocab / t * (6 if _flag(args, "cross-entropy-loss-fusion", False) else 10)
    return {
        "activations": int(acts + full_layers * 2 * sbh / t),
        "MoE dispatch buffers": int(dispatch),
        "logits + cross entropy": int(ce) if sh.pp == 1 else 0,
    }


def estimate_megatron(args: dict) -> MemoryEstimate:
    """Peak bytes per GPU of a Megatron-LM run from its flags (documented reasoning; not calibrated)."""
    sh = megatron_shape(args)
    parts = {**megatron_model_states(sh, args), **megatron_activations(sh, args)}
    parts = {k: v for k, v in parts.items() if v}
    notes = (
        "Megatron-LM's published reasoning (paper formula, distributed-optimizer bytes); not calibrated",
    )
    sizes = {"data parallel": sh.dp, "padded vocab": sh.vocab}
    return MemoryEstimate(
        parts,
        sum(parts.values()),
        "first pipeline stage, model states + activations in flight",
        {},
        sizes,
        notes,
    )
