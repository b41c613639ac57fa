"""recipe.yaml in a run dir is written by `rundir.write_recipe` only (the trainer kinds, `mbx ingest`, the bundled
trainer started by hand): one format, written whole."""

from __future__ import annotations

import ast
import copy
import os
from pathlib import Path

import yaml
from conftest import ROOT, TINY_MOE_RECIPE

from trainer import rundir
from trainer.recipe import Recipe


def _mentions_recipe_file(node: ast.AST) -> bool:
    return any((isinstance(n, ast.Attribute) and n.attr == "RECIPE") or (isinstance(n, ast.Name) and n.id == "RECIPE")
               or (isinstance(n, ast.Constant) and n.value == rundir.RECIPE) for n in ast.walk(node))  # fmt: skip


def test_no_module_but_rundir_writes_a_run_dirs_recipe_yaml_itself() -> None:
    found = []
    for package in ("orchestrator", "launchers", "reports", "trainer"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for call in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
                    continue
                if call.func.attr in {"write_text", "write_bytes", "open"} and _mentions_recipe_file(call.func.value):
                    found.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert [f for f in found if not f.startswith("trainer/rundir.py:")] == []


def test_write_recipe_keeps_the_key_order_and_the_values(tmp_path: Path) -> None:
    resolved = Recipe.model_validate(copy.deepcopy(TINY_MOE_RECIPE)).model_dump(mode="json")
    resolved["name"] = "Über-run"  # written as is (allow_unicode), read back the same
    path = rundir.write_recipe(tmp_path, resolved)
    assert path == tmp_path / rundir.RECIPE
    text = path.read_text(encoding="utf-8")
    assert yaml.safe_load(text) == resolved and list(yaml.safe_load(text)) == list(resolved)
    assert "Über-run" in text
    assert os.listdir(tmp_path) == [rundir.RECIPE]


def test_the_trainer_keeps_a_recipe_the_launcher_wrote(tmp_path: Path) -> None:
    rundir.write_recipe(tmp_path, {"written_by": "the launcher"})
    rundir.write_recipe(tmp_path, {"written_by": "the trainer"}, only_if_absent=True)
    assert yaml.safe_load((tmp_path / rundir.RECIPE).read_text()) == {"written_by": "the launcher"}
    rundir.write_recipe(tmp_path, {"written_by": "a new attempt's inputs"})
    assert yaml.safe_load((tmp_path / rundir.RECIPE).read_text()) == {"written_by": "a new attempt's inputs"}
