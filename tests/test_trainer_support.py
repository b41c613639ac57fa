"""What the trainer refuses, and how it says so: parallel layouts, TE knobs, green contexts (CPU-side checks)."""

from __future__ import annotations

import inspect
import re
import types

import pytest
import torch
import trainer_helpers
from pydantic import BaseModel, ValidationError

from trainer import green, te_support
from trainer.distributed import Dist
from trainer.loop import Trainer
from trainer.loss import cross_entropy
from trainer.recipe import Recipe, arch_number, knob_problems, launch_problems
from trainer.support import NotSupportedError, check_supported, unsupported

CPU = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
TE_MISSING = "ModuleNotFoundError: No module named 'transformer_engine'"


def _recipe(**overrides: object) -> Recipe:
    return Recipe.model_validate(trainer_helpers.recipe_dict(**overrides))


def _key_path_exists(path: str) -> bool:
    """Whether a dotted path names a field of the recipe schema (parallel.tensor, model.moe.dispatcher_sms)."""
    node: type[BaseModel] | None = Recipe
    for part in path.split("."):
        if node is None or part not in node.model_fields:
            return False
        annotation = node.model_fields[part].annotation
        node = next((a for a in getattr(annotation, "__args__", (annotation,))
                     if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return True


def _assert_key_paths(problems: list[str]) -> None:
    for problem in problems:
        key = re.match(r"[\w.]+", problem).group(0)
        assert _key_path_exists(key), f"{problem!r} does not start with a recipe key path"


def test_the_tiny_recipe_is_supported():
    assert unsupported(_recipe(), world_size=2, device_type="cpu") == []


@pytest.mark.parametrize("key, value, needle", [
    ("parallel.tensor", 2, "parallel.tensor: the bundled trainer supports only tensor = 1 (got 2)"),
    ("parallel.pipeline", 2, "parallel.pipeline: the bundled trainer supports only pipeline = 1"),
    ("parallel.context", 2, "parallel.context: the bundled trainer supports only context = 1"),
    ("precision", "mxfp8", "precision: mxfp8 runs Transformer Engine GEMMs on a CUDA GPU"),
    ("precision", "fp8", "precision: fp8 runs Transformer Engine GEMMs on a CUDA GPU"),
    ("cross_entropy", "te", "cross_entropy: te (Transformer Engine parallel_cross_entropy) needs a CUDA GPU"),
    ("model.moe.grouped_gemm", "te", "model.moe.grouped_gemm: te (Transformer Engine GroupedLinear) needs a CUDA"),
    ("model.moe.dispatcher_sms", 16, "model.moe.dispatcher_sms: green contexts need a CUDA GPU"),
    ("training.global_batch_size", 6, "training.global_batch_size: 6 is not divisible"),
])
def test_refusals_name_the_key(key, value, needle):
    recipe = _recipe(**{key: value})
    problems = unsupported(recipe, world_size=4 if key != "training.global_batch_size" else 2, device_type="cpu")
    assert any(p.startswith(needle) for p in problems), problems
    with pytest.raises(NotSupportedError, match=re.escape(needle)):
        check_supported(recipe, world_size=4, device_type="cpu")


def test_layout_that_does_not_tile_the_world():
    problems = unsupported(_recipe(**{"parallel.data": 2}), world_size=1, device_type="cpu")
    assert any(p.startswith("parallel:") for p in problems)


def test_trainer_and_pre_submit_checks_say_the_same_about_the_layout():
    recipe = _recipe(**{"parallel.tensor": 2, "training.global_batch_size": 6})
    layout = [p for p in launch_problems(recipe, 4) if p.startswith(("parallel", "training"))]
    assert layout and layout == [p for p in unsupported(recipe, 4, "cpu") if p.startswith(("parallel", "training"))]


# ---------------------------------------------------------------------------------------------
# Transformer Engine: capability and availability come in as parameters.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, arch, needle", [
    ({"precision": "fp8"}, 80, "precision: fp8 needs an FP8 GPU (Ada/Hopper, sm_89+)"),
    ({"precision": "fp8", "fp8_recipe": "block"}, 89, "fp8_recipe: block (Float8BlockScaling) needs Hopper"),
    ({"precision": "mxfp8"}, 90, "precision: mxfp8 needs a Blackwell GPU (sm_100+)"),
    ({"precision": "nvfp4"}, 90, "precision: nvfp4 needs a Blackwell GPU (sm_100+)"),
])
def test_quantized_precision_needs_the_right_gpu(overrides, arch, needle):
    recipe = _gpu_recipe(**overrides)
    problems = unsupported(recipe, 1, "cuda", arch=arch)
    assert any(p.startswith(needle) for p in problems), problems
    assert unsupported(recipe, 1, "cuda", arch=100) == []  # Blackwell runs every mode
    _assert_key_paths(problems)


def _gpu_recipe(**overrides: object) -> Recipe:
    """A recipe whose GEMM sizes suit TE's FP8 alignment (multiples of 32), on an unspecified device."""
    data = trainer_helpers.recipe_dict(**{"model.hidden_size": 64, "model.ffn_hidden_size": 128,
                                          "model.moe.ffn_hidden_size": 64, "device": "auto",
                                          "training.global_batch_size": 2, **overrides})
    return Recipe.model_validate(data)


def test_fp8_on_hopper_with_te_is_fine_and_without_te_names_every_knob():
    recipe = _gpu_recipe(precision="fp8", cross_entropy="te")
    assert unsupported(recipe, 1, "cuda", arch=90) == []
    problems = unsupported(recipe, 1, "cuda", arch=90, te_error=TE_MISSING)
    assert problems == [
        f"precision: fp8 needs Transformer Engine, which cannot be imported here ({TE_MISSING}): "
        "pip install transformer-engine[pytorch]",
        f"cross_entropy: te needs Transformer Engine, which cannot be imported here ({TE_MISSING}): "
        "pip install transformer-engine[pytorch]",
    ]


def test_te_is_not_installed_here_and_the_error_says_what_to_do():
    assert te_support.te_import_error() is not None  # CI has no Transformer Engine
    with pytest.raises(NotSupportedError, match=re.escape("cross_entropy: te needs Transformer Engine") + ".*"
                       + re.escape("pip install transformer-engine[pytorch]")):
        te_support.require_te("cross_entropy: te")
    with pytest.raises(NotSupportedError, match="cross_entropy: te needs Transformer Engine"):
        cross_entropy(torch.randn(1, 4, 8), torch.randn(16, 8), torch.zeros(1, 4, dtype=torch.long), "te")


@pytest.mark.parametrize("overrides, paths", [
    ({}, ("torch", "torch", "native", None)),
    ({"precision": "fp8"}, ("te", "torch", "native", "Float8CurrentScaling")),
    ({"precision": "fp8", "fp8_recipe": "delayed"}, ("te", "torch", "native", "DelayedScaling")),
    ({"precision": "fp8", "fp8_recipe": "block"}, ("te", "torch", "native", "Float8BlockScaling")),
    ({"precision": "mxfp8"}, ("te", "torch", "native", "MXFP8BlockScaling")),
    ({"precision": "nvfp4", "fp8_recipe": "delayed"}, ("te", "torch", "native", "NVFP4BlockScaling")),
    ({"model.moe.grouped_gemm": "te"}, ("torch", "te", "native", None)),
    ({"model.moe.grouped_gemm": "loop", "cross_entropy": "te"}, ("torch", "loop", "te", None)),
    ({"cross_entropy": "fused"}, ("torch", "torch", "fused", None)),
])
def test_te_paths_are_selected_from_the_recipe(overrides, paths):
    selected = te_support.select_paths(_gpu_recipe(**overrides))
    assert (selected.dense_linear, selected.experts, selected.cross_entropy, selected.quant_recipe) == paths
    assert selected.uses_te == ("te" in paths)


def test_a_bf16_recipe_never_touches_te():
    paths = te_support.select_paths(_recipe())
    runtime = te_support.prepare_model(object(), paths, torch.device("cpu"))  # no model walk, no import
    assert runtime.te is None and runtime.quant_recipe is None
    assert isinstance(runtime.forward_context(), type(te_support.contextlib.nullcontext()))


def test_te_autocast_and_recipes_follow_the_installed_api():
    calls = []
    new_te = types.SimpleNamespace(autocast=lambda **kw: calls.append(("autocast", kw)) or "ctx")
    old_te = types.SimpleNamespace(fp8_autocast=lambda **kw: calls.append(("fp8_autocast", kw)) or "ctx")
    assert te_support.te_autocast(new_te, "R") == "ctx" and te_support.te_autocast(old_te, "R") == "ctx"
    assert calls == [("autocast", {"enabled": True, "recipe": "R"}),
                     ("fp8_autocast", {"enabled": True, "fp8_recipe": "R"})]

    class Float8CurrentScaling:  # what transformer_engine.common.recipe holds, by name
        pass

    module = types.SimpleNamespace(Float8CurrentScaling=Float8CurrentScaling)
    assert isinstance(te_support.make_quant_recipe("Float8CurrentScaling", module), Float8CurrentScaling)
    with pytest.raises(NotSupportedError, match="no NVFP4BlockScaling recipe"):
        te_support.make_quant_recipe("NVFP4BlockScaling", module)


def test_swapping_the_block_linears_keeps_the_model():
    from trainer.model import GPT

    class OtherLinear(torch.nn.Linear):  # stands for te.Linear: same maths, another class
        def __init__(self, fan_in: int, fan_out: int):
            super().__init__(fan_in, fan_out, bias=False)

    cfg = _recipe().model
    torch.manual_seed(0)
    model = GPT(cfg, seq_length=16, padded_vocab_size=256)
    rows = torch.randint(0, 200, (2, 17), generator=torch.Generator().manual_seed(1))
    before = model(rows[:, :-1], rows[:, 1:]).loss
    # per layer: qkv + out; the dense layer's MLP up + down; the MoE layer's shared expert up + down
    assert te_support.swap_linears(model, OtherLinear) == 2 * 2 + 2 + 2
    assert type(model.output) is torch.nn.Linear  # the logits GEMM stays as it is
    assert sum(isinstance(m, OtherLinear) for m in model.modules()) == 8
    assert torch.equal(model(rows[:, :-1], rows[:, 1:]).loss, before)


# ---------------------------------------------------------------------------------------------
# Pre-submit checks: what the recipe alone says.
# ---------------------------------------------------------------------------------------------


def test_launch_problems_know_the_static_knob_limits():
    assert launch_problems(_gpu_recipe(precision="fp8"), 1, gpu_arch="sm_90") == []
    assert launch_problems(_gpu_recipe(precision="fp8"), 1) == []  # no arch given: nothing to hold against it
    assert launch_problems(_gpu_recipe(precision="fp8"), 1, gpu_arch="sm_80") == [
        "precision: fp8 needs an FP8 GPU (Ada/Hopper, sm_89+); the target GPU is sm_80"]
    assert launch_problems(_gpu_recipe(precision="mxfp8"), 1, gpu_arch="sm_90a") == [
        "precision: mxfp8 needs a Blackwell GPU (sm_100+); the target GPU is sm_90a"]
    assert launch_problems(_gpu_recipe(precision="mxfp8"), 1, gpu_arch="sm_120") == []
    on_cpu = launch_problems(_gpu_recipe(**{"device": "cpu", "precision": "fp8", "cross_entropy": "te",
                                            "model.moe.grouped_gemm": "te", "model.moe.dispatcher_sms": 8,
                                            "model.moe.capacity_factor": 2.0, "model.moe.pad_to_capacity": True}), 1)
    assert [p.split(":")[0] for p in on_cpu] == ["precision", "cross_entropy", "model.moe.grouped_gemm",
                                                 "model.moe.dispatcher_sms"]
    _assert_key_paths(on_cpu)


def test_launch_problems_check_te_fp8_alignment():
    # TINY_MOE: hidden 32, ffn 64, expert ffn 32, 4 q heads × 8: query size 32, kv size 16 → fine for fp8 (16)
    assert launch_problems(_recipe(device="auto", precision="fp8"), 2) == []
    odd = launch_problems(_recipe(**{"device": "auto", "precision": "fp8", "model.hidden_size": 40,
                                     "model.head_dim": 8}), 2)
    assert odd == ["precision: fp8 (Transformer Engine) needs model.hidden_size divisible by 16 (got 40)"]
    mx = launch_problems(_recipe(device="auto", precision="mxfp8"), 2, gpu_arch="sm_100")
    assert "precision: mxfp8 (Transformer Engine) needs model.hidden_size divisible by 32 (got 32)" not in mx
    assert any("key/value size" in p and "divisible by 32 (got 16)" in p for p in mx)


def test_te_experts_in_fp8_need_padded_group_sizes():
    base = {"device": "auto", "precision": "fp8", "model.moe.grouped_gemm": "te"}
    dropless = launch_problems(_recipe(**base), 2)
    assert len(dropless) == 1 and dropless[0].startswith("model.moe.grouped_gemm: te under precision fp8 needs")
    assert "dropless" in dropless[0]
    # 32 tokens × top-2 / 4 experts × 1.0 = capacity 16: aligned
    padded = {**base, "model.moe.capacity_factor": 1.0, "model.moe.pad_to_capacity": True}
    assert launch_problems(_recipe(**padded), 2) == []
    # chunks of 24 + 8 tokens: capacities 12 and 4 are not
    chunked = launch_problems(_recipe(**padded, **{"model.moe.dispatch_chunk_tokens": 24}), 2)
    assert len(chunked) == 1 and "capacity [4, 12]" in chunked[0]


def test_contradictory_knobs_fail_validation():
    with pytest.raises(ValidationError, match="dispatcher_sms needs dispatch_overlap"):
        _recipe(**{"model.moe.dispatcher_sms": 16, "model.moe.dispatch_overlap": False})
    with pytest.raises(ValidationError, match="recompute_modules applies only with recompute: selective"):
        _recipe(recompute="full", recompute_modules=["moe_act"])
    with pytest.raises(ValidationError, match="without repeats"):
        _recipe(recompute="selective", recompute_modules=["moe_act", "moe_act"])
    assert _recipe(recompute="selective").selective_modules() == {"core_attn", "moe_act", "moe_dispatch"}
    assert _recipe(recompute="selective", recompute_modules=["core_attn"]).selective_modules() == {"core_attn"}
    assert _recipe(recompute="full").selective_modules() == frozenset()


def test_arch_numbers():
    assert [arch_number(a) for a in ("sm_90", "sm_90a", "9.0", "sm_100", "sm_120f", "89")] == [90, 90, 90, 100, 120, 89]
    assert arch_number((9, 0)) == 90
    assert knob_problems(_recipe(), None, None) == []


# ---------------------------------------------------------------------------------------------
# Green contexts: API detection against stand-in classes of each torch release's shape.
# ---------------------------------------------------------------------------------------------


class KeywordAPI:  # torch 2.13: create(*, num_sms=None, workqueue_scope=None, ..., device_id=None)
    made: list = []

    @staticmethod
    def create(*, num_sms=None, workqueue_scope=None, workqueue_concurrency_limit=None, device_id=None):
        KeywordAPI.made.append(("keyword", num_sms, device_id))
        return types.SimpleNamespace(Stream=lambda: "green stream")


class PositionalAPI:  # torch 2.11: create(num_sms, device_id=0)
    made: list = []

    @staticmethod
    def create(num_sms, device_id=0):
        PositionalAPI.made.append(("positional", num_sms, device_id))
        return types.SimpleNamespace(Stream=lambda: "green stream")


class ConstructorAPI:  # a later release may construct one
    made: list = []

    def __init__(self, *, num_sms, device_id=None):
        ConstructorAPI.made.append(("constructor", num_sms, device_id))

    def stream(self):
        return "green stream"


class _NoSignature:
    """A C builtin: inspect.signature cannot read it; keyword-only when called."""

    @property
    def __signature__(self):
        raise ValueError("no signature found for builtin")

    def __call__(self, *args, **kwargs):
        if args:
            raise TypeError("create() takes no positional arguments")
        return ("builtin", kwargs["num_sms"], kwargs["device_id"])


class BuiltinAPI:
    create = _NoSignature()


def test_green_context_api_detection():
    assert green.detect_api(KeywordAPI) == "keyword"
    assert green.detect_api(PositionalAPI) == "positional"
    assert green.detect_api(ConstructorAPI) == "constructor"
    assert green.detect_api(BuiltinAPI) == "unknown"
    assert green.detect_api(object()) is None
    from torch.cuda.green_contexts import GreenContext

    # this torch (2.13) is keyword-only; the H200's 2.11 is positional
    expected = "keyword" if inspect.signature(GreenContext.create).parameters["num_sms"].kind is \
        inspect.Parameter.KEYWORD_ONLY else "positional"
    assert green.detect_api(GreenContext) == expected


@pytest.mark.parametrize("api", [KeywordAPI, PositionalAPI, ConstructorAPI])
def test_green_context_is_created_through_the_detected_api(api):
    api.made.clear()
    context = green.create_green_context(api, 16, 3)
    assert api.made == [(green.detect_api(api), 16, 3)]
    assert green.context_stream(context) == "green stream"


def test_green_context_builtin_create_tries_keywords():
    assert green.create_green_context(BuiltinAPI, 8, 0) == ("builtin", 8, 0)
    with pytest.raises(TypeError, match="no known way"):
        green.create_green_context(object(), 8, 0)


def test_green_context_refused_without_a_gpu():
    with pytest.raises(NotSupportedError, match=r"model\.moe\.dispatcher_sms=16: green contexts need a CUDA GPU"):
        green.dispatcher_stream(16, torch.device("cpu"))
    with pytest.raises(NotSupportedError, match=r"model\.moe\.dispatcher_sms=8: green contexts need a CUDA GPU"):
        green.dispatcher_stream(8, torch.device("cuda", 0))  # this machine has no CUDA


def test_trainer_refuses_gpu_only_knobs_before_building_anything():
    for key, value in (("model.moe.dispatcher_sms", 16), ("precision", "fp8"), ("cross_entropy", "te"),
                       ("model.moe.grouped_gemm", "te")):
        recipe = _recipe(**{key: value})
        with pytest.raises(NotSupportedError, match="^" + re.escape(key)):
            Trainer(recipe, CPU, log=lambda line: None)


def test_full_recompute_with_a_dispatcher_stream_is_refused_on_gpu():
    chunked = {"recompute": "full", "model.moe.dispatch_chunk_tokens": 8, "device": "auto"}
    problems = unsupported(_recipe(**chunked), world_size=1, device_type="cuda", arch=90)
    assert any(p.startswith("recompute: full would recompute each MoE layer on the dispatcher stream")
               for p in problems), problems
    assert unsupported(_recipe(**chunked, **{"model.moe.dispatch_overlap": False}), world_size=1,
                       device_type="cuda", arch=90) == []
    assert unsupported(_recipe(**chunked), world_size=1, device_type="cpu") == []  # no streams on the CPU
