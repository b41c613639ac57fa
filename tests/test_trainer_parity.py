"""Numerics parity of the bundled trainer (CPU, and a CUDA GPU where there is one): what trains bitwise equal, and what only up to rounding.

- `model.moe.expert_weights: single` and `discrete` train bitwise equal (loss, grad norm, aux loss, dropped
  fraction `==` at every step) over the matrix precision × master weights × main grads × accumulation, and
  beside the MoE knobs that keep the maths (loop GEMMs, chunked dispatch, capacity drops, recompute, eval).
- Train-eval-train equals train-only bitwise, and `Trainer.evaluate` leaves every weight, gradient,
  optimizer state and the RNG as it found them.
- Toggles that change rounding (dispatch chunking, bf16 main grads under accumulation) stay inside a bound,
  and bf16 main grads without accumulation are bitwise equal to fp32 ones.

Threads: the in-process runs pin torch to 1 intra-op thread (fixture `one_thread`), the entry-point run to 2
(`OMP_NUM_THREADS=2`), the CI machine's count (2 cores; an AMD EPYC or an AVX-512 Intel Xeon). The single/discrete
and eval parities hold at any thread count: both sides reduce tensors of the same shapes, and shapes are what split
a reduction between threads (the grad-norm ulp this file guards against showed with 1 thread and with 2). One
thread keeps the bounded comparisons reproducible and the file fast on 2 shared cores. A bitwise claim compares
runs through the same kernels: two kernels for the same maths (torch's fused AdamW and trainer/adamw_pa.py) agree
to an ulp only, and which ulp depends on the CPU's vector width.
"""

from __future__ import annotations

import pytest
import torch
import trainer_helpers
from trainer_helpers import explain, metrics, run_trainer

from trainer.distributed import Dist
from trainer.loop import Trainer
from trainer.recipe import Recipe

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one intra-op thread for every test here
CPU = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
STEPS = 5
COMPARED = ("loss", "grad_norm", "aux_loss", "tokens_dropped_frac", "skipped")
DISCRETE = {"model.moe.expert_weights": "discrete"}


def _trainer(**overrides: object) -> Trainer:
    data = trainer_helpers.recipe_dict(**{"training.steps": STEPS, **overrides})
    return Trainer(Recipe.model_validate(data), CPU, log=lambda line: None)


def _rows(**overrides: object) -> list[dict]:
    rows: list[dict] = []
    _trainer(**overrides).run(rows.append)
    return rows


def _assert_bitwise(a: list[dict], b: list[dict], keys: tuple[str, ...] = COMPARED) -> None:
    assert len(a) == len(b) == STEPS
    for x, y in zip(a, b, strict=True):
        for key in keys:
            assert x.get(key) == y.get(key), f"step {x['step']}: {key} {x.get(key)!r} != {y.get(key)!r}"


def _toggles(precision: str, master: bool, main_grads: str, accum: int) -> dict[str, object]:
    """One point of the matrix; accumulation = global batch / micro batch (2)."""
    return {
        "precision": precision,
        "optimizer.master_weights": master,
        "optimizer.main_grads": main_grads,
        "training.global_batch_size": 2 * accum,
    }


# precision × master weights × main grads (only meaningful with master weights) × accumulation 1 / 2.
# On the CPU `precision: bf16` computes in fp32 unless master weights make the weights bf16.
MATRIX = [
    (precision, master, main_grads, accum)
    for precision in ("fp32", "bf16")
    for master, main_grads in ((False, "fp32"), (True, "fp32"), (True, "bf16"))
    for accum in (1, 2)
]


@pytest.mark.parametrize("precision, master, main_grads, accum", MATRIX)
def test_single_and_discrete_expert_weights_train_bitwise_equal(precision, master, main_grads, accum):
    toggles = _toggles(precision, master, main_grads, accum)
    single, discrete = _rows(**toggles), _rows(**toggles, **DISCRETE)
    _assert_bitwise(single, discrete)
    assert single[0]["grad_norm"] > 1.0  # clipping is active: a grad-norm ulp would reach the weights


@pytest.mark.parametrize(
    "knobs",
    [
        {"model.moe.grouped_gemm": "loop"},
        {"model.moe.dispatch_chunk_tokens": 12},
        {"model.moe.capacity_factor": 1.0},
        {
            "model.moe.capacity_factor": 1.0,
            "model.moe.pad_to_capacity": True,
            "model.moe.drop_policy": "position",
        },
        {"recompute": "selective"},
        {"training.eval_interval": 2},
    ],
    ids=["loop", "chunked", "capacity", "padded", "selective", "eval"],
)
def test_single_and_discrete_equal_beside_moe_knobs(knobs):
    toggles = {**_toggles("bf16", True, "fp32", 2), **knobs}
    single, discrete = _rows(**toggles), _rows(**toggles, **DISCRETE)
    _assert_bitwise(
        single, discrete, (*COMPARED, "eval_loss") if "training.eval_interval" in knobs else COMPARED
    )
    if "model.moe.capacity_factor" in knobs:
        assert any(row["tokens_dropped_frac"] > 0 for row in single)  # capacity really dropped pairs


def test_single_and_discrete_equal_through_the_entry_point(tmp_path):
    """The issue's case (bf16, master weights, global batch 2) through `python -m trainer`, metrics.jsonl."""
    recipe = trainer_helpers.recipe_dict(**{"training.steps": STEPS, **_toggles("bf16", True, "fp32", 1)})
    rows = {}
    for name, weights in (("single", "single"), ("discrete", "discrete")):
        recipe["model"]["moe"]["expert_weights"] = weights
        proc = run_trainer(tmp_path / name, recipe, env={"OMP_NUM_THREADS": "2"})
        assert proc.returncode == 0, explain(proc)
        rows[name] = metrics(tmp_path / name)
    _assert_bitwise(rows["single"], rows["discrete"])


@pytest.mark.parametrize(
    "toggles",
    [
        _toggles("fp32", False, "fp32", 2),
        _toggles("bf16", True, "fp32", 2),
        {**_toggles("bf16", True, "bf16", 2), **DISCRETE},
        {
            **_toggles("bf16", True, "fp32", 1),
            "model.moe.dispatch_chunk_tokens": 12,
            "recompute": "selective",
        },
        {**_toggles("fp32", False, "fp32", 1), "model.moe.capacity_factor": 1.0, **DISCRETE},
    ],
    ids=["fp32", "bf16-master", "bf16-main-grads-discrete", "chunked-recompute", "capacity-discrete"],
)
def test_train_eval_train_equals_train_only(toggles):
    plain = _rows(**toggles)
    evaluated = _rows(**toggles, **{"training.eval_interval": 1, "training.eval_iters": 2})
    _assert_bitwise(plain, evaluated)
    assert all("eval_loss" in row for row in evaluated) and not any("eval_loss" in row for row in plain)


def _state(trainer: Trainer) -> list[torch.Tensor]:
    """Everything training reads next: weights, buffers, gradients, master weights, optimizer state."""
    model = trainer.model
    tensors = [t.detach().clone() for t in (*model.parameters(), *model.buffers())]
    tensors += [p.grad.clone() for p in model.parameters() if p.grad is not None]
    if trainer.master is not None:
        tensors += [m.detach().clone() for m in trainer.master.master]
        tensors += [m.grad.clone() for m in trainer.master.master if m.grad is not None]
    for state in trainer.optimizer.state.values():
        tensors += [v.clone() for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


@pytest.mark.parametrize("master", [False, True])
def test_evaluate_leaves_training_state_untouched(master):
    trainer = _trainer(**_toggles("bf16", master, "fp32", 2), **{"model.moe.dispatch_chunk_tokens": 12})
    trainer.train_step(1)
    before, rng = _state(trainer), torch.get_rng_state()
    assert trainer.evaluate() > 0
    after = _state(trainer)
    assert len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(module.training for module in trainer.model.modules())  # back in training mode


@pytest.mark.parametrize("master", [False, True])
@pytest.mark.parametrize(
    "toggle",
    [
        {"precision": "fp32"},
        {"recompute": "full"},
        {"recompute": "selective"},
        {"model.moe.grouped_gemm": "loop"},
        {"model.moe.capacity_factor": 4.0, "model.moe.drop_policy": "position"},
    ],
    ids=["precision-fp32", "recompute-full", "recompute-selective", "loop-gemm", "ample-capacity-position"],
)
def test_toggles_that_keep_the_maths_train_bitwise_equal_on_the_cpu(toggle, master):
    """precision bf16 → fp32: the CPU never autocasts (and master weights make the weights bf16 either way);
    recompute re-runs the same ops; the CPU grouped_mm is a matmul per group, as the loop; ample capacity
    with position drops keeps dropless's row order."""
    base = _toggles("bf16", master, "fp32", 2)
    _assert_bitwise(_rows(**base), _rows(**{**base, **toggle}))


def _max_rel_gap(a: list[dict], b: list[dict], key: str) -> float:
    return max(abs(x[key] - y[key]) / abs(y[key]) for x, y in zip(a, b, strict=True))


def test_bf16_main_grads_equal_fp32_without_accumulation_and_bounded_with_it():
    """One micro-batch: the fp32 main grad is 0 + the bf16 gradient, exactly its fp32 cast. Two: fp32 sums
    two bf16 gradients once, bf16 rounds the sum to bf16 on the parameter (relative error up to 2^-8).

    Both sides update through the same optimizer (bf16 moments: trainer/adamw_pa.py), so only the main grads
    differ. With fp32 moments, fp32 main grads would go through torch's fused AdamW kernel and bf16 ones through
    adamw_pa's: equal to an ulp, not bitwise (on an AVX-512 Xeon the weights parted at step 4)."""
    for accum in (1, 2):
        fp32, bf16 = (
            _rows(**_toggles("bf16", True, "fp32", accum), **{"optimizer.moments": "bf16"}),
            _rows(**_toggles("bf16", True, "bf16", accum), **{"optimizer.moments": "bf16"}),
        )
        if accum == 1:
            _assert_bitwise(fp32, bf16)
        else:
            assert [r["loss"] for r in fp32] != [r["loss"] for r in bf16]  # the matrix axis changes numerics
            assert _max_rel_gap(fp32, bf16, "loss") < 1e-3 and _max_rel_gap(fp32, bf16, "grad_norm") < 1e-2


def test_chunked_dispatch_equal_up_to_gemm_rounding():
    """Chunks run each expert GEMM over fewer rows: CPU BLAS (and cuBLAS) pick kernels by shape, so a row's
    sums round differently and the expert weight gradients are sums of per-chunk GEMMs. Bounded in fp32."""
    plain, chunked = _rows(), _rows(**{"model.moe.dispatch_chunk_tokens": 12})
    assert _max_rel_gap(plain, chunked, "loss") < 1e-6 and _max_rel_gap(plain, chunked, "grad_norm") < 1e-5


# ---------------------------------------------------------------------------------------------
# On a CUDA GPU (skipped elsewhere; on the H200: `pytest -q -m gpu tests/test_trainer_parity.py`).
# ---------------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _gpu_rows(**overrides: object) -> list[dict]:
    data = trainer_helpers.recipe_dict(**{"training.steps": STEPS, "device": "cuda", **overrides})
    cuda = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cuda", 0))
    rows: list[dict] = []
    Trainer(Recipe.model_validate(data), cuda, log=lambda line: None).run(rows.append)
    return rows


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("master", [None, False], ids=["bf16-weights", "fp32-weights"])
@pytest.mark.parametrize("accum", [1, 2])
def test_single_and_discrete_bitwise_on_the_gpu(master, accum):
    """bf16 autocast, grouped_mm, fused AdamW, `_foreach_norm` over per-expert views: bitwise equal."""
    toggles = {**_toggles("bf16", True, "fp32", accum), "optimizer.master_weights": master}
    _assert_bitwise(_gpu_rows(**toggles), _gpu_rows(**toggles, **DISCRETE))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    "precision, fp8_recipe", [("bf16", "current"), ("fp8", "current"), ("fp8", "delayed")]
)
def test_train_eval_train_equals_train_only_on_the_gpu(precision, fp8_recipe):
    """fp8 needs Transformer Engine: under delayed scaling an evaluation's amaxes may move the next step's
    scales (trainer/KNOBS.md); this says whether they do."""
    from trainer.te_support import te_import_error

    if precision == "fp8" and te_import_error() is not None:
        pytest.skip(f"Transformer Engine cannot be imported: {te_import_error()}")
    toggles = {**_toggles(precision, True, "fp32", 2), "fp8_recipe": fp8_recipe}
    plain = _gpu_rows(**toggles)
    _assert_bitwise(plain, _gpu_rows(**toggles, **{"training.eval_interval": 1}))
