"""What the trainer refuses, and how it says so (no torch needed)."""

from __future__ import annotations

import pytest
import trainer_helpers

from trainer.recipe import Recipe
from trainer.support import NotSupportedError, check_supported, unsupported


def _recipe(**overrides: object) -> Recipe:
    return Recipe.model_validate(trainer_helpers.recipe_dict(**overrides))


def test_the_tiny_recipe_is_supported():
    assert unsupported(_recipe(), world_size=2, device_type="cpu") == []


@pytest.mark.parametrize("key, value, needle", [
    ("parallel.tensor", 2, "parallel.tensor=2"),
    ("parallel.pipeline", 2, "parallel.pipeline=2"),
    ("parallel.context", 2, "parallel.context=2"),
    ("parallel.expert", 2, "parallel.expert=2"),
    ("precision", "mxfp8", "precision=mxfp8"),
    ("cross_entropy", "te", "cross_entropy=te"),
    ("model.moe.grouped_gemm", "te", "grouped_gemm=te"),
    ("model.moe.dispatcher_sms", 16, "dispatcher_sms"),
    ("training.global_batch_size", 6, "training.global_batch_size=6"),
])
def test_refusals_name_the_key(key, value, needle):
    recipe = _recipe(**{key: value})
    problems = unsupported(recipe, world_size=4, device_type="cpu")
    assert any(needle in p for p in problems), problems
    with pytest.raises(NotSupportedError, match=needle.replace(".", r"\.")):
        check_supported(recipe, world_size=4, device_type="cpu")


def test_layout_that_does_not_tile_the_world():
    problems = unsupported(_recipe(**{"parallel.data": 2}), world_size=1, device_type="cpu")
    assert any(p.startswith("parallel:") for p in problems)
