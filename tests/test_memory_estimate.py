"""The memory estimate (trainer/memory.py): consistent parts, the right monotonic knobs, the H200 figures it is
calibrated on, and, under torch on the CPU, exactly the model states the real trainer allocates."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trainer.memory import count_params, estimate, estimate_megatron  # noqa: E402
from trainer.recipe import Recipe  # noqa: E402

MOE = {
    "model": {
        "vocab_size": 32000,
        "hidden_size": 1024,
        "num_layers": 4,
        "num_attention_heads": 16,
        "num_query_groups": 4,
        "ffn_hidden_size": 4096,
        "moe": {"num_experts": 16, "top_k": 4, "ffn_hidden_size": 512},
    },
    "training": {"seq_length": 2048, "micro_batch_size": 2, "global_batch_size": 8},
    "precision": "bf16",
    "device": "cuda",
}
DENSE = {**MOE, "model": {k: v for k, v in MOE["model"].items() if k != "moe"}}


def recipe(base: dict = MOE, **overrides: object) -> Recipe:
    """`base` with dotted-key overrides (e.g. **{"training.seq_length": 4096})."""
    data = copy.deepcopy(base)
    for key, value in overrides.items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return Recipe.model_validate(data)


def peak(base: dict = MOE, world_size: int = 1, **overrides: object) -> int:
    return estimate(recipe(base, **overrides), world_size).peak_bytes


def acts(base: dict = MOE, **overrides: object) -> int:
    return estimate(recipe(base, **overrides)).sizes["activations per micro-batch"]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"cross_entropy": "fused"},
        {"recompute": "full"},
        {"optimizer.main_grads": "bf16"},
        {"optimizer.master_weights": False},
        {"training.global_batch_size": 2},
        {"device": "cpu"},
        {
            "model.moe.capacity_factor": 1.25,
            "model.moe.pad_to_capacity": True,
            "model.moe.dispatch_chunk_tokens": 1024,
        },
    ],
)
def test_parts_add_up_to_the_peak(overrides):
    est = estimate(recipe(**overrides))
    assert sum(est.parts.values()) == est.peak_bytes
    assert est.peak_bytes == max(est.phases.values()) == est.phases[est.peak_at]
    assert all(size > 0 for size in est.parts.values())
    lines = est.lines()
    assert lines[0].startswith(f"peak {est.peak_bytes / (1 << 30):.1f} GiB")
    assert any("optimizer state" in line for line in lines)


@pytest.mark.parametrize("base", [MOE, DENSE])
def test_monotonic_in_micro_batch_seq_length_and_layers(base):
    assert (
        peak(base, **{"training.micro_batch_size": 1, "training.global_batch_size": 8})
        < peak(base)
        < peak(base, **{"training.micro_batch_size": 4, "training.global_batch_size": 8})
    )
    assert (
        peak(base, **{"training.seq_length": 1024}) < peak(base) < peak(base, **{"training.seq_length": 4096})
    )
    assert peak(base, **{"model.num_layers": 2}) < peak(base) < peak(base, **{"model.num_layers": 8})
    assert acts(base, **{"training.seq_length": 1024}) < acts(base) < acts(base, **{"model.num_layers": 8})


@pytest.mark.parametrize("base", [MOE, DENSE])
def test_recompute_full_keeps_less_than_selective_less_than_none(base):
    assert acts(base, recompute="full") < acts(base, recompute="selective") < acts(base, recompute="none")
    if base is MOE:  # each MoE module on its own keeps less than none
        for module in ("core_attn", "moe_act", "moe_dispatch"):
            assert acts(recompute="selective", recompute_modules=[module]) < acts()


def test_bf16_main_grads_below_fp32():
    fp32, bf16 = estimate(recipe()), estimate(recipe(**{"optimizer.main_grads": "bf16"}))
    assert bf16.peak_bytes < fp32.peak_bytes
    assert bf16.sizes["gradient bytes"] * 2 == fp32.sizes["gradient bytes"]


def test_master_weights_add_four_bytes_per_parameter():
    on = estimate(recipe(**{"optimizer.master_weights": True}))
    off = estimate(recipe(**{"optimizer.master_weights": False}))
    p = on.sizes["parameters"]
    assert on.sizes["optimizer bytes"] - off.sizes["optimizer bytes"] == 4 * p
    assert off.sizes["parameter bytes"] - on.sizes["parameter bytes"] == 2 * p  # fp32 vs bf16 model weights
    assert on.parts.get("master weights (fp32)", 4 * p) == 4 * p
    assert "master weights (fp32)" not in off.parts


def test_expert_parallel_divides_the_experts_only():
    one, four = count_params(recipe()), count_params(recipe(**{"parallel.expert": 4}))
    assert sum(four.experts) * 4 == sum(one.experts)
    assert four.total == one.total - sum(one.experts) + sum(one.experts) // 4
    est1 = estimate(recipe(**{"training.global_batch_size": 8}), 4)
    est4 = estimate(recipe(**{"parallel.expert": 4, "training.global_batch_size": 8}), 4)
    # DDP keeps bf16 gradients: the precision-aware AdamW (one step counter, not one per tensor)
    assert est1.sizes["optimizer bytes"] - est4.sizes["optimizer bytes"] == 12 * (one.total - four.total)
    assert est4.peak_bytes < est1.peak_bytes
    # Data parallelism replicates (no distributed optimizer in the bundled trainer): the optimizer stays whole.
    dp4, dp1 = estimate(recipe(), 4).sizes, estimate(recipe(), 1).sizes  # step counters aside (see above)
    assert dp4["optimizer bytes"] - 4 == dp1["optimizer bytes"] - 4 * dp1["parameter tensors"]


@pytest.mark.parametrize("key", ["parallel.tensor", "parallel.pipeline", "parallel.context"])
def test_layouts_the_trainer_refuses_are_not_estimated(key):
    with pytest.raises(ValueError, match=key):
        estimate(recipe(**{key: 2}), 2)


def _benchmark():
    spec = importlib.util.spec_from_file_location(
        "memory_estimate_bench", ROOT / "benchmarks/memory_estimate.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_h200_figures_within_ten_percent():
    bench = _benchmark()
    results = bench.rows()
    measured = [r for r in results if r["measured_gib"] is not None]
    assert len(measured) >= 40
    outside = [
        (r["source"], r["proxy"], r["label"], round(100 * r["error"], 1))
        for r in measured
        if abs(r["error"]) > bench.TOLERANCE
    ]
    assert not outside
    assert all(r["verdict"] == "OOM predicted" for r in results if r["measured_gib"] is None)
    gpu = int(bench.H200_GIB * (1 << 30))
    for case in bench.CASES:  # every point that ran keeps headroom once the allocator's slack is allowed for
        if case.measured is not None:
            assert estimate(bench.case_recipe(case)).headroom(gpu) > 0, case


MEGATRON = {
    "num-layers": 32,
    "hidden-size": 4096,
    "ffn-hidden-size": 14336,
    "num-attention-heads": 32,
    "group-query-attention": True,
    "num-query-groups": 8,
    "seq-length": 4096,
    "micro-batch-size": 1,
    "vocab-size": 128256,
    "swiglu": True,
    "bf16": True,
    "world-size": 64,
    "tensor-model-parallel-size": 2,
    "pipeline-model-parallel-size": 2,
}


def mega(**overrides: object) -> int:
    return estimate_megatron({**MEGATRON, **overrides}).peak_bytes


def test_megatron_estimate_is_consistent():
    est = estimate_megatron(MEGATRON)
    assert sum(est.parts.values()) == est.peak_bytes
    assert mega(**{"micro-batch-size": 2}) > mega() and mega(**{"seq-length": 8192}) > mega()
    assert mega(**{"num-layers": 64}) > mega()
    assert (
        mega(**{"tensor-model-parallel-size": 4}) < mega()
        and mega(**{"pipeline-model-parallel-size": 4}) < mega()
    )
    assert mega(**{"context-parallel-size": 2}) < mega()
    assert mega(**{"use-distributed-optimizer": True}) < mega()
    # 18 bytes/param, or 6 + 12/d with the distributed optimizer (d = DP = 16 here)
    states = estimate_megatron(MEGATRON).parts
    p = states["parameters"] // 2
    assert states["optimizer state (master, Adam m, v)"] == pytest.approx(12 * p, rel=1e-6)
    dist = estimate_megatron({**MEGATRON, "use-distributed-optimizer": True}).parts
    assert dist["optimizer state (master, Adam m, v)"] == pytest.approx(12 * p / 16, rel=1e-6)
    unfused = {"attention-backend": "unfused"}
    assert (
        mega(**unfused, **{"recompute-granularity": "full"})
        < mega(**unfused, **{"recompute-granularity": "selective"})
        < mega(**unfused)
    )
    assert mega(
        **{"recompute-granularity": "full", "recompute-method": "block", "recompute-num-layers": 4}
    ) > mega(**{"recompute-granularity": "full"})
    assert mega(**{"fp8-format": "hybrid"}) > mega()


def test_megatron_experts_shard_over_ep():
    moe = {**MEGATRON, "num-experts": 64, "moe-router-topk": 8, "moe-ffn-hidden-size": 1536}
    base = estimate_megatron(moe)
    ep8 = estimate_megatron({**moe, "expert-model-parallel-size": 8})
    assert ep8.parts["parameters"] < base.parts["parameters"]
    assert base.parts["MoE dispatch buffers"] > 0 and base.peak_bytes > estimate_megatron(MEGATRON).peak_bytes
    assert mega(**{"expert-tensor-parallel-size": 1, "num-experts": 64}) > mega(**{"num-experts": 64})


TINY = {
    "model": {
        "vocab_size": 200,
        "hidden_size": 32,
        "num_layers": 3,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "ffn_hidden_size": 64,
        "moe": {
            "num_experts": 4,
            "top_k": 2,
            "ffn_hidden_size": 32,
            "layer_freq": 2,
            "num_shared_experts": 1,
        },
    },
    "training": {"seq_length": 16, "micro_batch_size": 2, "global_batch_size": 4, "steps": 1, "seed": 7},
    "device": "cpu",
}


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"optimizer.master_weights": True},
        {"optimizer.master_weights": True, "optimizer.main_grads": "bf16"},
        {"optimizer.master_weights": True, "optimizer.moments": "bf16"},
        {"optimizer.moments": "bf16"},
        {"model.moe.expert_weights": "discrete"},
        {"model.activation": "squared_relu"},
    ],
)
def test_model_states_equal_what_the_cpu_trainer_allocates(overrides):
    torch = pytest.importorskip("torch")
    from trainer.distributed import Dist
    from trainer.loop import Trainer

    rec = recipe(TINY, **overrides)
    trainer = Trainer(
        rec, Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu")), log=lambda _: None
    )
    trainer.train_step(1)  # Adam's state exists after the first step
    inputs, targets = trainer.data.train_batch(2, 0)
    out = trainer.forward(inputs, targets)
    (out.loss + out.aux_loss).backward()  # the gradients as the optimizer step sees them

    def nbytes(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    params = list(trainer.model.parameters())
    master = trainer.master
    grads = [m.grad for m in master.master] if master and master.fp32_main_grads else [p.grad for p in params]
    opt = trainer.optimizer
    if hasattr(opt, "state_bytes"):  # trainer/adamw_pa.py: the moments and one step counter
        optimizer = opt.state_bytes() + nbytes([opt.step_count])
    else:  # fused AdamW: m, v and a step per tensor
        optimizer = nbytes(t for state in opt.state.values() for t in state.values() if isinstance(t, torch.Tensor))
    optimizer += nbytes(master.master) if master else 0
    sizes = estimate(rec).sizes
    assert sizes["parameters"] == sum(p.numel() for p in params) == trainer.params
    assert sizes["parameter tensors"] == len(params)
    assert sizes["parameter bytes"] == nbytes(params)
    assert sizes["gradient bytes"] == nbytes(grads)
    assert sizes["optimizer bytes"] == optimizer


@pytest.mark.parametrize(
    ("world_size", "overrides"),
    [
        (4, {"parallel.expert": 4}),
        (2, {}),
        (4, {"parallel.expert": 2, "optimizer.main_grads": "bf16"}),
    ],
)
def test_data_and_expert_parallel_parts_add_up(world_size, overrides):
    est = estimate(recipe(**{"training.global_batch_size": 2 * world_size, **overrides}), world_size)
    assert sum(est.parts.values()) == est.peak_bytes == max(est.phases.values())
    assert est.parts["gradients"] > 0  # DDP's buckets stay allocated between steps


def test_small_vocabulary_peaks_in_a_layer_backward():
    est = estimate(recipe(**{"model.vocab_size": 256, "recompute": "full", "training.global_batch_size": 2}))
    assert est.peak_at.startswith("backward of layer")
    assert est.parts["recomputed layer"] > 0 and est.parts["backward buffers"] > 0
    assert sum(est.parts.values()) == est.peak_bytes


def test_point_record_says_whether_a_point_fits():
    from trainer.memory import point_record

    small = point_record(recipe(), 1, gpu_bytes=140 << 30)
    assert small["fits"] and small["est_headroom_gib"] > 0 and small["est_peak_alloc_gib"] > 0
    big = point_record(
        recipe(**{"training.micro_batch_size": 64, "training.global_batch_size": 64}), 1, 80 << 30
    )
    assert not big["fits"] and big["est_headroom_gib"] < 0
    assert "fits" not in point_record(recipe(), 1)
