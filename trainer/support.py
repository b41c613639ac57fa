"""What the bundled trainer can run today: each recipe knob it cannot honour yet, with the reason (no torch)."""

from __future__ import annotations

from trainer.recipe import SUPPORTED_PARALLEL, Recipe


class NotSupportedError(NotImplementedError):
    """A recipe asks for something this trainer does not implement (yet); the message names the key."""


def unsupported(recipe: Recipe, world_size: int, device_type: str) -> list[str]:
    """Every `key: reason` this run cannot honour (empty = it can run)."""
    problems: list[str] = []
    p = recipe.parallel
    for name, only in SUPPORTED_PARALLEL.items():
        if getattr(p, name) != only:
            problems.append(f"parallel.{name}={getattr(p, name)}: only {only} is implemented (data parallel only)")
    if p.expert != 1:
        problems.append(f"parallel.expert={p.expert}: expert parallelism is not implemented yet; use 1")
    try:
        dp = recipe.data_parallel_size(world_size)
        t = recipe.training
        if t.global_batch_size is not None and t.global_batch_size % (t.micro_batch_size * dp):
            problems.append(f"training.global_batch_size={t.global_batch_size}: not divisible by "
                            f"micro_batch_size × DP = {t.micro_batch_size} × {dp}")
    except ValueError as err:
        problems.append(f"parallel: {err}")
    if recipe.precision in ("fp8", "mxfp8", "nvfp4"):
        problems.append(f"precision={recipe.precision}: not implemented yet (needs Transformer Engine)")
    if recipe.cross_entropy == "te":
        problems.append("cross_entropy=te: not implemented yet (use native or fused)")
    moe = recipe.model.moe
    if moe is not None:
        if moe.grouped_gemm == "te":
            problems.append("model.moe.grouped_gemm=te: not implemented yet (use torch or loop)")
        if moe.dispatcher_sms is not None:
            problems.append("model.moe.dispatcher_sms: green-context dispatch is not implemented yet")
    return problems


def check_supported(recipe: Recipe, world_size: int, device_type: str) -> None:
    problems = unsupported(recipe, world_size, device_type)
    if problems:
        raise NotSupportedError("; ".join(problems))
