"""Gradient-accumulation fusion (trainer/grad_accum.py): the fused weight-gradient GEMMs leave exactly the
gradients autograd's accumulation leaves, over several micro-batches, in a whole model and in the trainer;
and the recipe refuses the set-ups the fusion cannot serve."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import trainer_helpers  # noqa: F401 (puts the checkout on sys.path)
from pydantic import ValidationError
from trainer_helpers import recipe_dict

from trainer import grad_accum
from trainer.distributed import Dist
from trainer.loop import Trainer
from trainer.model import GPT
from trainer.recipe import Recipe, knob_problems, layout_problems, te_knobs
from trainer.te_support import select_paths, te_import_error, te_linear_factory

MICRO_BATCHES = 3


def test_grouped_mm_accumulates_what_autograd_would_with_an_empty_group():
    torch.manual_seed(0)
    x = torch.randn(32, 16, requires_grad=True)
    w = torch.randn(5, 24, 16, requires_grad=True)
    offs = torch.tensor([5, 12, 12, 20, 32], dtype=torch.int32)  # expert 2 gets no rows
    for _ in range(MICRO_BATCHES):
        F.grouped_mm(x, w.transpose(-2, -1), offs=offs).square().sum().backward()
    ref_w, ref_x = w.grad.clone(), x.grad.clone()
    w.grad = x.grad = None
    grad_accum.prepare([w])
    for _ in range(MICRO_BATCHES):
        grad_accum.grouped_mm(x, w, offs, "torch").square().sum().backward()
    assert w.grad is w.main_grad  # autograd never replaced the buffer
    assert torch.equal(w.grad, ref_w) and torch.equal(x.grad, ref_x)
    assert torch.count_nonzero(w.grad[2]) == 0


def test_linear_accumulates_into_main_grad_and_returns_no_weight_grad():
    torch.manual_seed(1)
    w = torch.randn(50, 16, requires_grad=True)
    h = torch.randn(2, 7, 16, requires_grad=True)
    for _ in range(MICRO_BATCHES):
        F.linear(h, w).sin().sum().backward()
    ref_w, ref_h = w.grad.clone(), h.grad.clone()
    w.grad = h.grad = None
    grad_accum.prepare([w])
    for _ in range(MICRO_BATCHES):
        grad_accum.linear(h, w).sin().sum().backward()
    assert w.grad is w.main_grad
    torch.testing.assert_close(w.grad, ref_w, rtol=1e-6, atol=1e-6)
    assert torch.equal(h.grad, ref_h)
    with torch.no_grad():  # evaluation: the plain GEMM, nothing saved
        assert torch.equal(grad_accum.linear(h, w), F.linear(h, w))


def test_prepare_zeroes_the_same_buffer_each_step():
    w = torch.nn.Parameter(torch.ones(3, 4))
    grad_accum.prepare([w])
    buf = w.main_grad
    buf.add_(5.0)
    w.grad = None  # what the optimizer's zero_grad(set_to_none=True) does at the end of a step
    grad_accum.prepare([w])
    assert w.main_grad is buf and w.grad is buf and torch.count_nonzero(buf) == 0
    grad_accum.release([w])
    assert not grad_accum.has_main_grad(w)


def tiny_moe(fuse: bool, **overrides) -> tuple[GPT, list]:
    cfg = Recipe.model_validate(recipe_dict(**overrides))
    torch.manual_seed(3)
    model = GPT(cfg.model, cfg.training.seq_length, 256)
    return model, grad_accum.fused_weights(model, "torch", torch.float32) if fuse else []


def assert_same_gradients(reference: GPT, model: GPT, fused: list, tol: float) -> None:
    """Three micro-batches through both models (the fused one prepared first); every gradient alike."""
    grad_accum.prepare(fused)
    gen = torch.Generator().manual_seed(9)
    for _ in range(MICRO_BATCHES):
        tokens = torch.randint(0, 200, (2, 16), generator=gen)
        targets = torch.randint(0, 200, (2, 16), generator=gen)
        for net in (reference, model):
            out = net(tokens, targets)
            (out.loss + out.aux_loss).backward()
    for (name, a), b in zip(reference.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=tol, atol=tol / 10, msg=name)
    assert all(w.grad is w.main_grad for w in fused)


@pytest.mark.parametrize("recompute", [False, True])
def test_a_whole_moe_model_gets_the_same_gradients(recompute):
    reference, _ = tiny_moe(False)
    model, fused = tiny_moe(True)
    model.load_state_dict(reference.state_dict())
    experts = [m for m in model.modules() if getattr(m, "wgrad_backend", None)]
    assert experts and all(m.wgrad_backend == "torch" for m in experts)
    assert {id(w) for w in fused} == {id(model.output.weight)} | {id(w) for m in experts for w in (m.w1, m.w2)}
    for m in experts:
        m.recompute_act = recompute  # the saved-tensor-hook path fuses too
    assert_same_gradients(reference, model, fused, tol=1e-6)


def run_trainer(**optimizer) -> tuple[list[dict], Trainer]:
    data = recipe_dict(**{f"optimizer.{k}": v for k, v in optimizer.items()})
    dist = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    trainer = Trainer(Recipe.model_validate(data), dist, log=lambda line: None)
    rows: list[dict] = []
    trainer.run(rows.append)
    return rows, trainer


@pytest.mark.parametrize("masters", [False, True])
def test_the_trainer_trains_the_same_with_fusion(masters):
    extra = {"master_weights": True, "main_grads": "bf16"} if masters else {}
    plain, _ = run_trainer(**extra)
    fused, trainer = run_trainer(grad_accumulation_fusion=True, **extra)
    assert [id(w) for w in trainer.fused_weights] == [id(trainer.model.output.weight)]  # no TE, no expert backend
    assert trainer.model.output.weight.main_grad is not None
    tol = 2e-2 if masters else 1e-5  # bf16 gradients: the GEMM rounds once, autograd's add twice
    for a, b in zip(plain, fused, strict=True):
        assert abs(a["loss"] - b["loss"]) <= tol * max(1.0, abs(a["loss"]))
        assert abs(a["grad_norm"] - b["grad_norm"]) <= tol * max(1.0, a["grad_norm"])
    assert fused[-1]["loss"] < fused[0]["loss"]


def test_recipe_refuses_what_fusion_cannot_serve():
    fp32_main = Recipe.model_validate(recipe_dict(**{"optimizer.grad_accumulation_fusion": True, "device": "cuda"}))
    [problem] = [p for p in knob_problems(fp32_main, "cuda", 90) if "grad_accumulation_fusion" in p]
    assert problem.startswith("optimizer.grad_accumulation_fusion needs the gradients on the weights")
    assert "main_grads: bf16" in problem
    ok = Recipe.model_validate(recipe_dict(**{"optimizer.grad_accumulation_fusion": True, "device": "cuda",
                                              "optimizer.main_grads": "bf16"}))
    assert not knob_problems(ok, "cuda", 90)
    assert not layout_problems(ok, 2)  # more ranks: trainer/grad_reduce.py reduces the fused gradients (issue 24)
    assert not layout_problems(ok, 1)
    te_wgrad = Recipe.model_validate(recipe_dict(**{"model.moe.expert_wgrad": "te"}))
    problems = knob_problems(te_wgrad, "cpu", None)
    assert any(p.startswith("model.moe.expert_wgrad: te accumulates into the gradient") for p in problems)
    assert any(p.startswith("model.moe.expert_wgrad: te (Transformer Engine grouped GEMM) needs a CUDA GPU")
               for p in problems)
    assert "model.moe.expert_wgrad: te" in te_knobs(te_wgrad)
    fp32_weights = Recipe.model_validate(recipe_dict(**{"optimizer.grad_accumulation_fusion": True, "device": "cuda",
                                                        "optimizer.master_weights": False}))
    assert any(p.startswith("optimizer.grad_accumulation_fusion: with master_weights: false the weights stay fp32")
               for p in knob_problems(fp32_weights, "cuda", 90))
    assert not [p for p in knob_problems(fp32_weights, "cpu", None) if "grad_accumulation_fusion" in p]
    with pytest.raises(ValidationError, match="expert_wgrad: te replaces the weight gradient of grouped_gemm"):
        Recipe.model_validate(recipe_dict(**{"model.moe.expert_wgrad": "te", "model.moe.grouped_gemm": "loop"}))


def test_te_layers_are_built_accumulating_when_fused():
    fused = Recipe.model_validate(recipe_dict(**{"optimizer.grad_accumulation_fusion": True,
                                                 "model.moe.expert_wgrad": "te"}))
    paths = select_paths(fused)
    assert paths.fuse_wgrad and paths.expert_wgrad == "te" and paths.uses_te
    assert not select_paths(Recipe.model_validate(recipe_dict())).uses_te

    class LinearSpec:  # records what te.Linear would be built with
        def __init__(self, *args, **kwargs):
            self.args, self.kwargs = args, kwargs

    te = type("te", (), {"Linear": LinearSpec})
    made = te_linear_factory(te, "cuda", torch.float32, paths.fuse_wgrad)(16, 32)
    assert made.args == (16, 32) and made.kwargs["fuse_wgrad_accumulation"] is True
    assert "fuse_wgrad_accumulation" not in te_linear_factory(te, "cuda", torch.float32)(16, 32).kwargs


needs_te_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or te_import_error() is not None,
    reason="Transformer Engine's grouped GEMM needs a CUDA GPU with transformer_engine importable",
)


@needs_te_gpu
def test_te_grouped_wgrad_matches_torch_on_the_gpu():
    torch.manual_seed(0)
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(4096, 1536, device="cuda", dtype=torch.bfloat16)
    counts = torch.full((8,), 512, dtype=torch.int32, device="cuda")
    counts[0], counts[1], counts[2] = 384, 1152, 0  # uneven, and an expert with no rows
    offs = counts.cumsum(0).to(torch.int32)
    splits = counts.tolist()
    base = torch.randn(8, 1536, 2048, device="cuda", dtype=torch.bfloat16)
    ref, got = base.clone(), base.clone()
    grad_accum.accumulate_with_torch(ref, x, grad, offs, splits)
    grad_accum.accumulate_with_te(got, x, grad, offs, splits)
    assert torch.equal(got[2], base[2])  # nothing added for the empty expert
    scale = ref.float().abs().max()
    assert (got.float() - ref.float()).abs().max() <= 2 ** -7 * scale  # a bf16 ulp of the largest value
    grad_accum.check_te_accumulate(torch.device("cuda"))  # what the trainer runs before training


def test_only_weights_that_can_accumulate_are_fused():
    cfg = Recipe.model_validate(recipe_dict(cross_entropy="fused"))
    model = GPT(cfg.model, cfg.training.seq_length, 256, cross_entropy="fused")
    fused = grad_accum.fused_weights(model, "torch", torch.float32)
    assert id(model.output.weight) not in {id(w) for w in fused}  # the fused loss makes its own weight gradient
    assert fused  # the experts still are
    assert not grad_accum.fused_weights(model, "torch", torch.bfloat16)  # fp32 weights under bf16: none


def test_copy_of_a_fused_model_keeps_its_marks():
    model, fused = tiny_moe(True)
    twin = copy.deepcopy(model)
    assert all(getattr(m, "wgrad_backend", None) == "torch" for m in twin.modules() if hasattr(m, "wgrad_backend"))


def test_compiled_layers_break_the_graph_at_the_fused_gemms_and_agree():
    from trainer.parallelize import apply_compile

    reference, _ = tiny_moe(False)
    model, fused = tiny_moe(True)
    model.load_state_dict(reference.state_dict())
    apply_compile(model)  # as the trainer's `compile: true`: the fused GEMMs run eagerly between graphs
    assert_same_gradients(reference, model, fused, tol=1e-5)


def kernel_ms(trace: str, name_part: str) -> tuple[float, int]:
    from reports.profile_trace import load_events

    path = trainer_helpers.ROOT / "tests" / "data" / "traces" / trace
    kernels = [e for e in load_events(path) if e.get("cat") == "kernel" and name_part in e.get("name", "")]
    return sum(e["dur"] for e in kernels) / 1e3, len(kernels)


def test_recorded_h200_traces_show_the_gradient_adds_gone():
    """Step 8 of the MoE proxy on the H200, before (autograd adds) and with the fusion + expert_wgrad: te."""
    add = "CUDAFunctor_add<c10::BFloat16>"
    before_ms, before_n = kernel_ms("moe_proxy_step8.trace.json.gz", add)
    after_ms, after_n = kernel_ms("moe_proxy_fused_step8.trace.json.gz", add)
    assert before_ms > 50 and after_ms < 0.15 * before_ms  # 53.8 ms → 6.3 ms (attention, embedding remain)
    assert after_n < before_n
    with_beta_ms, with_beta_n = kernel_ms("moe_proxy_fused_step8.trace.json.gz", "badd")  # logits dW, beta = 1
    assert with_beta_n == 8 and with_beta_ms > 0  # one accumulating output-layer GEMM per micro-batch


def test_the_memory_estimate_keeps_fused_gradients_all_run():
    """With one micro-batch the fused gradients exist before the forward (the estimate used to assume they are
    made in the backward); with several they existed anyway (the H200 MoE proxy: 76.18 → 76.56 GiB measured)."""
    from trainer.memory import estimate

    def peak(fuse: bool, global_batch: int) -> int:
        data = recipe_dict(**{"training.global_batch_size": global_batch, "optimizer.main_grads": "bf16",
                              "device": "cuda"})
        if fuse:
            data = recipe_dict(**{"training.global_batch_size": global_batch, "optimizer.main_grads": "bf16",
                                  "device": "cuda", "optimizer.grad_accumulation_fusion": True,
                                  "model.moe.expert_wgrad": "te"})
        return estimate(Recipe.model_validate(data), 1, gpu=True).peak_bytes

    assert peak(True, 2) > peak(False, 2)  # one micro-batch: the experts' and output layer's gradients persist
    assert peak(True, 4) == peak(False, 4)  # two micro-batches: the gradients of the first exist either way
