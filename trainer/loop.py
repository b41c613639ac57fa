"""The training loop: build model/optimizer/data from a recipe, step, evaluate, emit one metrics row per step.

CPU-GPU syncs, all marked `# SYNC` (here and in trainer/moe.py): one `torch.cuda.synchronize()` at the
end of each step (the step time is measured after it), then reads of the already-computed scalars.
Non-finite steps are skipped on the device (fused AdamW's `found_inf`), so a step never waits on the
host; only the opt-in MoE paths (capacity drops without padding, the loop GEMM, TE GroupedLinear experts
without padding, and expert parallelism without padding: one read of the layer's split sizes per layer and
micro-batch, trainer/expert_parallel.py) sync inside it.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trainer import checkpoint, expert_parallel, grad_accum
from trainer.data import MockData
from trainer.distributed import Dist, all_reduce_sum
from trainer.energy import StepEnergy
from trainer.expert_parallel import ExpertParallel
from trainer.flops import padded_vocab_size, step_flops, tflops_per_gpu
from trainer.grad_reduce import OutsideDDP, Reduction, data_parallel_group
from trainer.green import dispatcher_stream
from trainer.master import MasterWeights
from trainer.model import GPT
from trainer.moe import per_expert_grads, stacked_expert_weights
from trainer.optim import build_optimizer, clip_divisor, grad_norm, lr_at, set_lr
from trainer.parallelize import (
    apply_expert_parallel,
    attach_dispatcher,
    expert_parameters,
    no_sync,
    parallelize,
    unwrap,
)
from trainer.profiling import StepProfiler
from trainer.recipe import (
    QUANTIZED_PRECISIONS,
    ModelConfig,
    MoEConfig,
    OptimizerConfig,
    ParallelConfig,
    Recipe,
    TrainingConfig,
    arch_number,
    te_knobs,
)
from trainer.support import check_supported
from trainer.te_support import prepare_model, select_paths, te_import_error

GIB = float(1 << 30)
# Test hook: comma-separated 1-based steps at which global rank 0 multiplies its loss by NaN, to check that
# a non-finite step is skipped and counted on every rank, never fatal. Unset in real runs.
INJECT_NAN_ENV = "MBX_TRAINER_INJECT_NAN_STEP"


def _inject_nan_steps() -> set[int]:
    raw = os.environ.get(INJECT_NAN_ENV, "")
    return {int(s) for s in raw.split(",") if s.strip()}


def peak_rss_gib() -> float:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def _refuse_unsupported(recipe: Recipe, world_size: int, device: torch.device) -> None:
    """NotSupportedError naming the recipe keys this machine cannot run (its GPU's compute capability, TE)."""
    cuda = device.type == "cuda"
    arch = arch_number(torch.cuda.get_device_capability(device)) if cuda else None
    te_error = te_import_error() if te_knobs(recipe) else None
    check_supported(recipe, world_size, device.type, arch, te_error)


def _dispatcher_stream(moe: MoEConfig | None, device: torch.device) -> tuple[object, object]:
    """(green context, stream) the MoE dispatcher runs on: a green context's with dispatcher_sms, a plain
    side stream with chunked overlapped dispatch on a GPU, else (None, None): no separate stream."""
    if moe is None or device.type != "cuda":
        return None, None
    if moe.dispatcher_sms is not None:
        return dispatcher_stream(moe.dispatcher_sms, device)  # NotSupportedError where it cannot work
    if moe.dispatch_chunk_tokens is not None and moe.dispatch_overlap:
        return None, torch.cuda.Stream(device)
    return None, None


def _compute(precision: str, device: torch.device) -> tuple[bool, str]:
    """(bf16 autocast?, what computes): bf16 autocast on a GPU (fp8/mxfp8/nvfp4: TE's quantized GEMMs inside
    it); the CPU computes in fp32."""
    bf16 = device.type == "cuda" and precision in ("bf16", *QUANTIZED_PRECISIONS)
    if device.type == "cpu" and precision == "bf16":
        return bf16, "fp32 (precision bf16 on CPU means fp32 compute: no bf16 autocast on CPU)"
    return bf16, "bf16 autocast" if bf16 else "fp32"


class Trainer:
    def __init__(self, recipe: Recipe, dist: Dist, log: Callable[[str], None] = print,
                 expert_wgrad: str | None = None):
        """`expert_wgrad` overrides the recipe's fused expert weight-gradient backend (grad_accum.ACCUMULATORS):
        "torch" is the CPU stand-in for `model.moe.expert_wgrad: te` (the tests' way to fuse experts on a CPU).
        Each part is built from its own section of the recipe (the support check alone reads all of it)."""
        self.recipe, self.dist, self.log = recipe, dist, log
        self.device = dist.device
        _refuse_unsupported(recipe, dist.world_size, self.device)  # before anything is built; status.json names the key
        self.green_context, self.dispatcher = _dispatcher_stream(recipe.model.moe, self.device)
        t, opt = recipe.training, recipe.optimizer
        self.dp = recipe.data_parallel_size(dist.world_size)
        self.global_batch = recipe.global_batch(dist.world_size)
        self.accum = self.global_batch // (t.micro_batch_size * self.dp)
        self.flops = step_flops(recipe, dist.world_size)
        self.bf16, self.compute = _compute(recipe.precision, self.device)
        model, self.ep = self._build_model(recipe.model, recipe.parallel, t, recipe.cross_entropy)
        self.te = prepare_model(model, select_paths(recipe), self.device)  # TE modules in, before master weights
        if self.te.paths.uses_te:
            self.compute += f" + {self.te.describe()}"
        # The sharded experts' parameters, taken after TE may have swapped GroupedLinear experts in.
        self.expert_params = expert_parameters(model) if self.ep else []
        self._expert_ids = {id(p) for p in self.expert_params}
        expert_numel = sum(p.numel() for p in self.expert_params)
        self.params = sum(p.numel() for p in model.parameters()) + expert_numel * (recipe.parallel.expert - 1)
        self.master = self._master_weights(model, opt)
        self.fused_weights = self._fused_weights(model, opt, recipe.model.moe, expert_wgrad)
        self._stacked_experts = stacked_expert_weights(model)  # their grads count per expert in the grad norm
        self.outside = self._outside_ddp()
        self.model = parallelize(model, recompute=recipe.recompute, compile=recipe.compile, dist=dist,
                                 recompute_modules=recipe.selective_modules() or None,
                                 outside_ddp=self.outside.params if self.outside else None)
        self.param_list = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self.master.optimizer if self.master else build_optimizer(self.model, opt)
        # With TP = PP = CP = 1 every rank is its own data-parallel rank.
        self.data = MockData(t.seed, recipe.model.vocab_size, t.seq_length, t.micro_batch_size, dist.rank, self.dp,
                             self.accum, self.device)
        self.inject_nan = _inject_nan_steps()
        self.skipped = self.nan_steps = self.completed = 0
        self.start_step = self.completed = self._load_checkpoint(recipe)

    def _build_model(self, m: ModelConfig, parallel: ParallelConfig, t: TrainingConfig,
                     cross_entropy: str) -> tuple[GPT, ExpertParallel | None]:
        """(the GPT drawn from `training.seed` on the device with its dispatcher attached, its expert parallelism):
        with EP > 1 this rank's experts only, drawn in full first (every EP layout starts from EP = 1's weights)."""
        torch.manual_seed(t.seed)  # weights are drawn on the device, so CPU and GPU inits differ
        with torch.device(self.device):
            model = GPT(m, t.seq_length, padded_vocab_size(m.vocab_size, parallel.tensor), cross_entropy=cross_entropy)
        attach_dispatcher(model, self.dispatcher)
        ep = expert_parallel.build(parallel.expert, self.dist.world_size, self.dist.rank, self.device,
                                   m.moe.dispatcher_sms if m.moe else None)
        if ep:
            apply_expert_parallel(model, ep)
        return model, ep

    def _master_weights(self, model: GPT, opt: OptimizerConfig) -> MasterWeights | None:
        """bf16 weights with fp32 master copies when the optimizer section asks (default: with bf16 compute)."""
        use_master = opt.master_weights if opt.master_weights is not None else self.bf16
        if not use_master:
            return None
        # fp32 main grads go through per-parameter hooks, which DDP's bucketed gradients do not allow:
        # with DP > 1 the bf16 gradients are all-reduced and cast to fp32 once per step instead.
        master = MasterWeights(model, opt, fp32_main_grads=opt.main_grads == "fp32" and not self.dist.initialized)
        master.to_bf16(model)
        self.compute += " with bf16 weights, fp32 master weights"
        if self.ep and master.fp32_main_grads:  # the hooks would move expert grads away
            raise RuntimeError("expert parallelism reduces expert gradients on the parameters: fp32 main grads "
                               "through hooks cannot be used with it")
        return master

    def _fused_weights(self, model: GPT, opt: OptimizerConfig, moe: MoEConfig | None,
                       expert_wgrad: str | None) -> list:
        """The weights whose gradient GEMMs accumulate (trainer/grad_accum.py) under
        optimizer.grad_accumulation_fusion; grouped_mm experts only with expert_wgrad: te (torch's grouped GEMM
        cannot accumulate)."""
        if not opt.grad_accumulation_fusion:
            return []
        expert_backend = expert_wgrad or ("te" if moe is not None and moe.expert_wgrad == "te" else None)
        dtype = torch.bfloat16 if self.bf16 or self.master else torch.float32  # what the GEMMs compute in
        fused = grad_accum.fused_weights(model, expert_backend, dtype)
        self.compute += f" + gradient-accumulation fusion ({len(fused)} weights)"
        return fused

    def _load_checkpoint(self, recipe: Recipe) -> int:
        """checkpoint.load_from: weights, moments and RNG of a saved step (training goes on from the next one);
        returns that step, 0 without one."""
        if recipe.checkpoint.load_from is None:
            return 0
        step = checkpoint.load(self.state(), recipe, self.dist.world_size)
        self.log(f"continuing from {checkpoint.resolve(recipe.checkpoint.load_from)} after step {step}")
        return step

    def state(self) -> checkpoint.Trained:
        """What a checkpoint saves and loads: the model, its master weights, the optimizer, the device."""
        return checkpoint.Trained(self.model, self.master, self.optimizer, self.device)

    def _outside_ddp(self) -> OutsideDDP | None:
        """With world > 1: the gradients DDP cannot reduce (EP experts over the expert-data-parallel group, fused
        weights over every rank), reduced by trainer.grad_reduce into DDP's average; None on one rank."""
        if not self.dist.initialized:
            return None
        reductions = []
        if self.ep:
            reductions.append(Reduction(self.expert_params, self.ep.expert_dp_group, self.ep.dp))
        dense_fused = [w for w in self.fused_weights if id(w) not in self._expert_ids]
        if dense_fused:  # replicated on every rank: summed over all of them
            reductions.append(Reduction(dense_fused, data_parallel_group(self.dist.world_size), self.dp))
        return OutsideDDP(reductions, self.fused_weights)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor, model: torch.nn.Module | None = None):
        """The model's forward, under TE's quantized autocast when the recipe asks for fp8/mxfp8/nvfp4."""
        model = self.model if model is None else model
        if self.te.quant_recipe is None:
            return model(inputs, targets)
        with self.te.forward_context():
            return model(inputs, targets)

    def describe(self) -> str:
        r, t = self.recipe, self.recipe.training
        ep = f", EP {self.ep.size}" if self.ep else ""
        return (f"device {self.device} | world {self.dist.world_size} (DP {self.dp}{ep}) | params {self.params:,} | "
                f"global batch {self.global_batch} = micro {t.micro_batch_size} × DP {self.dp} × accum {self.accum} "
                f"| seq {t.seq_length} | precision {r.precision} → compute {self.compute} | "
                f"FLOPs/step {self.flops.total:.4e}")

    def train_step(self, step: int) -> dict:
        """One optimizer step over `accum` micro-batches; returns its metrics row (without eval_loss)."""
        t0 = time.perf_counter()
        lr = lr_at(step, self.recipe.training.steps, self.recipe.optimizer)
        set_lr(self.optimizer, lr)
        # [loss sum, aux-loss sum, dropped (token, slot) pairs] over this rank's micro-batches.
        stats = torch.zeros(3, dtype=torch.float64, device=self.device)
        routed = 0
        grad_accum.prepare(self.fused_weights)  # their gradients exist (zeroed) before the first micro-batch
        for micro in range(self.accum):
            inputs, targets = self.data.train_batch(step, micro)
            if self.outside is not None and micro == self.accum - 1:
                self.outside.arm()  # fused weights start their all-reduce inside this backward
            with no_sync(self.model, sync=micro == self.accum - 1), self.autocast():
                out = self.forward(inputs, targets)
                loss = out.loss
                if step in self.inject_nan and micro == 0 and self.dist.rank == 0:
                    loss = loss * float("nan")
                ((loss + out.aux_loss) / self.accum).backward()
            stats += torch.stack([loss.detach().double(), out.aux_loss.detach().double(),
                                  out.tokens_dropped.double()])
            routed += out.tokens_routed * self.dp  # a host int, the same on every rank
        # DDP has all-reduced (averaged) the gradients during the last backward; sum the loss stats too.
        all_reduce_sum(stats, self.dist)
        norm = self._grad_norm()
        # Clipping happens inside fused AdamW, which divides every gradient by grad_scale in its own pass.
        self.optimizer.grad_scale = clip_divisor(norm, self.recipe.optimizer.clip_grad)
        # Skip non-finite steps on the device: fused AdamW leaves params and state untouched when found_inf=1.
        # loss and grad norm are identical on all ranks after the all-reduces, so all ranks agree.
        found_inf = (~torch.isfinite(stats[0]) | ~torch.isfinite(norm)).float()
        self.optimizer.found_inf = found_inf
        self.optimizer.step()
        if self.master:
            self.master.finish_step()  # fp32 master → bf16 weights, clear the step's gradients
        else:
            self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # SYNC: the step time covers all queued GPU work
        step_s = time.perf_counter() - t0

        loss_sum, aux_sum, dropped = stats.tolist()  # SYNC (already synchronized above)
        skipped = bool(found_inf.item())  # SYNC (idem)
        norm_value = float(norm)  # SYNC (idem)
        micro_batches = self.accum * self.dp
        loss_mean = loss_sum / micro_batches
        is_nan = not math.isfinite(loss_mean)
        self.skipped += skipped
        self.nan_steps += is_nan
        self.completed = step
        tokens = self.global_batch * self.recipe.training.seq_length
        moe = self.recipe.model.moe is not None
        return {
            "step": step,
            "loss": loss_mean,
            "grad_norm": norm_value,
            "lr": lr,
            "step_time_ms": step_s * 1e3,
            "tflops_per_gpu": tflops_per_gpu(self.flops.total, step_s, self.dist.world_size),
            "tokens_per_s_per_gpu": tokens / step_s / self.dist.world_size,
            **self.memory(),
            "skipped": skipped,
            "nan": is_nan,
            "aux_loss": aux_sum / micro_batches if moe else None,
            "tokens_dropped_frac": dropped / routed if moe and routed else None,
            "time": time.time(),
        }

    def _grad_norm(self) -> torch.Tensor:
        """Global gradient norm (device tensor); first the gradients outside DDP get DDP's average."""
        if self.outside is not None:
            self.outside.finish()  # before any fp32 cast of them
        pairs = self.master.grads_by_param() if self.master else [(p, p.grad) for p in self.param_list]
        # Single [E, ...] expert weights count as E tensors, as discrete ones do: the same sums, bitwise.
        pairs = per_expert_grads(pairs, self._stacked_experts)
        if self.ep is None:
            return grad_norm([g for _, g in pairs])
        dense = [g for p, g in pairs if id(p) not in self._expert_ids]
        experts = [g for p, g in pairs if id(p) in self._expert_ids]
        return self.ep.global_norm(dense, experts)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over eval_iters micro-batches per rank of the fixed held-out stream (no training RNG used)."""
        model = unwrap(self.model)
        model.eval()
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        iters = self.recipe.training.eval_iters
        for micro in range(iters):
            inputs, targets = self.data.eval_batch(micro)
            with self.autocast():
                total += self.forward(inputs, targets, model).loss.double()
        model.train()
        all_reduce_sum(total, self.dist)
        return total.item() / (iters * self.dp)  # SYNC (evaluation is outside the timed step)

    def memory(self) -> dict:
        """GPU allocator stats in GiB (peaks since the start); on CPU those are 0.0 and rss_gib is the peak RSS."""
        if self.device.type == "cuda":
            c = torch.cuda
            mem = {
                "mem_allocated_gib": c.memory_allocated() / GIB,
                "mem_max_allocated_gib": c.max_memory_allocated() / GIB,
                "mem_reserved_gib": c.memory_reserved() / GIB,
                "mem_max_reserved_gib": c.max_memory_reserved() / GIB,
            }
        else:
            mem = dict.fromkeys(
                ("mem_allocated_gib", "mem_max_allocated_gib", "mem_reserved_gib", "mem_max_reserved_gib"), 0.0
            )
        mem["rss_gib"] = peak_rss_gib()
        return mem

    def run(self, on_row: Callable[[dict], None], out_dir: Path | None = None) -> None:
        """Steps start_step + 1 .. training.steps (a loaded checkpoint's next step, else 1); `out_dir` is the run
        directory (profiles, checkpoint.save_at)."""
        t, save_at = self.recipe.training, self.recipe.checkpoint.save_at
        if save_at is not None and out_dir is None:
            raise ValueError("checkpoint.save_at needs the run directory (Trainer.run's out_dir)")
        profiler = StepProfiler(out_dir, self.dist.rank)
        energy = StepEnergy(self.device)  # NVML energy_j per step on a GPU; nothing on CPU
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # SYNC: start the first step's clock on an idle GPU
        # With checkpoint.reload_with this trainer stops at its save; trainer.train continues in a fresh one.
        last = save_at if self.recipe.checkpoint.reload_with is not None else t.steps
        for step in range(self.start_step + 1, last + 1):
            profiler.before_step(step)
            energy.start()
            row = self.train_step(step)
            row.update(energy.stop())
            profiler.after_step(step)
            if t.eval_interval and step % t.eval_interval == 0:
                row["eval_loss"] = self.evaluate()
            on_row(row)
            if step % t.log_interval == 0 or step == t.steps:
                self.log(format_row(row, t.steps))
            if step == save_at and self.dist.rank == 0:  # outside the timed step; every rank holds the state
                saved = checkpoint.save(self.state(), self.recipe, self.global_batch, out_dir, step)
                self.log(f"checkpoint saved: {saved}")


def format_row(row: dict, steps: int) -> str:
    """`step 5/20 | loss 6.1234 | ...`: the human log line (rank-local stdout)."""
    def num(v, fmt):
        return "nan" if v is None or not math.isfinite(v) else format(v, fmt)

    parts = [
        f"step {row['step']}/{steps}",
        f"loss {num(row['loss'], '.4f')}",
        f"grad_norm {num(row['grad_norm'], '.3f')}",
        f"lr {row['lr']:.3e}",
        f"step {row['step_time_ms']:.1f} ms",
        f"{row['tflops_per_gpu']:.2f} TFLOP/s/GPU",
        f"{row['tokens_per_s_per_gpu']:.0f} tok/s/GPU",
        f"mem {row['mem_max_allocated_gib']:.2f} GiB max alloc, {row['rss_gib']:.2f} GiB RSS",
    ]
    if row.get("aux_loss") is not None:
        parts.append(f"aux {num(row['aux_loss'], '.4f')}")
    if row.get("tokens_dropped_frac") is not None:
        parts.append(f"dropped {100 * row['tokens_dropped_frac']:.2f}%")
    if row["skipped"]:
        parts.append("SKIPPED (non-finite)")
    if "eval_loss" in row:
        parts.append(f"eval_loss {num(row['eval_loss'], '.4f')}")
    return " | ".join(parts)
