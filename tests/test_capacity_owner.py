"""Expert capacity has one owner (trainer/capacity.py): the MoE layer, the recipe's TE alignment check and the memory
estimate all call it, and agree on every chunk's capacity."""

from __future__ import annotations

import ast
import copy
import re

import pytest
from conftest import ROOT, TINY_MOE_RECIPE

from trainer.memory import dispatch_rows
from trainer.moe import MoELayer, token_chunks
from trainer.recipe import Recipe, knob_problems


def _is_capacity_factor(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "capacity_factor") or (
        isinstance(node, ast.Attribute) and node.attr == "capacity_factor")  # fmt: skip


def test_the_capacity_formula_is_written_once_in_trainer_capacity() -> None:
    found = []
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                if _is_capacity_factor(node.left) or _is_capacity_factor(node.right):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert len(found) == 1 and found[0].startswith("trainer/capacity.py:"), found


def _recipe(tokens_per_chunk: int | None, factor: float, experts: int, top_k: int, seq: int, mbs: int) -> Recipe:
    data = copy.deepcopy(TINY_MOE_RECIPE)
    data["model"].update(hidden_size=64, num_attention_heads=4, ffn_hidden_size=64, vocab_size=128)
    data["model"]["moe"].update(num_experts=experts, top_k=top_k, ffn_hidden_size=32, capacity_factor=factor,
                                pad_to_capacity=True, dispatch_chunk_tokens=tokens_per_chunk, grouped_gemm="te")
    data["training"].update(seq_length=seq, micro_batch_size=mbs)
    data["precision"] = "fp8"
    return Recipe.model_validate(data)


CASES = [  # (dispatch_chunk_tokens, capacity_factor, experts, top_k, seq_length, micro_batch_size)
    (None, 1.0, 4, 2, 32, 2),  # capacity 32: aligned, no message
    (None, 1.25, 8, 2, 48, 1),  # capacity 15: named in the message
    (40, 1.3, 8, 3, 64, 2),  # 128 tokens: chunks 40, 40, 40, 8
    (96, 0.7, 6, 2, 64, 3),  # 192 tokens: chunks 96, 96
    (1000, 2.0, 4, 1, 16, 1),  # a chunk larger than the micro-batch: one chunk of all tokens
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "chunk{}-f{}-E{}-k{}-{}x{}".format(*c))
def test_layer_recipe_check_and_memory_estimate_agree_on_capacity(case) -> None:
    recipe = _recipe(*case)
    moe, tokens = recipe.model.moe, recipe.training.seq_length * recipe.training.micro_batch_size
    layer = MoELayer(recipe.model.hidden_size, "swiglu", moe, init_std=0.02, output_std=0.02)
    per_chunk = [layer.capacity(part.stop - part.start) for part in token_chunks(tokens, moe.dispatch_chunk_tokens)]

    assert dispatch_rows(recipe, tokens) == moe.num_experts * sum(per_chunk)  # the memory estimate's buffer
    messages = [p for p in knob_problems(recipe, "cuda", 90) if "row count divisible" in p]
    if any(c % 16 for c in per_chunk):  # fp8 on TE: every capacity a multiple of 16, else the check names them
        shown = re.search(r"capacity \[([0-9, ]+)\]", messages[0]).group(1)
        assert [int(c) for c in shown.split(",")] == sorted(set(per_chunk))
    else:
        assert messages == []

