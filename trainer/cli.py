"""Command line of `python -m trainer`: arguments, recipe files and `--set key.path=value` overrides (no torch)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from trainer.recipe import Recipe

USAGE = """\
python -m trainer --recipe FILE --out DIR [--set key.path=value ...]
python -m trainer flops --recipe FILE [--world-size N] [--set key.path=value ...]
torchrun --nproc-per-node N -m trainer --recipe FILE --out DIR"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the train command (default) or the `flops` sub-command."""
    if argv[:1] == ["flops"]:
        p = argparse.ArgumentParser(prog="python -m trainer flops", description="Print the FLOPs per step as JSON.")
        p.add_argument("--recipe", required=True, help="Recipe YAML/JSON file.")
        p.add_argument("--world-size", type=int, default=1, help="GPUs the step runs on (sets DP, hence the batch).")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
        args = p.parse_args(argv[1:])
        args.command = "flops"
        return args
    p = argparse.ArgumentParser(prog="python -m trainer", usage=USAGE, description="The bundled MoE GPT trainer.")
    p.add_argument("--recipe", help="Recipe YAML/JSON file (default: the schema's defaults).")
    p.add_argument("--out", required=True, help="Run directory: metrics.jsonl, status.json, env.json, logs/.")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="Override one recipe value, e.g. --set training.steps=5 --set model.moe.top_k=2 (YAML value syntax).",
    )
    args = p.parse_args(argv)
    args.command = "train"
    return args


def read_recipe_dict(path: str | None) -> dict[str, Any]:
    """The raw mapping of a recipe file (.json as JSON, anything else as YAML); {} without a file."""
    if path is None:
        return {}
    text = Path(path).read_text()
    data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a recipe must be a mapping, got {type(data).__name__}")
    return data


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one `a.b.c=value` (value parsed as YAML: 3, 1e-4, true, null, [1, 2]) to a nested mapping."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set {assignment!r}: expected KEY.PATH=VALUE, e.g. training.steps=5")
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ValueError(f"--set {assignment!r}: {part} is not a mapping")
        node = child
    node[parts[-1]] = yaml.safe_load(raw)


def load_recipe(path: str | None, overrides: list[str] = ()) -> Recipe:
    """Read, override and validate a recipe (pydantic errors name the key path)."""
    data = read_recipe_dict(path)
    for assignment in overrides:
        apply_override(data, assignment)
    return Recipe.model_validate(data)
