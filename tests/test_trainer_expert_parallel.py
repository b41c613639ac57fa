"""Expert parallelism on the CPU (gloo, 2 and 4 real ranks): EP = N trains exactly like EP = 1.

Same world, same global batch, same seed: only the experts' placement changes, so losses, gradient norms
and dropped-token fractions must agree (to fp32 summation-order noise: the expert GEMMs see the rows of
all EP peers at once, and the gradient sums run in another order than DDP's).

Two ways, both in the same spawned gloo ranks (one world of 2 and one of 4 for the whole file, so one
interpreter and one torch import per rank; `torchrun -m trainer` itself on 2 ranks is test_trainer_run's): whole
runs through the trainer's entry point (`trainer.__main__.run`, what `python -m trainer` calls), one layout
after another, metrics rows compared; then the real Trainer built for each knob combination, every gradient
after one step's micro-batches compared, the experts' shards gathered over the EP group, with how the gradients
outside DDP were reduced (collectives issued, started inside the backward) and how many count all-to-alls the
dropless chunks cost.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from trainer_helpers import recipe_dict, train_on_ranks

from trainer.recipe import Recipe, launch_problems
from trainer.support import unsupported

REL = 2e-5  # fp32 reassociation across 6 steps of a tiny model


Case = tuple[str, dict, bool, int]  # name, recipe overrides, fuse the experts' weight gradients, EP size


def _in_one_world(folder: Path, world: int, runs: dict[str, tuple[dict, dict[str, str]]],
                  cases: list[Case]) -> tuple[dict[str, list[dict]], dict]:
    """On `world` spawned gloo ranks: train every (recipe overrides, extra env) of `runs`, then take the gradients
    of every case of `cases`. (metrics rows by run name, `_step_gradients` results by (case, EP))."""
    out = folder / "gradients.pt"
    recipes = {name: (recipe_dict(**overrides), env) for name, (overrides, env) in runs.items()}
    rows = train_on_ranks(folder, world, recipes, after=functools.partial(_gradients_worker, cases=cases,
                                                                          out=str(out)))  # fmt: skip
    return rows, torch.load(out)


def _assert_same_training(ep_rows: list[dict], base_rows: list[dict]) -> None:
    assert len(ep_rows) == len(base_rows)
    for ep, base in zip(ep_rows, base_rows, strict=True):
        assert ep["skipped"] == base["skipped"]
        if base["skipped"]:  # a non-finite step: skipped on every rank of both layouts
            assert all(v is None or not math.isfinite(v) for v in (ep["loss"], base["loss"]))  # JSON null = NaN
            continue
        assert ep["loss"] == pytest.approx(base["loss"], rel=REL), (ep["step"], ep["loss"], base["loss"])
        assert ep["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-4)
        assert ("eval_loss" in ep) == ("eval_loss" in base)
        if "eval_loss" in base:
            assert ep["eval_loss"] == pytest.approx(base["eval_loss"], rel=REL)
        assert ep["aux_loss"] == pytest.approx(base["aux_loss"], rel=REL)
        assert ep["tokens_dropped_frac"] == base["tokens_dropped_frac"]
    # the model learns: a wrong exchange (rows to the wrong expert, gradients not brought back) would not
    assert ep_rows[-1]["loss"] < ep_rows[0]["loss"]


EP2 = {"parallel.expert": 2}
# Data-dependent split sizes (counts all-to-all, host splits, regroup by local expert), with 4 micro-batches of
# accumulation, evaluation every 2 steps and a NaN injected on rank 0 at step 3 (skipped by every rank).
DROPLESS = {"training.micro_batch_size": 1, "training.global_batch_size": 8, "training.eval_interval": 2}
NAN = {"MBX_TRAINER_INJECT_NAN_STEP": "3"}
# pad_to_capacity (equal splits, no host sync), chunked dispatch, one parameter per expert.
STATIC = {"model.moe.capacity_factor": 1.0, "model.moe.pad_to_capacity": True, "model.moe.dispatch_chunk_tokens": 8,
          "model.moe.expert_weights": "discrete"}  # fmt: skip
# World 4: EP 2 (two expert-data-parallel replicas of each expert) and EP 4 (one), compact dropping.
LAYOUTS = {"model.moe.capacity_factor": 1.25, "model.moe.drop_policy": "position", "training.micro_batch_size": 1,
           "training.global_batch_size": 4, "training.steps": 4}  # fmt: skip


@pytest.fixture(scope="module")
def world2(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list[dict]], dict]:
    """Two ranks: the whole runs of the dropless and static tests, and every CASES combination's gradients."""
    cases = [(name, overrides, fuse, ep) for name, (overrides, fuse) in CASES.items() for ep in (1, 2)]
    return _in_one_world(tmp_path_factory.mktemp("ep-world2"), 2, {
        "dropless-ep1": (DROPLESS, NAN), "dropless-ep2": ({**DROPLESS, **EP2}, NAN),
        "static-ep1": (STATIC, {}), "static-ep2": ({**STATIC, **EP2}, {}),
    }, cases)  # fmt: skip


@pytest.fixture(scope="module")
def world4(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list[dict]], dict]:
    """Four ranks: the DP × EP layouts' whole runs, and the fused experts' gradients at EP 1 and EP 2 × EDP 2."""
    fused = {**FUSION, **CHUNK, "training.global_batch_size": 16}
    return _in_one_world(tmp_path_factory.mktemp("ep-world4"), 4,
                         {f"ep{ep}": ({**LAYOUTS, "parallel.expert": ep}, {}) for ep in (1, 2, 4)},
                         [("fused", fused, True, 1), ("fused", fused, True, 2)])  # fmt: skip


def test_ep2_dropless_equals_ep1(world2):
    runs, _ = world2
    ep = runs["dropless-ep2"]
    _assert_same_training(ep, runs["dropless-ep1"])
    assert [row["skipped"] for row in ep] == [False, False, True, False, False, False]
    assert sum("eval_loss" in row for row in ep) == 3


def test_ep2_static_capacity_chunked_discrete_equals_ep1(world2):
    runs, _ = world2
    base = runs["static-ep1"]
    _assert_same_training(runs["static-ep2"], base)
    assert any(row["tokens_dropped_frac"] > 0 for row in base)  # capacity 1.0 really drops here


def test_dp_times_ep_layouts_on_four_ranks(world4):
    runs, _ = world4
    for ep_size in (2, 4):
        _assert_same_training(runs[f"ep{ep_size}"], runs["ep1"])


def test_expert_parallel_pre_submit_checks():
    recipe = Recipe.model_validate(recipe_dict(**{"parallel.expert": 4, "training.micro_batch_size": 1}))
    assert launch_problems(recipe, world_size=4) == []
    assert any(p.startswith("parallel.expert: EP (4) must divide DP·CP (2)") for p in launch_problems(recipe, 2))
    remake = Recipe.model_validate(recipe_dict(**{"parallel.expert": 2, "recompute": "selective",
                                                  "recompute_modules": ["moe_dispatch"]}))
    assert any(p.startswith("recompute_modules: moe_dispatch") for p in launch_problems(remake, 2))


BEST_SINGLE_GPU = {  # the settings of the fastest single-GPU MoE proxy (BENCHMARKS.md, issue 15), on a GPU
    "device": "cuda", "compile": True, "cross_entropy": "te", "optimizer.moments": "bf16",
    "optimizer.main_grads": "bf16", "optimizer.grad_accumulation_fusion": True, "model.moe.expert_wgrad": "te",
}


@pytest.mark.parametrize("capacity", [{}, {"model.moe.capacity_factor": 1.0, "model.moe.pad_to_capacity": True}])
def test_ep_layouts_take_the_best_single_gpu_settings(capacity):
    """Issue 24: gradient-accumulation fusion used to refuse every world > 1, and TE GroupedLinear experts every
    EP > 1; now EP = 2 on 2 GPUs and EP 8 × DP 2 on 16 take them, with chunked dispatch and a green dispatcher."""
    knobs = {**BEST_SINGLE_GPU, **capacity, "model.moe.dispatch_chunk_tokens": 8, "model.moe.dispatcher_sms": 16}
    for ep, world in ((2, 2), (8, 16)):
        recipe = Recipe.model_validate(recipe_dict(**knobs, **{"parallel.expert": ep, "model.moe.num_experts": 8,
                                                              "training.micro_batch_size": 1,
                                                              "training.global_batch_size": 2 * world}))
        assert unsupported(recipe, world_size=world, device_type="cuda", arch=90) == []
        assert launch_problems(recipe, world_size=world, gpu_arch="sm_90") == []
    te_experts = Recipe.model_validate(recipe_dict(**{"parallel.expert": 2, "model.moe.grouped_gemm": "te",
                                                      "device": "cuda"}))
    assert unsupported(te_experts, world_size=2, device_type="cuda", arch=90) == []


def test_what_cannot_work_is_still_refused_under_ep():
    """Still refused: EP not dividing DP, fp32 main grads under fusion, TE knobs on a CPU, moe_dispatch recompute."""
    fused = {**BEST_SINGLE_GPU, "parallel.expert": 2}
    cpu = Recipe.model_validate(recipe_dict(**{**fused, "device": "cpu", "compile": False}))
    problems = unsupported(cpu, world_size=2, device_type="cpu")
    assert any(p.startswith("model.moe.expert_wgrad: te (Transformer Engine grouped GEMM) needs a CUDA GPU")
               for p in problems)
    assert any(p.startswith("cross_entropy: te (Transformer Engine parallel_cross_entropy) needs a CUDA GPU")
               for p in problems)
    fp32_main = Recipe.model_validate(recipe_dict(**{**fused, "optimizer.main_grads": "fp32"}))
    assert any(p.startswith("optimizer.grad_accumulation_fusion needs the gradients on the weights")
               for p in unsupported(fp32_main, world_size=2, device_type="cuda", arch=90))
    odd = Recipe.model_validate(recipe_dict(**{**fused, "parallel.expert": 4, "training.micro_batch_size": 1}))
    assert any(p.startswith("parallel.expert: EP (4) must divide DP·CP (2)")
               for p in unsupported(odd, world_size=2, device_type="cuda", arch=90))


# ---------------------------------------------------------------------------------------------------------------
# In-process ranks: every gradient of EP = 2 against EP = 1, per knob combination.
# ---------------------------------------------------------------------------------------------------------------

CHUNK = {"model.moe.dispatch_chunk_tokens": 8}  # 32 tokens per micro-batch: 4 chunks
PADDED = {"model.moe.capacity_factor": 1.0, "model.moe.pad_to_capacity": True}
FUSION = {"optimizer.grad_accumulation_fusion": True}
# name → (recipe overrides, fuse the experts' weight gradients: grad_accum's CPU stand-in for expert_wgrad: te)
CASES: dict[str, tuple[dict, bool]] = {
    "dropless": ({}, False),
    "dropless-chunked": (CHUNK, False),
    "padded-chunked": ({**PADDED, **CHUNK}, False),
    "compact-1.25-chunked": ({"model.moe.capacity_factor": 1.25, "model.moe.drop_policy": "position", **CHUNK},
                             False),
    "fused-output": (FUSION, False),
    "fused-dropless-chunked": ({**FUSION, **CHUNK}, True),
    "fused-padded": ({**FUSION, **PADDED}, True),
}
# Two micro-batches per rank, a balanced router off (natural routing: uneven split sizes), capacity 1.0 drops.
COMMON = {"training.global_batch_size": 8, "training.micro_batch_size": 2}


def _step_gradients(trainer, world: int) -> tuple[dict[str, torch.Tensor], dict]:
    """Run step 1 of `trainer` for real; its gradients as the optimizer sees them (reduced, before the update),
    the EP shards gathered into whole experts, and how the reduction went."""
    from trainer.parallelize import unwrap

    model = unwrap(trainer.model)
    seen: dict[str, torch.Tensor] = {}
    real_step = trainer.optimizer.step

    def snapshot_then_step(*args, **kwargs):  # instrumentation: the real step still runs
        seen.update({name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None})
        return real_step(*args, **kwargs)

    trainer.optimizer.step = snapshot_then_step
    row = trainer.train_step(1)
    if trainer.ep is not None:
        for p_name, param in model.named_parameters():
            if id(param) in trainer._expert_ids:
                parts = [torch.empty_like(seen[p_name]) for _ in range(trainer.ep.size)]
                dist.all_gather(parts, seen[p_name], group=trainer.ep.group)
                seen[p_name] = torch.cat(parts)
    outside = trainer.outside
    info = {"grad_norm": row["grad_norm"], "loss": row["loss"], "dropped": row["tokens_dropped_frac"],
            "collectives": outside.collectives if outside else 0, "overlapped": outside.overlapped if outside else 0,
            "count_exchanges": trainer.ep.count_exchanges if trainer.ep else 0, "world": world}
    return seen, info


def _gradients_worker(rank: int, world: int, port: int, cases: list[Case], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from trainer.distributed import Dist
    from trainer.loop import Trainer

    results = {}
    for name, overrides, fuse_experts, ep in cases:
        recipe = Recipe.model_validate(recipe_dict(**{**COMMON, **overrides, "parallel.expert": ep}))
        trainer = Trainer(recipe, Dist(rank, rank, world, torch.device("cpu")), log=lambda line: None,
                          expert_wgrad="torch" if fuse_experts else None)
        results[(name, ep)] = _step_gradients(trainer, world)
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


def _assert_same_gradients(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], what: str) -> None:
    assert got.keys() == ref.keys(), what
    for name, grad in ref.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{what} {n}: {m}")


def test_ep2_gradients_equal_ep1_for_each_knob_combination(world2):
    """2 ranks: EP = 2 (expert-data-parallel size 1) against EP = 1 (DP 2, every expert in DDP or fused), every
    gradient after one step of two micro-batches, for dropless, chunked, padded, compact dropping and fusion."""
    _, results = world2
    base_grads = results[("dropless", 1)][0]
    for name in CASES:
        (ep1, info1), (ep2, info2) = results[(name, 1)], results[(name, 2)]
        _assert_same_gradients(ep2, ep1, f"{name}: EP 2 vs EP 1")
        assert info2["grad_norm"] == pytest.approx(info1["grad_norm"], rel=1e-5)
        assert info2["loss"] == pytest.approx(info1["loss"], rel=2e-5) and info2["dropped"] == info1["dropped"]
        if "capacity_factor" not in str(CASES[name][0]):  # dropless: chunking or fusion change only rounding
            _assert_same_gradients(ep2, base_grads, f"{name}: EP 2 vs unchunked unfused EP 1")
    assert results[("padded-chunked", 2)][1]["dropped"] > 0  # capacity 1.0 really drops with natural routing
    # dropless chunks: one count all-to-all per MoE layer and micro-batch (was one per chunk: 4 × 2), none padded
    assert results[("dropless-chunked", 2)][1]["count_exchanges"] == 2
    assert results[("fused-dropless-chunked", 2)][1]["count_exchanges"] == 2
    assert results[("padded-chunked", 2)][1]["count_exchanges"] == 0
    # EP = DP = 2: the experts' reduction is no collective; the fused output layer's all-reduce (the only
    # collective outside DDP) started inside the last backward
    for name in ("fused-output", "fused-dropless-chunked", "fused-padded"):
        assert results[(name, 2)][1]["collectives"] == results[(name, 2)][1]["overlapped"] == 1, name
    assert results[("dropless", 2)][1]["collectives"] == 0
    # EP = 1, DP = 2 with fused experts: output, w1, w2 each all-reduced from the backward, after the 4th chunk
    assert results[("fused-dropless-chunked", 1)][1]["overlapped"] == 3


def test_fused_experts_reduce_over_the_expert_data_parallel_group_on_four_ranks(world4):
    """4 ranks, EP 2 × expert-DP 2: the fused experts' gradients are all-reduced over their expert-data-parallel
    pair from inside the backward, and equal EP = 1's (DP 4)."""
    _, results = world4
    (ep1, info1), (ep2, info2) = results[("fused", 1)], results[("fused", 2)]
    _assert_same_gradients(ep2, ep1, "EP 2 × EDP 2 vs EP 1 × DP 4")
    assert info2["grad_norm"] == pytest.approx(info1["grad_norm"], rel=1e-5)
    assert info2["overlapped"] == info2["collectives"] == 3  # output (all ranks), w1 and w2 (their EDP pair)
