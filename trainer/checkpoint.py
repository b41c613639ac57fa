"""Checkpoints of the bundled trainer: weights and AdamW moments per expert (either expert layout loads them), RNG, data position.

`checkpoint.save_at: N` writes <run dir>/checkpoint/step-N/ after step N (global rank 0, into a temporary
directory renamed into place, so a crash leaves no half checkpoint); `checkpoint.load_from: DIR` continues
from one at step N + 1. Names of the files and directories: trainer/rundir.py. What a step directory holds:

    state.pt          torch.save of {"weights", "exp_avg", "exp_avg_sq": {name: tensor}, "optimizer_step",
                      "rng": {"cpu", "cuda"}} (plain tensors: torch.load(weights_only=True) reads it)
    checkpoint.json   format, step, data position (samples read, global batch, seed), the model's shape
                      keys and what it was saved with; written last

Layout-neutral: tensors are keyed by the parameter's name in the model with wrapper segments dropped
(full recompute's `inner`, torch.compile's `_orig_mod`), and a `single` expert weight `…experts.w1` [E, N, K]
is saved as its E slices `…experts.w1.<e>` [N, K], the names `discrete` weights have (the canonical layout is
the discrete one). Its moments are split the same way, so AdamW continues exactly in either layout. Weights are
what the optimizer updates (the fp32 master copies with master weights, else the parameters); moments in the
dtype they were kept in; loading casts to the loading run's dtypes. The data position is the step: the mock
data is a pure function of (seed, sample index), and the learning rate of the step number.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from trainer import rundir
from trainer.adamw_pa import PrecisionAwareAdamW
from trainer.master import MasterWeights
from trainer.moe import stacked_expert_weights
from trainer.parallelize import unwrap
from trainer.recipe import Recipe, model_shape

FORMAT = 1
STATE = "state.pt"
_WRAPPERS = frozenset({"inner", "_orig_mod"})  # module-name segments of wrappers, not of the model


class CheckpointError(ValueError):
    """A checkpoint this run cannot continue from; the message starts with the recipe key it is about."""


class Trained(NamedTuple):
    """What a checkpoint saves and loads into: the trainer's model, its fp32 master weights (None without), the
    optimizer and the device they live on."""

    model: nn.Module
    master: MasterWeights | None
    optimizer: Any
    device: torch.device


class Slot(NamedTuple):
    """One trained parameter as a checkpoint sees it."""

    name: str  # canonical name (wrapper segments dropped)
    param: nn.Parameter  # the model's parameter
    weight: torch.Tensor  # what the optimizer updates: the fp32 master copy, or the parameter itself
    stacked: bool  # a single [E, ...] expert weight: saved as E tensors `name.<e>`

    def names(self) -> list[str]:
        return [f"{self.name}.{e}" for e in range(self.weight.shape[0])] if self.stacked else [self.name]


def canonical_name(name: str) -> str:
    """`layers.0.inner._orig_mod.attn.qkv.weight` → `layers.0.attn.qkv.weight`."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPERS)


def slots(state: Trained) -> list[Slot]:
    """Every trained parameter of the model, in model order."""
    model = unwrap(state.model)
    masters: dict[int, torch.Tensor] = {}
    if state.master is not None:
        masters = {id(p): m for p, m in zip(state.master.params, state.master.master, strict=True)}
    stacked = stacked_expert_weights(model)
    return [Slot(canonical_name(name), p, masters.get(id(p), p), id(p) in stacked)
            for name, p in model.named_parameters() if p.requires_grad]


# ---- saving ---------------------------------------------------------------------------------------------------


def _moments(optimizer: Any, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(exp_avg, exp_avg_sq) of one optimized tensor; None before its first step."""
    if isinstance(optimizer, PrecisionAwareAdamW):
        i = next(i for i, t in enumerate(optimizer.targets) if t is weight)
        return optimizer.exp_avg[i], optimizer.exp_avg_sq[i]
    state = optimizer.state.get(weight)
    return (state["exp_avg"], state["exp_avg_sq"]) if state else None


def optimizer_step(optimizer: Any) -> float:
    """AdamW's step count t (bias correction): steps taken, skipped non-finite steps not counted."""
    if isinstance(optimizer, PrecisionAwareAdamW):
        return float(optimizer.step_count)
    return max((float(s["step"]) for s in optimizer.state.values() if "step" in s), default=0.0)


def _put(into: dict[str, torch.Tensor], slot: Slot, tensor: torch.Tensor) -> None:
    """A slot's tensor into `into` under its canonical names (a stacked one as its E slices), copied to the CPU."""
    parts = tensor.detach().unbind(0) if slot.stacked else (tensor.detach(),)
    for name, part in zip(slot.names(), parts, strict=True):
        into[name] = part.to("cpu", copy=True)


def state_dict(state: Trained) -> dict[str, Any]:
    """What state.pt holds (layout-neutral)."""
    weights: dict[str, torch.Tensor] = {}
    exp_avg: dict[str, torch.Tensor] = {}
    exp_avg_sq: dict[str, torch.Tensor] = {}
    for slot in slots(state):
        _put(weights, slot, slot.weight)
        moments = _moments(state.optimizer, slot.weight)
        if moments is not None:
            _put(exp_avg, slot, moments[0])
            _put(exp_avg_sq, slot, moments[1])
    rng = {"cpu": torch.get_rng_state()}
    if state.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(state.device)
    return {"weights": weights, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq,
            "optimizer_step": optimizer_step(state.optimizer), "rng": rng}


def meta(recipe: Recipe, global_batch: int, master_weights: bool, step: int) -> dict[str, Any]:
    """checkpoint.json: where training stands and what model the tensors fit."""
    moe = recipe.model.moe
    return {
        "format": FORMAT, "step": step, "samples": step * global_batch,
        "global_batch": global_batch, "seed": recipe.training.seed, "training_steps": recipe.training.steps,
        "model": model_shape(recipe.model), "expert_layout": "per expert (discrete names)",
        "saved_with": {"expert_weights": moe.expert_weights if moe else None, "precision": recipe.precision,
                       "master_weights": master_weights, "moments": recipe.optimizer.moments},
    }  # fmt: skip


def save(state: Trained, recipe: Recipe, global_batch: int, run_dir: Path, step: int) -> Path:
    """Write checkpoint/step-<step>/ under `run_dir` after `step` of a run of `recipe` at `global_batch` sequences
    (call on global rank 0 only; every rank holds the same state)."""
    final = rundir.checkpoint_dir(run_dir, step)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        torch.save(state_dict(state), tmp / STATE)
        rundir.write_json(tmp / rundir.CHECKPOINT_META, meta(recipe, global_batch, state.master is not None, step))
        if final.exists():  # an earlier run's in this run dir (a requeued job): replaced whole
            os.replace(final, old)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return final


# ---- loading --------------------------------------------------------------------------------------------------


def resolve(path: str | Path) -> Path:
    """The checkpoint `load_from` names: the directory itself when it holds checkpoint.json, else a run dir's
    latest complete checkpoint."""
    path = Path(path)
    if (path / rundir.CHECKPOINT_META).is_file():
        return path
    if not path.is_dir():
        raise CheckpointError(f"checkpoint.load_from: {path}: no such directory")
    steps = rundir.checkpoint_steps(path)
    if not steps:
        raise CheckpointError(f"checkpoint.load_from: {path}: no checkpoint there (neither a "
                              f"{rundir.CHECKPOINTS}/step-<N> directory with {rundir.CHECKPOINT_META} nor a run "
                              "directory holding one)")
    return rundir.checkpoint_dir(path, steps[-1])


def _first_difference(saved: dict[str, Any], ours: dict[str, Any]) -> str | None:
    for key, value in ours.items():
        if saved.get(key) != value:
            return f"model.{key} = {saved.get(key)!r} there, {value!r} here"
    return None


def load_problem(recipe: Recipe, world_size: int) -> str | None:
    """Why this recipe cannot continue from its `checkpoint.load_from` (None: it can, or loads nothing).

    Reads checkpoint.json only (no tensor), so `python -m trainer` refuses before building anything."""
    ckpt, t = recipe.checkpoint, recipe.training
    if ckpt.load_from is None:
        return None
    try:
        path = resolve(ckpt.load_from)
    except CheckpointError as err:
        return str(err)
    info = rundir.read_json(path / rundir.CHECKPOINT_META)
    if info is None or info.get("format") != FORMAT:
        return f"checkpoint.load_from: {path / rundir.CHECKPOINT_META}: unreadable, or not checkpoint format {FORMAT}"
    if difference := _first_difference(info.get("model") or {}, model_shape(recipe.model)):
        return f"checkpoint.load_from: {path} holds another model's weights ({difference})"
    step = info.get("step")
    if not isinstance(step, int) or step >= t.steps:
        return f"checkpoint.load_from: {path} is at step {step}; training.steps ({t.steps}) leaves nothing to train"
    if ckpt.save_at is not None and ckpt.save_at <= step:
        return f"checkpoint.save_at ({ckpt.save_at}) must come after the loaded checkpoint's step ({step})"
    if info.get("seed") != t.seed:
        return (f"checkpoint.load_from: {path} was saved reading the data of training.seed {info.get('seed')}; "
                f"this recipe has {t.seed}")
    try:
        global_batch = recipe.global_batch(world_size)
    except ValueError:
        return None  # the layout check says what is wrong
    if info.get("global_batch") != global_batch:
        return (f"checkpoint.load_from: {path} was saved at a global batch of {info.get('global_batch')} "
                f"sequences; this run's is {global_batch} (training.global_batch_size must match to continue "
                "the same data)")
    return None


def _take(tensors: dict[str, torch.Tensor], slot: Slot, path: Path, what: str) -> torch.Tensor | None:
    """A slot's tensor from its canonical names (stacked for a single expert weight); None when none is there."""
    names = slot.names()
    present = [n for n in names if n in tensors]
    if not present:
        return None
    if len(present) != len(names):
        missing = next(n for n in names if n not in tensors)
        raise CheckpointError(f"checkpoint.load_from: {path} has no {what} {missing}")
    parts = [tensors[n] for n in names]
    tensor = torch.stack(parts) if slot.stacked else parts[0]
    if tensor.shape != slot.weight.shape:
        raise CheckpointError(f"checkpoint.load_from: {path}: {what} {slot.name} has shape {list(tensor.shape)}, "
                              f"this model's is {list(slot.weight.shape)}")
    return tensor


def _set_moments(optimizer: Any, weight: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                 step: float) -> None:
    if isinstance(optimizer, PrecisionAwareAdamW):
        i = next(i for i, t in enumerate(optimizer.targets) if t is weight)
        optimizer.exp_avg[i].copy_(exp_avg)
        optimizer.exp_avg_sq[i].copy_(exp_avg_sq)
        return
    # FusedAdamW keeps torch's fused layout: `step` a float32 tensor on the parameter's device.
    optimizer.state[weight] = {
        "step": torch.tensor(step, dtype=torch.float32, device=weight.device),
        "exp_avg": exp_avg.to(device=weight.device, dtype=weight.dtype, copy=True),
        "exp_avg_sq": exp_avg_sq.to(device=weight.device, dtype=weight.dtype, copy=True),
    }


@torch.no_grad()
def load(state: Trained, recipe: Recipe, world_size: int) -> int:
    """Load the recipe's `checkpoint.load_from` into a freshly built trainer's state (every rank); returns the step
    it was saved after."""
    problem = load_problem(recipe, world_size)
    if problem:
        raise CheckpointError(problem)
    if recipe.checkpoint.load_from is None:
        return 0
    path = resolve(recipe.checkpoint.load_from)
    saved = torch.load(path / STATE, map_location="cpu", weights_only=True)
    step = float(saved["optimizer_step"])
    expected = set()
    for slot in slots(state):
        expected.update(slot.names())
        weight = _take(saved["weights"], slot, path, "weight")
        if weight is None:
            raise CheckpointError(f"checkpoint.load_from: {path} has no weight {slot.names()[0]}")
        slot.weight.copy_(weight)
        if slot.param is not slot.weight:  # master weights: the model's bf16 copy, as after an optimizer step
            slot.param.copy_(slot.weight)
        exp_avg = _take(saved["exp_avg"], slot, path, "exp_avg")
        exp_avg_sq = _take(saved["exp_avg_sq"], slot, path, "exp_avg_sq")
        if exp_avg is not None and exp_avg_sq is not None:
            _set_moments(state.optimizer, slot.weight, exp_avg, exp_avg_sq, step)
    if extra := sorted(set(saved["weights"]) - expected):
        raise CheckpointError(f"checkpoint.load_from: {path} holds {extra[0]}, which this model does not have")
    if isinstance(state.optimizer, PrecisionAwareAdamW):
        state.optimizer.step_count.fill_(step)
    torch.set_rng_state(saved["rng"]["cpu"])
    if state.device.type == "cuda" and "cuda" in saved["rng"]:
        torch.cuda.set_rng_state(saved["rng"]["cuda"], state.device)
    return int(rundir.read_json(path / rundir.CHECKPOINT_META)["step"])
