"""Every MoE performance knob on the CPU: equivalences with the default path (outputs, gradients, losses)."""

from __future__ import annotations

import weakref

import pytest
import torch
import trainer_helpers

from trainer.distributed import Dist
from trainer.loop import Trainer
from trainer.model import GPT, MLP
from trainer.moe import (
    GroupedExperts,
    GroupedLinearExperts,
    MoELayer,
    Routing,
    activate,
    dispatch,
    plan_dispatch,
    saved_as_recompute,
)
from trainer.parallelize import apply_recompute
from trainer.recipe import ModelConfig, MoEConfig, Recipe, RouterConfig

CPU = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _layer(activation: str = "swiglu", shared: bool = False, **moe) -> MoELayer:
    torch.manual_seed(3)
    cfg = MoEConfig(num_experts=4, top_k=2, ffn_hidden_size=16, **moe)
    mlp = MLP(8, 16, activation, 0.3, 0.3) if shared else None
    return MoELayer(8, activation, cfg, init_std=0.3, output_std=0.3, shared=mlp)


def _run(layer: MoELayer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Output, dropped pairs and the gradients of (input, every parameter) for a fixed upstream gradient."""
    x = x.clone().requires_grad_()
    out, aux, dropped = layer(x)
    upstream = torch.linspace(-1, 1, out.numel()).view_as(out)
    params = [p for p in layer.parameters()]
    grads = torch.autograd.grad((out * upstream).sum() + aux, [x, *params])
    return out.detach(), dropped, list(grads)


def _assert_same(a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 1e-6) -> None:
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b, strict=True)):
        torch.testing.assert_close(u, v, atol=atol, rtol=1e-5, msg=lambda m, i=i: f"tensor {i}: {m}")


def _losses(steps: int = 4, **overrides: object) -> list[float]:
    data = trainer_helpers.recipe_dict(**{"training.steps": steps, **overrides})
    trainer = Trainer(Recipe.model_validate(data), CPU, log=lambda line: None)
    rows: list[dict] = []
    trainer.run(rows.append)
    return [r["loss"] for r in rows]


# ---------------------------------------------------------------------------------------------
# dispatch_chunk_tokens: the pipelined path (run sequentially on the CPU) equals one big chunk.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gemm, activation, chunk", [("torch", "swiglu", 4), ("loop", "squared_relu", 5),
                                                    ("torch", "swiglu", 14)])
def test_chunked_dispatch_equals_unchunked_with_gradients(gemm, activation, chunk):
    x = torch.randn(2, 7, 8)  # 14 tokens: chunks of 4/4/4/2, 5/5/4, or one chunk through the pipelined path
    ref = _run(_layer(activation, shared=True, grouped_gemm=gemm), x)
    got = _run(_layer(activation, shared=True, grouped_gemm=gemm, dispatch_chunk_tokens=chunk), x)
    assert int(got[1]) == 0
    _assert_same([ref[0], *ref[2]], [got[0], *got[2]])  # output, input grad, router/expert/shared grads


def test_chunked_dispatch_with_ample_capacity_equals_dropless():
    x = torch.randn(1, 12, 8)
    ref = _run(_layer(), x)
    # capacity per chunk of 4 tokens = ceil(4 · 2 / 4 · 4) = 8 ≥ every expert's pairs: nothing dropped.
    for pad in (False, True):
        got = _run(_layer(dispatch_chunk_tokens=4, capacity_factor=4.0, pad_to_capacity=pad), x)
        assert int(got[1]) == 0
        _assert_same([ref[0], *ref[2]], [got[0], *got[2]])




def test_chunked_training_losses_equal_unchunked(monkeypatch, one_thread):
    """Equal up to GEMM rounding, not bitwise: each expert GEMM runs over fewer rows per chunk and BLAS picks
    its kernel by shape (trainer/KNOBS.md, "Parity guarantees"). The CPU runs overlapped chunks in order:
    `dispatch_overlap` changes nothing there, bitwise."""
    ref = _losses()
    chunks = _count_calls(monkeypatch, "plan_dispatch")
    chunked = _losses(**{"model.moe.dispatch_chunk_tokens": 12})  # 32 tokens: chunks of 12, 12, 8
    assert chunked == pytest.approx(ref, rel=1e-6, abs=0)
    assert len(chunks) == 4 * 2 * 3  # 4 steps × 2 micro-batches × 1 MoE layer × 3 chunks
    assert _losses(**{"model.moe.dispatch_chunk_tokens": 12, "model.moe.dispatch_overlap": False}) == chunked


def _count_calls(monkeypatch, name: str) -> list[int]:
    """Count calls of trainer.moe.<name> (the real function still runs)."""
    import trainer.moe

    calls: list[int] = []
    real = getattr(trainer.moe, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer.moe, name, counted)
    return calls


# ---------------------------------------------------------------------------------------------
# Drop policies and pad_to_capacity are dropless when the capacity is ample; shared experts; aux loss.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["probs", "position"])
@pytest.mark.parametrize("pad", [False, True])
def test_ample_capacity_equals_dropless_with_gradients(policy, pad):
    x = torch.randn(2, 5, 8)
    ref = _run(_layer(), x)
    # capacity = ceil(10 · 2 / 4 · 4) = 20 ≥ all 20 pairs.
    got = _run(_layer(capacity_factor=4.0, drop_policy=policy, pad_to_capacity=pad), x)
    assert int(got[1]) == 0
    _assert_same([ref[0], *ref[2]], [got[0], *got[2]])


def test_shared_expert_is_added_to_every_token():
    x = torch.randn(2, 5, 8)
    with_shared, without = _layer(shared=True), _layer()
    without.load_state_dict({k: v for k, v in with_shared.state_dict().items() if not k.startswith("shared.")})
    out, _, _ = with_shared(x)
    routed, _, _ = without(x)
    torch.testing.assert_close(out, routed + with_shared.shared(x), rtol=0, atol=0)
    assert with_shared.shared.up.weight.shape == (32, 8)  # SwiGLU: gate|up of the 16-wide shared expert


def test_aux_loss_scales_with_its_coefficient_and_reaches_the_router():
    x = torch.randn(2, 6, 8)
    aux = {}
    for coeff in (0.0, 0.01, 0.02):
        layer = _layer(router=RouterConfig(aux_loss_coeff=coeff))
        _, a, _ = layer(x)
        aux[coeff] = a
        if coeff:
            (grad,) = torch.autograd.grad(a, layer.router.weight)
            assert grad.abs().sum() > 0
    assert aux[0.0].item() == 0.0 and not aux[0.0].requires_grad
    assert aux[0.02].item() == pytest.approx(2 * aux[0.01].item(), rel=1e-6)


def test_squared_relu_experts_and_dense_mlp():
    h = torch.randn(5, 6)
    torch.testing.assert_close(activate(h, "squared_relu"), torch.relu(h) ** 2)
    mlp = MLP(8, 16, "squared_relu", 0.3, 0.3)
    assert mlp.up.weight.shape == (16, 8)  # one up GEMM, not gate|up
    experts = GroupedExperts(4, 8, 16, "squared_relu", 0.3, 0.3)
    assert experts.w1.shape == (4, 16, 8)
    losses = _losses(**{"model.activation": "squared_relu"})
    assert all(torch.isfinite(torch.tensor(losses))) and losses != _losses()


def test_single_and_discrete_expert_weights_train_identically():
    # Bitwise at any thread count (the grad norm splits single weights per expert); the matrix is in
    # tests/test_trainer_parity.py.
    assert _losses(**{"model.moe.expert_weights": "discrete"}) == _losses()


def test_fused_cross_entropy_trains_like_native():
    assert _losses(**{"cross_entropy": "fused"}) == pytest.approx(_losses(), rel=1e-6)


def test_force_balance_routes_evenly_in_training():
    assert _losses(**{"model.moe.router.force_balance": True}) != _losses()
    layer = _layer(router=RouterConfig(force_balance=True))
    counts = torch.bincount(layer.router(torch.randn(12, 8)).experts.flatten(), minlength=4)
    assert counts.tolist() == [6, 6, 6, 6]


@pytest.mark.parametrize("chunk", [None, 12])
def test_evaluating_between_steps_does_not_change_training(chunk):
    def rows(**overrides: object) -> list[dict]:
        data = trainer_helpers.recipe_dict(**{"training.steps": 4, "model.moe.dispatch_chunk_tokens": chunk,
                                              **overrides})
        trainer = Trainer(Recipe.model_validate(data), CPU, log=lambda line: None)
        out: list[dict] = []
        trainer.run(out.append)
        return out

    plain, evaluated = rows(), rows(**{"training.eval_interval": 1})
    assert [r["loss"] for r in evaluated] == [r["loss"] for r in plain]
    assert [r["grad_norm"] for r in evaluated] == [r["grad_norm"] for r in plain]
    assert all("eval_loss" in r for r in evaluated) and not any("eval_loss" in r for r in plain)


# ---------------------------------------------------------------------------------------------
# Selective recompute: core attention, the expert activation and the permuted buffer.
# ---------------------------------------------------------------------------------------------


def test_saved_as_recompute_drops_the_tensor_and_remakes_it():
    w = torch.randn(6, 4, requires_grad=True)
    h = torch.randn(5, 6, requires_grad=True)
    remade = []

    def remake() -> torch.Tensor:
        remade.append(1)
        return torch.tanh(h)

    a = torch.tanh(h)
    ref_grads = torch.autograd.grad((a @ w).square().sum(), [h, w])
    a = torch.tanh(h)
    alive = weakref.ref(a)
    with saved_as_recompute(a, remake):
        y = a @ w  # mm saves a for w's gradient: replaced by the recipe
    del a
    assert alive() is None  # the graph holds no reference to the activation
    grads = torch.autograd.grad(y.square().sum(), [h, w])
    assert remade == [1]
    _assert_same(list(ref_grads), list(grads), atol=0)


CFG = ModelConfig(vocab_size=100, hidden_size=32, num_layers=2, num_attention_heads=4, num_query_groups=2,
                  ffn_hidden_size=64, moe=MoEConfig(num_experts=4, top_k=2, ffn_hidden_size=16, layer_freq=1,
                                                    num_shared_experts=1))


def _model_grads(modules: frozenset[str] | None, **moe) -> tuple[torch.Tensor, list[torch.Tensor]]:
    cfg = CFG.model_copy(update={"moe": CFG.moe.model_copy(update=moe)}) if moe else CFG
    torch.manual_seed(0)
    model = GPT(cfg, seq_length=16, padded_vocab_size=128)
    if modules is not None:
        apply_recompute(model, "selective", modules)
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 100, (2, 17), generator=g)
    out = model(rows[:, :-1], rows[:, 1:])
    grads = torch.autograd.grad(out.loss + out.aux_loss, list(model.parameters()))
    return out.loss.detach(), list(grads)


@pytest.mark.parametrize("modules", [frozenset({"moe_act"}), frozenset({"moe_dispatch"}),
                                     frozenset({"core_attn", "moe_act", "moe_dispatch"})])
@pytest.mark.parametrize("moe", [{}, {"grouped_gemm": "loop"}, {"capacity_factor": 1.0, "pad_to_capacity": True},
                                 {"dispatch_chunk_tokens": 12}])
def test_selective_recompute_gives_the_same_loss_and_gradients(modules, moe, monkeypatch):
    ref_loss, ref_grads = _model_grads(None, **moe)
    gathers = _count_calls(monkeypatch, "gather_rows")
    loss, grads = _model_grads(modules, **moe)
    assert torch.equal(loss, ref_loss)
    _assert_same(ref_grads, grads)
    chunks = 3 if moe.get("dispatch_chunk_tokens") else 1
    # 2 MoE layers: one gather per chunk in the forward, and one more in the backward with moe_dispatch
    assert len(gathers) == 2 * chunks * (2 if "moe_dispatch" in modules else 1)


def test_squared_relu_moe_act_recompute():
    cfg = {"activation": "squared_relu"}
    global CFG
    saved, CFG = CFG, CFG.model_copy(update=cfg)
    try:
        ref_loss, ref_grads = _model_grads(None)
        loss, grads = _model_grads(frozenset({"moe_act", "moe_dispatch"}))
    finally:
        CFG = saved
    assert torch.equal(loss, ref_loss)
    _assert_same(ref_grads, grads)


def test_selective_recompute_training_losses_equal_none(monkeypatch):
    ref = _losses()
    remade = []
    import trainer.moe

    real = trainer.moe.activate_with_remake

    def counting(h, kind):
        a, remake = real(h, kind)
        return a, lambda: remade.append(1) or remake()

    monkeypatch.setattr(trainer.moe, "activate_with_remake", counting)
    assert _losses(recompute="selective") == ref
    assert len(remade) == 4 * 2  # 4 steps × 2 micro-batches × 1 MoE layer: re-made once per backward
    assert _losses(recompute="selective", recompute_modules=["moe_act"]) == ref
    assert _losses(recompute="selective", recompute_modules=["core_attn"]) == ref
    assert _losses(recompute="full") == ref


# ---------------------------------------------------------------------------------------------
# GroupedLinear experts (TE's interface), checked with a plain-torch class of that interface.
# ---------------------------------------------------------------------------------------------


class LoopGroupedLinear(torch.nn.Module):
    """TE GroupedLinear's interface in plain torch: weight{i} [out, in], forward(x, m_splits: list[int])."""

    calls: list[list[int]] = []

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True,
                 params_dtype: torch.dtype | None = None, device: object = None):
        super().__init__()
        assert not bias
        for i in range(num_gemms):
            self.register_parameter(f"weight{i}", torch.nn.Parameter(
                torch.empty(out_features, in_features, dtype=params_dtype, device=device)))
        self.num_gemms = num_gemms

    def forward(self, x: torch.Tensor, m_splits: list[int]) -> torch.Tensor:
        assert isinstance(m_splits, list) and all(isinstance(m, int) for m in m_splits)
        LoopGroupedLinear.calls.append(m_splits)
        parts = x.split(m_splits)
        return torch.cat([p @ getattr(self, f"weight{i}").t() for i, p in enumerate(parts)])


@pytest.mark.parametrize("pad", [False, True])
def test_grouped_linear_experts_equal_grouped_mm(pad):
    torch.manual_seed(1)
    experts = GroupedExperts(4, 8, 16, "swiglu", 0.5, 0.5)
    te_like = GroupedLinearExperts(experts, LoopGroupedLinear)
    routing = Routing(torch.randint(0, 4, (10, 2)), torch.full((10, 2), 0.5), torch.zeros(()))
    plan = plan_dispatch(routing, 4, capacity=10 if pad else None, pad_to_capacity=pad)
    x = dispatch(torch.randn(10, 8), plan).detach()
    upstream = torch.randn(x.shape[0], 8)
    LoopGroupedLinear.calls.clear()
    y_ref = experts(x, plan)
    y = te_like(x, plan)
    torch.testing.assert_close(y, y_ref, atol=1e-6, rtol=1e-5)
    assert LoopGroupedLinear.calls[0] == ([10] * 4 if pad else plan.counts.tolist())
    g_ref = torch.autograd.grad((y_ref * upstream).sum(), [experts.w1, experts.w2])
    g = torch.autograd.grad((y * upstream).sum(), list(te_like.parameters()))
    torch.testing.assert_close(torch.stack(g[:4]), g_ref[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(torch.stack(g[4:]), g_ref[1], atol=1e-6, rtol=1e-5)


def test_grouped_gemm_te_experts_refuse_to_run_unswapped():
    experts = GroupedExperts(4, 8, 16, "swiglu", 0.5, 0.5, gemm="te")
    plan = plan_dispatch(Routing(torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1), torch.zeros(())), 4)
    with pytest.raises(RuntimeError, match="grouped_gemm: te"):
        experts(torch.randn(3, 8), plan)


# ---------------------------------------------------------------------------------------------
# benchmarks/gpu_checks.py (run on an H200, not here): imports cleanly and every run's recipe is valid.
# ---------------------------------------------------------------------------------------------


def test_gpu_checks_script_is_ready():
    import importlib.util

    from trainer.cli import load_recipe
    from trainer.recipe import launch_problems

    path = trainer_helpers.ROOT / "benchmarks" / "gpu_checks.py"
    spec = importlib.util.spec_from_file_location("gpu_checks", path)
    gpu_checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_checks)
    assert set(gpu_checks.GROUPS) == {"green", "layer", "dispatch", "recompute", "loss", "gemm", "te"}
    assert gpu_checks.main(["--list"]) == 0
    refused = {}
    for runs in gpu_checks.RUNS.values():
        for name, overrides in runs:
            recipe = load_recipe(str(gpu_checks.MOE_PROXY), [*gpu_checks.BASE, "training.steps=12", *overrides])
            refused[name] = launch_problems(recipe, 1, gpu_arch="sm_90")
    assert {name for name, problems in refused.items() if problems} == {
        "mxfp8-refused-below-sm100", "chunk4096-stream-recompute-full-refused"}
