"""Transformer Engine behind import guards: which TE path a recipe takes, clear errors without TE, the TE modules.

Importing the trainer never imports transformer_engine; only a recipe that asks for a TE knob does, at
Trainer construction. The knobs:
- `precision: fp8` (Hopper/Ada) with `fp8_recipe` current → Float8CurrentScaling, delayed → DelayedScaling,
  block → Float8BlockScaling; `precision: mxfp8` → MXFP8BlockScaling and `nvfp4` → NVFP4BlockScaling
  (Blackwell, sm_100+). The transformer blocks' dense linear layers (QKV, attention output, dense and
  shared-expert MLPs) become `te.Linear` and the forward runs under `te.autocast` (`te.fp8_autocast` in
  TE releases before it); the output layer stays bf16, as in Megatron. The routed experts run in the
  quantized format only with `grouped_gemm: te`.
- `model.moe.grouped_gemm: te`: the expert MLPs become two `te.GroupedLinear` (one GEMM per expert inside
  TE, group sizes on the host: a sync per layer unless `pad_to_capacity` makes them static).
- `cross_entropy: te`: TE's `parallel_cross_entropy` (a Triton kernel over bf16 logits, fp32 math).

What the machine must offer (a CUDA GPU, its compute capability, TE importable) is checked at Trainer
construction by `trainer.support.unsupported`, which takes the device type, capability and TE's import
error as parameters (so it is tested on a CPU without TE); `select_paths` picks the implementations from
the recipe alone, and the module swaps take the TE classes as parameters for the same reason.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

from trainer.recipe import QUANTIZED_PRECISIONS, TE_INSTALL, Recipe, te_knobs
from trainer.support import NotSupportedError

INSTALL = TE_INSTALL

# (precision, fp8_recipe) → transformer_engine.common.recipe class
QUANT_RECIPES = {
    ("fp8", "current"): "Float8CurrentScaling",
    ("fp8", "delayed"): "DelayedScaling",
    ("fp8", "block"): "Float8BlockScaling",
    ("mxfp8", None): "MXFP8BlockScaling",
    ("nvfp4", None): "NVFP4BlockScaling",
}


def te_version() -> str | None:
    """TE's version from its package metadata, without importing it (None when not installed).

    Importing `transformer_engine` is not free: its top-level package imports `transformer_engine.pytorch`
    (which loads cuDNN, NVRTC and cuRAND by its own search, with RTLD_GLOBAL) and `jax` when JAX is
    installed. A run that only records TE's version must not pay that: see `import_te`.
    """
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("transformer_engine", "transformer-engine-cu13", "transformer-engine-cu12"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def te_library_env(purelib: str | os.PathLike, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables that make TE's library loader pick the CUDA libraries torch itself loads.

    `transformer_engine.common` looks for cuDNN, NVRTC and cuRAND first under $<LIB>_HOME, $<LIB>_PATH,
    $CUDA_HOME, $CUDA_PATH and /usr/local/cuda (recursively, the highest-sorting file name wins), and only
    then among the pip `nvidia` packages torch uses; it loads what it finds with RTLD_GLOBAL before torch
    has loaded its own copy of NVRTC or cuDNN's sub-libraries. On an image with a CUDA toolkit that can put
    a second, different copy in the process. Naming torch's pip folders in <LIB>_HOME makes TE find the
    same files torch uses. Variables already set are kept (the user's choice); folders that do not exist
    are not named.
    """
    env = os.environ if environ is None else environ
    nvidia = Path(purelib) / "nvidia"
    candidates = {
        "CUDNN_HOME": [nvidia / "cudnn"],
        "NVRTC_HOME": [nvidia / "cu13", nvidia / "cuda_nvrtc", nvidia / "cu12"],
        "CURAND_HOME": [nvidia / "cu13", nvidia / "curand", nvidia / "cu12"],
    }
    names = {"CUDNN_HOME": "libcudnn.so*", "NVRTC_HOME": "libnvrtc.so*", "CURAND_HOME": "libcurand.so*"}
    chosen: dict[str, str] = {}
    for var, folders in candidates.items():
        if env.get(var):
            continue
        for folder in folders:
            if folder.is_dir() and any(folder.glob(f"**/{names[var]}")):
                chosen[var] = str(folder)
                break
    return chosen


def torch_cudnn_libraries(purelib: str | os.PathLike) -> list[Path]:
    """torch's own cuDNN libraries (the shim and every sub-library), shim first; [] when torch has none."""
    lib = Path(purelib) / "nvidia" / "cudnn" / "lib"
    found = sorted(lib.glob("libcudnn*.so.[0-9]*")) if lib.is_dir() else []
    return sorted(found, key=lambda path: (not path.name.startswith("libcudnn.so"), path.name))


def preload_torch_cudnn(purelib: str | os.PathLike, load: Callable[[str], Any] | None = None) -> list[str]:
    """Load torch's cuDNN libraries with RTLD_GLOBAL before TE loads its core library.

    libtransformer_engine.so needs libcudnn_graph.so.9, libcudnn_ops.so.9, ... by soname and has no RUNPATH:
    unless those sonames are already loaded, the dynamic loader takes them from the system's library
    path, and on the H200 image that is an older cuDNN (9.14) than torch's (9.19). Torch then refuses
    cuDNN ("cuDNN version incompatibility"), and SDPA silently leaves the cuDNN attention kernels: the
    MoE proxy ran 8% slower (issue 15). Loading torch's copies first makes every soname resolve to them.
    """
    import ctypes

    if load is None:
        def load(path: str) -> Any:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)

    loaded = []
    for path in torch_cudnn_libraries(purelib):
        try:
            load(str(path))
            loaded.append(path.name)
        except OSError:
            continue
    return loaded


def import_te(keep_jax_out: bool = True) -> Any:
    """`transformer_engine.pytorch`, imported so that it leaves torch's kernels alone.

    Names torch's own CUDA libraries to TE's loader (`te_library_env`) and, unless JAX is already
    imported, keeps `transformer_engine.jax` out (TE's top-level package imports it when JAX is installed;
    a `None` entry in sys.modules makes that import fail the way TE's top-level package expects). Raises
    what the import raises.
    """
    import sysconfig

    purelib = sysconfig.get_path("purelib")
    for var, value in te_library_env(purelib).items():
        os.environ.setdefault(var, value)
    preload_torch_cudnn(purelib)
    if keep_jax_out and "jax" not in sys.modules:
        sys.modules.setdefault("transformer_engine.jax", None)  # type: ignore[arg-type]
    import transformer_engine.pytorch as te

    return te


def te_import_error() -> str | None:
    """None when `transformer_engine.pytorch` imports here, else why not (one line)."""
    try:
        import_te()
    except Exception as err:  # noqa: BLE001 (absent, or present but broken: either way unusable)
        return f"{type(err).__name__}: {err}".splitlines()[0]
    return None


@dataclass(frozen=True)
class TEPaths:
    """Which implementation each TE-able part of the model takes."""

    dense_linear: str  # "torch" (nn.Linear) | "te" (te.Linear under te.autocast)
    experts: str  # "torch" (grouped_mm) | "loop" | "te" (te.GroupedLinear)
    cross_entropy: str  # "native" | "fused" | "te"
    quant_recipe: str | None  # transformer_engine.common.recipe class name, None = no quantized GEMMs
    expert_wgrad: str = "torch"  # grouped_mm experts' weight gradient: "torch" | "te" (grouped GEMM, accumulate)
    fuse_wgrad: bool = False  # TE layers built with fuse_wgrad_accumulation (optimizer.grad_accumulation_fusion)
    knobs: tuple[str, ...] = ()  # the recipe's `key: value` settings that chose TE (te_knobs), named in errors

    @property
    def uses_te(self) -> bool:
        return "te" in (self.dense_linear, self.experts, self.cross_entropy, self.expert_wgrad)


def select_paths(recipe: Recipe) -> TEPaths:
    """The implementation of each part for this recipe (assumes its problems were checked: `support`)."""
    quantized = recipe.precision in QUANTIZED_PRECISIONS
    quant = None
    if quantized:
        quant = QUANT_RECIPES[(recipe.precision, recipe.fp8_recipe if recipe.precision == "fp8" else None)]
    moe = recipe.model.moe
    return TEPaths(
        dense_linear="te" if quantized else "torch",
        experts=moe.grouped_gemm if moe is not None else "torch",
        cross_entropy=recipe.cross_entropy,
        quant_recipe=quant,
        expert_wgrad=moe.expert_wgrad if moe is not None else "torch",
        fuse_wgrad=recipe.optimizer.grad_accumulation_fusion,
        knobs=tuple(te_knobs(recipe)),
    )


def require_te(knob: str) -> Any:
    """transformer_engine.pytorch, or NotSupportedError naming the knob and the install command."""
    try:
        te = import_te()
    except Exception as err:  # noqa: BLE001
        raise NotSupportedError(f"{knob} needs Transformer Engine, which cannot be imported here "
                                f"({type(err).__name__}: {err}): {INSTALL}") from err
    return te


def make_quant_recipe(name: str, recipe_module: Any) -> Any:
    """An instance of transformer_engine.common.recipe.<name> with TE's defaults (HYBRID format for fp8)."""
    cls = getattr(recipe_module, name, None)
    if cls is None:
        raise NotSupportedError(f"precision: this Transformer Engine has no {name} recipe (too old?): {INSTALL}")
    return cls()


def te_autocast(te: Any, quant_recipe: Any) -> contextlib.AbstractContextManager:
    """`te.autocast(enabled=True, recipe=...)` (TE ≥ 2.17), else the older `te.fp8_autocast(fp8_recipe=...)`."""
    autocast = getattr(te, "autocast", None)
    if autocast is not None:
        return autocast(enabled=True, recipe=quant_recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=quant_recipe)


@functools.cache
def te_cross_entropy() -> Callable:
    """TE's parallel_cross_entropy(logits [B, S, V], targets [B, S], label_smoothing, reduce_loss, group)."""
    require_te("cross_entropy: te")
    try:
        from transformer_engine.pytorch.cross_entropy import parallel_cross_entropy
    except ImportError:
        from transformer_engine.pytorch import parallel_cross_entropy
    return parallel_cross_entropy


# ---------------------------------------------------------------------------------------------
# Module swaps (the TE classes come in as parameters).
# ---------------------------------------------------------------------------------------------


def swap_linears(model: Any, make_linear: Callable[[int, int], Any]) -> int:
    """Replace every nn.Linear inside the transformer blocks by make_linear(in, out) holding the same weight.

    The output layer (logits) is left alone. Returns how many were replaced.
    """
    import torch
    from torch import nn

    replaced = 0
    for block in model.layers:
        for parent in list(block.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear and child.bias is None:
                    new = make_linear(child.in_features, child.out_features)
                    with torch.no_grad():
                        new.weight.copy_(child.weight)
                    setattr(parent, name, new)
                    replaced += 1
    return replaced


def te_linear_factory(te: Any, device: Any, dtype: Any, fuse_wgrad: bool = False) -> Callable[[int, int], Any]:
    """make_linear for swap_linears: te.Linear without bias on `device` (accumulating dW into main_grad)."""
    return lambda fan_in, fan_out: te.Linear(fan_in, fan_out, bias=False, params_dtype=dtype, device=device,
                                             **_fuse_kwargs(fuse_wgrad))


def _fuse_kwargs(fuse_wgrad: bool) -> dict[str, bool]:
    return {"fuse_wgrad_accumulation": True} if fuse_wgrad else {}


def use_te_experts(model: Any, grouped_linear_cls: Any, device: Any) -> int:
    """Replace the expert MLPs of every MoE layer by GroupedLinearExperts on `grouped_linear_cls`."""
    from trainer.moe import GroupedLinearExperts, MoELayer

    replaced = 0
    for module in model.modules():
        if isinstance(module, MoELayer):
            module.experts = GroupedLinearExperts(module.experts, grouped_linear_cls, device)
            replaced += 1
    return replaced


@dataclass
class TERuntime:
    """What the trainer needs at run time: the paths taken and the context the forward runs under."""

    paths: TEPaths
    quant_recipe: Any = None
    te: Any = None

    def forward_context(self) -> contextlib.AbstractContextManager:
        """te.autocast around the forward when GEMMs are quantized; nothing otherwise."""
        if self.quant_recipe is None:
            return contextlib.nullcontext()
        return te_autocast(self.te, self.quant_recipe)

    def describe(self) -> str:
        p = self.paths
        parts = []
        if p.quant_recipe:
            parts.append(f"TE {p.quant_recipe} for the block linears" + (" and experts" if p.experts == "te" else ""))
        if p.experts == "te":
            parts.append("TE GroupedLinear experts")
        if p.cross_entropy == "te":
            parts.append("TE parallel cross entropy")
        return ", ".join(parts)


def prepare_model(model: Any, paths: TEPaths, device: Any) -> TERuntime:
    """Swap in the TE modules of `paths` (`select_paths` of the recipe; before master weights are taken) and return
    the runtime."""
    if not paths.uses_te:
        return TERuntime(paths)
    import torch

    te = require_te(paths.knobs[0])
    version = getattr(import_module("transformer_engine"), "__version__", "unknown")
    dtype = torch.float32  # master-weight set-up casts to bf16 afterwards, as for the torch modules
    if paths.expert_wgrad == "te":
        # TE's CUTLASS grouped GEMM on Hopper (else one cuBLAS GEMM per expert on several streams).
        os.environ.setdefault("NVTE_USE_CUTLASS_GROUPED_GEMM", "1")
        from trainer.grad_accum import check_te_accumulate

        try:
            check_te_accumulate(torch.device(device))
        except Exception as err:  # noqa: BLE001 (a TE whose grouped GEMM call this code does not know)
            raise NotSupportedError(f"model.moe.expert_wgrad: te: transformer_engine {version}'s grouped GEMM with "
                                    f"accumulate failed a check against torch's: {type(err).__name__}: {err}") from err
    if paths.experts == "te":
        try:
            use_te_experts(model, functools.partial(te.GroupedLinear, **_fuse_kwargs(paths.fuse_wgrad)), device)
        except Exception as err:  # noqa: BLE001 (an interface this code does not know: say so before training)
            raise NotSupportedError(f"model.moe.grouped_gemm: te: could not build TE GroupedLinear experts with "
                                    f"transformer_engine {version}: {type(err).__name__}: {err}") from err
    quant = None
    if paths.dense_linear == "te":
        try:
            swap_linears(model, te_linear_factory(te, device, dtype, paths.fuse_wgrad))
            from transformer_engine.common import recipe as te_recipe
        except Exception as err:  # noqa: BLE001
            raise NotSupportedError(f"{paths.knobs[0]}: could not build TE Linear layers with "
                                    f"transformer_engine {version}: {type(err).__name__}: {err}") from err
        quant = make_quant_recipe(paths.quant_recipe, te_recipe)
    return TERuntime(paths, quant, te)
