"""The trainer's fused AdamW (trainer/adamw.py): torch's `AdamW(fused=True)` bit for bit, through clipped and
skipped steps and mixed-dtype groups, and a trainer process that never imports torch._dynamo for it."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
import trainer_helpers
from test_trainer_adamw_pa import CFG, fused
from torch import nn

from trainer.adamw import FusedAdamW
from trainer.optim import build_optimizer

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")),
]


def model_pair(device: str = "cpu") -> tuple[nn.Module, nn.Module]:
    """Two equal models with one bf16 layer each, so their groups hold two (device, dtype) buckets."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 4)).to(device)
    model[2].to(torch.bfloat16)
    return model, copy.deepcopy(model)


def step(model: nn.Module, opt, x: torch.Tensor, scale: float, skip: bool, lr: float) -> None:
    device = x.device
    h = model[1](model[0](x))
    model[2](h.bfloat16()).float().pow(2).mean().backward()
    for group in opt.param_groups:
        group["lr"] = lr
    opt.grad_scale = torch.tensor(scale, device=device)
    opt.found_inf = torch.tensor(1.0 if skip else 0.0, device=device)
    opt.step()
    opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("device", DEVICES)
def test_bitwise_torch_fused_adamw_through_clipped_and_skipped_steps(device: str):
    ref_model, model = model_pair(device)
    ref, opt = fused(ref_model), build_optimizer(model, CFG)
    assert isinstance(opt, FusedAdamW)
    before = [p.detach().clone() for p in model.parameters()]
    torch.manual_seed(1)
    x = torch.randn(8, 16, device=device)
    step(model, opt, x, scale=1.0, skip=True, lr=CFG.lr)
    assert all(
        torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)
    )  # a skip writes nothing
    assert all(s["step"].item() == 0 for s in opt.state.values())
    step(ref_model, ref, x, scale=1.0, skip=True, lr=CFG.lr)
    for i in range(6):
        x = torch.randn(8, 16, device=device)
        for m, o in ((ref_model, ref), (model, opt)):
            step(m, o, x, scale=1.0 + i, skip=i == 3, lr=CFG.lr / (1 + i))
    for a, b in zip(ref_model.parameters(), model.parameters(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(ref.state[a][key], opt.state[b][key]), key
    assert {s["step"].item() for s in opt.state.values()} == {5.0}  # 7 steps, 2 skipped


def test_zero_grad_without_set_to_none_keeps_zeroed_gradients():
    model, _ = model_pair()
    opt = build_optimizer(model, CFG)
    model[0](torch.randn(2, 16)).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert model[0].weight.grad is not None and not model[0].weight.grad.any()


def test_a_cpu_trainer_run_never_imports_dynamo(tmp_path):
    """torch.optim.Optimizer imports torch._dynamo on its first call (~2 s CPU per trainer process); this doesn't."""
    recipe = trainer_helpers.write_recipe(
        tmp_path / "recipe.yaml", trainer_helpers.recipe_dict(**{"training.steps": 2})
    )
    cmd = [
        sys.executable,
        "-X",
        "importtime",
        "-m",
        "trainer",
        "--recipe",
        str(recipe),
        "--out",
        str(tmp_path / "run"),
    ]
    done = subprocess.run(cmd, cwd=trainer_helpers.ROOT, env=trainer_helpers.trainer_env(), capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert trainer_helpers.status(tmp_path / "run")["state"] == "completed"
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "torch" in imported and "torch._dynamo" not in imported
