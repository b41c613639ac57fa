"""What the bundled trainer can run on this machine: each recipe knob it cannot honour, with the reason (no torch).

Called at Trainer construction with what is known of the real device (type, compute capability) and of
Transformer Engine (its import error, if any), so an impossible run fails before its first step with a
status.json reason that starts with the recipe key path. The pre-submit checks
(`trainer.recipe.launch_problems`) share `layout_problems` and `knob_problems` with this, knowing less.
"""

from __future__ import annotations

from trainer.recipe import Recipe, knob_problems, layout_problems, missing_te_problems


class NotSupportedError(NotImplementedError):
    """A recipe asks for something this trainer cannot do here; the message starts with the key path."""


def unsupported(recipe: Recipe, world_size: int, device_type: str, arch: int | None = None,
                te_error: str | None = None) -> list[str]:
    """Every `key: reason` this run cannot honour (empty = it can run).

    arch: the GPU's compute capability as major·10 + minor (None on the CPU or when unknown);
    te_error: why transformer_engine cannot be imported (None = it can, or no knob needs it).
    """
    problems = layout_problems(recipe, world_size)
    problems.extend(knob_problems(recipe, device_type, arch))
    problems.extend(missing_te_problems(recipe, te_error))
    return problems


def check_supported(recipe: Recipe, world_size: int, device_type: str, arch: int | None = None,
                    te_error: str | None = None) -> None:
    problems = unsupported(recipe, world_size, device_type, arch, te_error)
    if problems:
        raise NotSupportedError("; ".join(problems))
