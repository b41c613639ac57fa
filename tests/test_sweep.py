"""Sweep expansion: product, zip groups, explicit cells, exclusions, repeats and stable cell ids."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import TINY_MOE_RECIPE

from orchestrator.errors import ConfigError
from orchestrator.spec.campaign import Campaign
from orchestrator.trainers import expand

GOLDEN = Path(__file__).parent / "golden" / "expansion.json"


def campaign(sweep: dict, **over) -> Campaign:
    data = {"name": "t", "trainer": {"recipe": copy.deepcopy(TINY_MOE_RECIPE)}, "sweep": sweep}
    data.update(over)
    return Campaign.model_validate(data)


def test_product_of_axes_in_order():
    points = expand(
        campaign({"axes": {"model.moe.top_k": [1, 2], "model.moe.capacity_factor": [1.0, 1.5, None]}})
    )
    assert [(p.params["model.moe.top_k"], p.params["model.moe.capacity_factor"]) for p in points] == [
        (1, 1.0), (1, 1.5), (1, None), (2, 1.0), (2, 1.5), (2, None),
    ]  # fmt: skip
    assert points[0].recipe["model"]["moe"]["top_k"] == 1
    assert points[0].label == "top_k=1, capacity_factor=1.0"


def test_zip_group_varies_together_and_multiplies_with_axes():
    points = expand(
        campaign(
            {
                "axes": {"model.moe.top_k": [1, 2]},
                "zip": [{"model.hidden_size": [32, 64], "model.num_attention_heads": [2, 4]}],
            }
        )
    )
    pairs = {(p.recipe["model"]["hidden_size"], p.recipe["model"]["num_attention_heads"]) for p in points}
    assert pairs == {(32, 2), (64, 4)}
    assert len(points) == 4


def test_explicit_cells_exclusions_and_dedup():
    points = expand(
        campaign(
            {
                "axes": {"model.moe.top_k": [1, 2], "model.moe.capacity_factor": [1.0, 2.0]},
                "cells": [
                    {"model.moe.top_k": 3, "model.moe.capacity_factor": 1.0},
                    {"model.moe.top_k": 1, "model.moe.capacity_factor": 1.0},
                ],
                "exclude": [{"model.moe.top_k": 2, "model.moe.capacity_factor": [2.0]}],
            }
        )
    )
    combos = [(p.params["model.moe.top_k"], p.params["model.moe.capacity_factor"]) for p in points]
    assert combos == [
        (1, 1.0),
        (1, 2.0),
        (2, 1.0),
        (3, 1.0),
    ]  # (2, 2.0) excluded; the repeated (1, 1.0) deduplicated


def test_repeats_share_point_id_with_distinct_cell_ids():
    points = expand(campaign({"axes": {"model.moe.top_k": [1, 2]}, "repeats": 3}))
    assert len(points) == 6
    assert len({p.cell_id for p in points}) == 6
    assert len({p.point_id for p in points}) == 2
    assert [p.cell_id.rsplit("-r", 1)[1] for p in points[:3]] == ["0", "1", "2"]


def test_cell_ids_are_stable_and_depend_only_on_the_resolved_point():
    a = expand(campaign({"axes": {"model.moe.top_k": [1, 2]}}))
    # same points written differently: explicit default values, int vs float, different sweep form
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["precision"] = "bf16"  # the default, spelled out
    recipe["model"]["moe"]["top_k"] = 2
    b = Campaign.model_validate(
        {
            "name": "other-name",
            "trainer": {"recipe": recipe},
            "sweep": {"cells": [{"model.moe.top_k": 1}, {}]},
        }
    )
    b_points = expand(b)
    assert {p.point_id for p in a} == {p.point_id for p in b_points}
    changed = expand(campaign({"axes": {"model.moe.top_k": [1, 2]}}, resources={"gpus_per_node": 2}))
    assert not {p.point_id for p in a} & {p.point_id for p in changed}


def test_resources_and_env_are_sweepable():
    points = expand(campaign({"axes": {"resources.gpus_per_node": [1, 2], "env.NCCL_ALGO": ["Ring"]}}))
    assert [p.world_size for p in points] == [1, 2]
    assert points[0].env == {"NCCL_ALGO": "Ring"}


def test_every_bad_point_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        expand(campaign({"axes": {"model.moe.top_k": [8, 9], "model.hidden_size": [32]}}))
    assert len(info.value.problems) == 2


def test_expansion_matches_golden_file():
    points = expand(
        campaign(
            {
                "axes": {"model.moe.capacity_factor": [1.0, 1.5], "model.moe.top_k": [1, 2]},
                "zip": [{"training.seq_length": [32, 64], "training.micro_batch_size": [2, 1]}],
                "exclude": [{"model.moe.top_k": 1, "training.seq_length": 64}],
                "repeats": 2,
            }
        )
    )
    got = [{"cell_id": p.cell_id, "label": p.label} for p in points]
    if not GOLDEN.exists():  # first run writes it; review the diff when it changes
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads(GOLDEN.read_text())


def test_each_distinct_recipe_is_validated_once(monkeypatch):
    """Points differing only in env (or repeats) share one validation; the base recipe is built once."""
    from trainer.recipe import Recipe

    calls = []
    original = Recipe.model_validate.__func__

    def counting(cls, *args, **kwargs):
        calls.append(1)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(Recipe, "model_validate", classmethod(counting))
    sweep = {"axes": {"model.moe.top_k": [1, 2], "env.FOO": ["a", "b", "c"]}, "repeats": 2}
    points = expand(campaign(sweep))
    assert len(points) == 12 and len({p.point_id for p in points}) == 6
    assert len(calls) == 2
    assert [p.env["FOO"] for p in points[:6:2]] == ["a", "b", "c"]
    assert points[0].recipe["model"]["moe"]["top_k"] == 1 and points[-1].recipe["model"]["moe"]["top_k"] == 2


def test_a_sweep_never_changes_the_campaigns_base_recipe():
    c = campaign({"axes": {"model.moe.top_k": [1, 2], "model.moe": [{"top_k": 1}]}})
    before = copy.deepcopy(c.trainer.recipe)
    expand(c)
    assert c.trainer.recipe == before
