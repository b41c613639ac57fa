"""Peers of the bundled trainer on the MoE proxy's exact shapes, timed the way the trainer is timed (issue 15).

    python benchmarks/peers.py --out /tmp/peers --peer hf-compiled --peer mcore-te --steps 12
    python benchmarks/peers.py --list          # each peer's exact configuration (no GPU, no peer library)

Every peer trains the model of `benchmarks/recipes/moe_proxy.yaml` (Qwen3-30B-A3B layer shapes, 8 layers,
vocab 151936, seq 4096) with micro-batch 2 × 8 accumulation of random tokens, bf16. Each step's time is
taken after `torch.cuda.synchronize()`; the figure is the last-10-step window (the first step never
counts), TFLOP/s from the trainer's Megatron-LM accounting of the same shapes (`trainer.flops.step_flops`,
3.5325e14 per step), so every peer is counted with one formula. Peak = torch.cuda.max_memory_allocated.

Peers:
- `hf-eager`, `hf-compiled`: Hugging Face transformers `Qwen3MoeForCausalLM` (`hf_config_kwargs`), SDPA
  attention, `_experts_implementation = "grouped_mm"`, bf16 weights, fused `torch.optim.AdamW` on them (no
  fp32 master copy), grad clip 1.0, router aux loss 0.001, natural routing (the router is not forced);
  `-compiled`: each decoder layer `.compile()`d.
- `mcore-te`, `mcore-te-cutlass`, `mcore-te-allgather`: megatron-core GPTModel with the Transformer Engine
  layer spec (`mcore_config_kwargs`): QK-norm, TEGroupedMLP experts, alltoall dispatcher (allgather for
  the third), force-balanced aux-loss router in fp32, permute fusion, TE cross entropy, RoPE fusion, bf16
  params, DDP with bf16 gradient buffers + distributed optimizer (fp32 main params), clip 1.0;
  `-cutlass` sets NVTE_USE_CUTLASS_GROUPED_GEMM=1 (TE's CUTLASS grouped GEMM on Hopper).
- `mcore-te-ep2`, `mcore-te-ep2-a2a-overlap` (issue 24): the same megatron-core model with expert parallelism
  2 on 2 GPUs of one node (torchrun, one process per GPU, NVLink multicast off): 64 experts per GPU, alltoall
  dispatcher with permute fusion, TEGroupedMLP with the CUTLASS grouped GEMM, 16 sequences per GPU per step
  (micro-batch 2 × 8 on each of the 2 data-parallel ranks: global batch 32), DDP with the gradient all-reduce
  overlapped with the backward (`overlap_grad_reduce`, finalize_model_grads) and the distributed optimizer.
  `-a2a-overlap` adds megatron-core's batch-level EP all-to-all overlap (`overlap_moe_expert_parallel_comm`
  with `delay_wgrad_compute`: one micro-batch's all-to-alls hidden behind another's compute), the EP
  communication overlap that applies on one node (no DeepEP/HybridEP: not installed; no shared experts to
  overlap). TFLOP/s per GPU from the trainer's accounting of the same global batch on 2 GPUs.
Each peer runs in its own process (torchrun for the EP peers); a peer that cannot run records its error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MOE_PROXY = ROOT / "benchmarks/recipes/moe_proxy.yaml"
PEERS = ("hf-eager", "hf-compiled", "mcore-te", "mcore-te-cutlass", "mcore-te-allgather", "mcore-te-ep2",
         "mcore-te-ep2-a2a-overlap")
# Expert-parallel peers: EP size (= GPUs: EP = DP, one node) and whether megatron-core's batch-level EP overlap is on.
EP_PEERS = {"mcore-te-ep2": (2, False), "mcore-te-ep2-a2a-overlap": (2, True)}
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
WINDOW = 10


def load_proxy(path: Path = MOE_PROXY, gpus: int = 1):
    """The MoE proxy recipe; on `gpus` GPUs the global batch grows with them (16 sequences per GPU per step)."""
    from trainer.cli import load_recipe

    recipe = load_recipe(str(path), [])
    if gpus > 1:
        recipe = recipe.model_copy(update={"training": recipe.training.model_copy(
            update={"global_batch_size": recipe.training.global_batch_size * gpus})})
    return recipe


def hf_config_kwargs(recipe) -> dict:
    """Qwen3MoeConfig keyword arguments for the recipe's model (transformers 5 names)."""
    m, moe = recipe.model, recipe.model.moe
    return {
        "vocab_size": m.vocab_size,
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.kv_heads,
        "head_dim": m.kv_channels,
        "moe_intermediate_size": moe.ffn_hidden_size,
        "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "output_router_logits": True,
        "router_aux_loss_coef": moe.router.aux_loss_coeff,
        "rms_norm_eps": m.norm_eps,
        "rope_theta": m.rope_theta,
        "max_position_embeddings": recipe.training.seq_length,
        "tie_word_embeddings": False,
        "use_cache": False,
    }


def mcore_config_kwargs(recipe, dispatcher: str = "alltoall", ep: int = 1, a2a_overlap: bool = False) -> dict:
    """megatron.core TransformerConfig keyword arguments (torch-free: the caller adds dtypes/activation)."""
    m, moe = recipe.model, recipe.model.moe
    extra = {}
    if ep > 1:
        extra["expert_model_parallel_size"] = ep
    if a2a_overlap:  # batch-level EP all-to-all overlap (megatron-core ≥ 0.14)
        extra.update(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)
    return {**extra,
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.kv_heads,
        "kv_channels": m.kv_channels,
        "ffn_hidden_size": m.ffn_hidden_size,
        "normalization": "RMSNorm",
        "layernorm_epsilon": m.norm_eps,
        "qk_layernorm": True,
        "gated_linear_unit": True,
        "add_bias_linear": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "init_method_std": m.init_std,
        "num_moe_experts": moe.num_experts,
        "moe_router_topk": moe.top_k,
        "moe_ffn_hidden_size": moe.ffn_hidden_size,
        "moe_router_load_balancing_type": "aux_loss",
        "moe_aux_loss_coeff": moe.router.aux_loss_coeff,
        "moe_router_force_load_balancing": moe.router.force_balance,
        "moe_router_dtype": "fp32",
        "moe_token_dispatcher_type": dispatcher,
        "moe_grouped_gemm": True,
        "moe_permute_fusion": True,
        "apply_rope_fusion": True,
        "cross_entropy_loss_fusion": True,
        "cross_entropy_fusion_impl": "te",
        "bf16": True,
        "gradient_accumulation_fusion": False,  # needs APEX's fused_weight_gradient_mlp_cuda (absent)
    }


def mcore_ddp_kwargs(ep: int = 1) -> dict:
    """megatron.core DistributedDataParallelConfig keyword arguments: with EP the data-parallel gradient
    all-reduce overlaps the backward (overlap_grad_reduce), as Megatron's MoE recipes run it."""
    return {"grad_reduce_in_fp32": False, "overlap_grad_reduce": ep > 1, "use_distributed_optimizer": True}


def describe() -> dict:
    recipe = load_proxy()
    return {
        "hf": {
            "config": hf_config_kwargs(recipe),
            "attn": "sdpa",
            "experts": "grouped_mm",
            "optimizer": "torch.optim.AdamW(fused=True) on bf16 params",
            "clip_grad": 1.0,
        },
        "mcore": {
            "config": mcore_config_kwargs(recipe),
            "spec": "get_gpt_layer_with_transformer_engine_spec("
            "num_experts, moe_grouped_gemm=True, qk_layernorm=True)",
            "ddp": mcore_ddp_kwargs(),
            "optimizer": "adam, lr 1e-4, bf16, distributed, clip 1.0",
        },
        **{peer: _ep_peer(recipe, peer) for peer in EP_PEERS},
        "micro_batch": recipe.training.micro_batch_size,
        "accumulation": recipe.training.global_batch_size // recipe.training.micro_batch_size,
        "seq_length": recipe.training.seq_length,
    }


def _ep_peer(recipe, peer: str) -> dict:
    """What an expert-parallel megatron-core peer runs: its config, DDP, layout and batch."""
    ep, overlap = EP_PEERS[peer]
    scaled = load_proxy(gpus=ep)
    t = scaled.training
    return {
        "launch": f"torchrun --standalone --nproc-per-node {ep} (one process per GPU, NCCL, NVLink multicast off)",
        "config": mcore_config_kwargs(recipe, "alltoall", ep=ep, a2a_overlap=overlap),
        "env": {"NVTE_USE_CUTLASS_GROUPED_GEMM": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1", **NO_MULTICAST},
        "ddp": mcore_ddp_kwargs(ep),
        "layout": {"gpus": ep, "expert_parallel": ep, "data_parallel": ep, "experts_per_gpu":
                   recipe.model.moe.num_experts // ep},
        "micro_batch": t.micro_batch_size,
        "accumulation_per_rank": t.global_batch_size // (t.micro_batch_size * ep),
        "global_batch": t.global_batch_size,
        "sequences_per_gpu_per_step": t.global_batch_size // ep,
    }


def window_summary(times_ms: list[float], flops: float, peak_gib: float, losses: list[float]) -> dict:
    win = times_ms[1:][-WINDOW:]  # never the first step
    mean = sum(win) / len(win)
    std = (sum((t - mean) ** 2 for t in win) / (len(win) - 1)) ** 0.5 if len(win) > 1 else 0.0
    return {
        "tflops_per_gpu": round(flops / (mean / 1e3) / 1e12, 1),
        "step_time_ms": round(mean, 1),
        "step_time_ms_std": round(std, 1),
        "window_steps": len(win),
        "peak_alloc_gib": round(peak_gib, 2),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
    }


def run_hf(recipe, steps: int, compiled: bool) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    kwargs = hf_config_kwargs(recipe)
    cfg = Qwen3MoeConfig(**kwargs)
    cfg._attn_implementation = "sdpa"
    cfg._experts_implementation = "grouped_mm"
    torch.manual_seed(recipe.training.seed)
    with torch.device("cuda"):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        except TypeError:
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.train()
    if compiled:
        for layer in model.model.layers:
            layer.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.optimizer.lr, fused=True)
    t = recipe.training
    accum = t.global_batch_size // t.micro_batch_size
    gen = torch.Generator(device="cuda").manual_seed(t.seed)
    batches = [
        torch.randint(
            0, kwargs["vocab_size"], (t.micro_batch_size, t.seq_length), device="cuda", generator=gen
        )
        for _ in range(accum)
    ]
    times, losses = [], []
    torch.cuda.synchronize()
    for _ in range(steps):
        t0 = time.perf_counter()
        total = torch.zeros((), device="cuda")
        for tokens in batches:
            out = model(input_ids=tokens, labels=tokens)
            (out.loss / accum).backward()
            total += out.loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(round(float(total) / accum, 4))
    return {
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "times_ms": times,
        "peak": torch.cuda.max_memory_allocated() / 2**30,
        "losses": losses,
    }


def run_mcore(recipe, steps: int, dispatcher: str, ep: int = 1, a2a_overlap: bool = False) -> dict:
    import torch
    import torch.nn.functional as F

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.distributed.init_process_group("nccl", rank=rank, world_size=world)
    import megatron.core
    import transformer_engine
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=ep)
    t, m = recipe.training, recipe.model
    model_parallel_cuda_manual_seed(t.seed)
    cfg = TransformerConfig(
        **mcore_config_kwargs(recipe, dispatcher, ep=ep, a2a_overlap=a2a_overlap),
        activation_func=F.silu,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
    )
    spec = get_gpt_layer_with_transformer_engine_spec(
        num_experts=m.moe.num_experts, moe_grouped_gemm=True, qk_layernorm=True
    )
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=spec,
        vocab_size=m.vocab_size,
        max_sequence_length=t.seq_length,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        rotary_base=int(m.rope_theta),
    ).cuda()
    ddp_cfg = DistributedDataParallelConfig(**mcore_ddp_kwargs(ep))
    model = DistributedDataParallel(config=cfg, ddp_config=ddp_cfg, module=model)
    if world > 1:  # gradients synced as Megatron's training loop wires it: no sync but on the last micro-batch
        from megatron.core.distributed import finalize_model_grads

        cfg.no_sync_func = model.no_sync
        cfg.finalize_model_grads_func = finalize_model_grads
    opt = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=recipe.optimizer.lr,
            bf16=True,
            params_dtype=torch.bfloat16,
            use_distributed_optimizer=True,
            clip_grad=1.0,
        ),
        [model],
    )
    accum = t.global_batch_size // (t.micro_batch_size * world)
    gen = torch.Generator(device="cuda").manual_seed(t.seed + rank)
    batches = [
        torch.randint(0, m.vocab_size, (t.micro_batch_size, t.seq_length), device="cuda", generator=gen)
        for _ in range(accum)
    ]
    position_ids = torch.arange(t.seq_length, device="cuda").unsqueeze(0).expand(t.micro_batch_size, -1)

    def forward_step(data_iterator, model):
        tokens = next(data_iterator)
        output = model(tokens, position_ids, None, labels=tokens)

        def loss_func(output_tensor):
            loss = output_tensor.float().mean()
            return loss, {"lm loss": loss.detach()}

        return output, loss_func

    fb = get_forward_backward_func()
    times, losses = [], []
    torch.cuda.synchronize()
    for _ in range(steps):
        t0 = time.perf_counter()
        model.zero_grad_buffer()
        opt.zero_grad()
        out = fb(
            forward_step_func=forward_step,
            data_iterator=iter(batches),
            model=[model],
            num_microbatches=accum,
            seq_length=t.seq_length,
            micro_batch_size=t.micro_batch_size,
            decoder_seq_length=t.seq_length,
            forward_only=False,
        )
        opt.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(round(sum(float(o["lm loss"]) for o in out) / len(out), 4))
    return {
        "versions": {
            "megatron.core": megatron.core.__version__,
            "transformer_engine": transformer_engine.__version__,
            "torch": torch.__version__,
        },
        "times_ms": times,
        "peak": torch.cuda.max_memory_allocated() / 2**30,
        "losses": losses,
    }


def child(peer: str, steps: int) -> dict:
    from trainer.flops import step_flops

    ep, overlap = EP_PEERS.get(peer, (1, False))
    recipe = load_proxy(gpus=ep)
    flops = step_flops(recipe, ep).total / ep  # per GPU: window_summary divides by the step time only
    if peer.startswith("hf-"):
        raw = run_hf(recipe, steps, compiled=peer == "hf-compiled")
    else:
        raw = run_mcore(recipe, steps, "allgather" if peer.endswith("allgather") else "alltoall", ep, overlap)
    return {
        "peer": peer,
        "state": "completed",
        "flops_per_step": flops,
        "versions": raw["versions"],
        **window_summary(raw["times_ms"], flops, raw["peak"], raw["losses"]),
        "times_ms": [round(x, 1) for x in raw["times_ms"]],
    }


def peer_env(peer: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if peer == "mcore-te-cutlass" or peer in EP_PEERS:
        env["NVTE_USE_CUTLASS_GROUPED_GEMM"] = "1"
    if peer in EP_PEERS:
        env.update(NO_MULTICAST)
    return env


def peer_argv(peer: str, steps: int) -> list[str]:
    """The child's command: one process, or torchrun with one process per GPU for the EP peers."""
    if peer in EP_PEERS:
        gpus = EP_PEERS[peer][0]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus),
                __file__, "_child", peer, str(steps)]
    return [sys.executable, __file__, "_child", peer, str(steps)]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        peer, steps = sys.argv[2], int(sys.argv[3])
        try:
            row = child(peer, steps)
        except Exception as err:  # noqa: BLE001 (a peer that cannot run: record why)
            traceback.print_exc()
            row = {"peer": peer, "state": "failed", "error": f"{type(err).__name__}: {err}"[:1500]}
        if int(os.environ.get("RANK", 0)) == 0:  # torchrun: rank 0 speaks for the peer
            print("PEER_RESULT " + json.dumps(row), flush=True)
        os._exit(0)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--peer", action="append", choices=PEERS)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        print(json.dumps(describe(), indent=1))
        return
    if not args.out:
        parser.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for peer in args.peer or ["hf-compiled", "mcore-te"]:
        started = time.time()
        proc = subprocess.run(
            peer_argv(peer, args.steps),
            env=peer_env(peer),
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        (args.out / f"{peer}.log").write_text(
            proc.stdout[-200000:] + "\n--- stderr ---\n" + proc.stderr[-200000:]
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEER_RESULT ")]
        row = (
            json.loads(lines[-1][len("PEER_RESULT ") :])
            if lines
            else {"peer": peer, "state": "failed", "error": f"rc {proc.returncode}: {proc.stderr[-1500:]}"}
        )
        row["wall_s"] = round(time.time() - started, 1)
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "times_ms"}), flush=True)
    (args.out / "peers.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
