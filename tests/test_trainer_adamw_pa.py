"""The precision-aware AdamW (trainer/adamw_pa.py): fused AdamW's update to an ulp, on-device step skipping, bf16
moments that halve the optimizer state and still train like fp32 ones, and the trainer paths that use it."""

from __future__ import annotations

import copy

import pytest
import torch
import trainer_helpers  # noqa: F401 (puts the checkout on sys.path)
from test_trainer_master import losses
from torch import nn

from trainer.adamw_pa import PrecisionAwareAdamW
from trainer.optim import grad_norm
from trainer.recipe import OptimizerConfig, Recipe

CFG = OptimizerConfig(lr=1e-2, weight_decay=0.1)


def pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 4))
    return model, copy.deepcopy(model)


def fused(model: nn.Module) -> torch.optim.AdamW:
    groups = [{"params": [p for p in model.parameters() if p.ndim >= 2], "weight_decay": CFG.weight_decay},
              {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}]  # fmt: skip
    return torch.optim.AdamW(groups, lr=CFG.lr, betas=(CFG.beta1, CFG.beta2), eps=CFG.eps, fused=True)


def step_both(models, optimizers, skip: bool, scale: float) -> None:
    x = torch.randn(8, 16)
    for model in models:
        model(x).pow(2).mean().backward()
    for opt in optimizers:
        opt.grad_scale = torch.tensor(scale)
        opt.found_inf = torch.tensor(1.0 if skip else 0.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def test_matches_fused_adamw_with_clip_and_skipped_steps():
    ref_model, model = pair()
    params = list(model.parameters())
    ref, opt = fused(ref_model), PrecisionAwareAdamW(params, params, CFG, torch.float32)
    before = [p.detach().clone() for p in params]
    step_both((ref_model, model), (ref, opt), skip=True, scale=1.0)
    assert all(
        torch.equal(a, b) for a, b in zip(before, params, strict=True)
    )  # a skipped step writes nothing
    assert opt.step_count.item() == 0
    for step in range(6):
        step_both((ref_model, model), (ref, opt), skip=step == 3, scale=1.0 + step)
    diff = max((a - b).abs().max().item() for a, b in zip(ref_model.parameters(), params, strict=True))
    assert diff < 1e-6  # the same math in another order: an ulp or two of the fp32 weights
    assert opt.step_count.item() == 5


def test_bf16_moments_halve_the_state():
    _, model = pair()
    params = list(model.parameters())
    full = PrecisionAwareAdamW(params, params, CFG, torch.float32).state_bytes()
    half = PrecisionAwareAdamW(params, params, CFG, torch.bfloat16).state_bytes()
    assert half * 2 == full == 2 * 4 * sum(p.numel() for p in params)


def test_bf16_gradients_are_normed_in_fp32():
    grads = [torch.full((4096,), 0.01, dtype=torch.bfloat16) for _ in range(3)]
    exact = float(torch.linalg.vector_norm(torch.cat([g.float() for g in grads])))
    assert float(grad_norm(grads)) == pytest.approx(exact, rel=1e-6)
    assert grad_norm(grads).dtype == torch.float32


@pytest.mark.parametrize(("main_grads", "moments"), [("bf16", "fp32"), ("bf16", "bf16"), ("fp32", "bf16")])
def test_trainer_paths_train_like_fp32_moments(main_grads, moments):
    reference, _ = losses(master_weights=True, main_grads=main_grads)
    trial, trainer = losses(master_weights=True, main_grads=main_grads, moments=moments)
    opt = trainer.optimizer
    assert isinstance(opt, PrecisionAwareAdamW)
    assert all(
        m.dtype == getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[moments]) for m in opt.exp_avg
    )
    assert trial[-1] < trial[0]
    assert max(abs(a - b) for a, b in zip(reference, trial, strict=True)) < 0.02


def test_bf16_moments_without_master_weights():
    trial, trainer = losses(master_weights=False, moments="bf16")
    assert isinstance(trainer.optimizer, PrecisionAwareAdamW)
    assert trainer.optimizer.targets[0] is trainer.optimizer.sources[0]
    assert trial[-1] < trial[0]


def test_moments_knob_is_validated():
    with pytest.raises(ValueError, match="moments"):
        Recipe.model_validate({"optimizer": {"moments": "fp16"}})
