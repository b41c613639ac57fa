"""Dotted key paths: merge, set, and check them against the recipe schema with helpful suggestions."""

from __future__ import annotations

import difflib
import json
import types
import typing
from typing import Any, Union

from pydantic import BaseModel

from launchers.safety import control_problem, env_name_problem, nul_problem
from orchestrator.spec.reserved_env import name_problem
from trainer.recipe import Recipe

NAMESPACES = ("resources", "env", "software", "container")


def copy_tree(value: Any) -> Any:
    """A copy of nested mappings and lists (what YAML and JSON hold), many times faster than copy.deepcopy;
    other values are immutable there and are shared."""
    if isinstance(value, dict):
        return {key: copy_tree(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copy_tree(item) for item in value]
    return value


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A new mapping: `over` merged into `base`, recursively for nested mappings."""
    merged = copy_tree(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy_tree(value)
    return merged


def set_path(doc: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` in a nested mapping, creating mappings on the way; mappings merge, other values replace.

    The mappings along the path are replaced by copies, so `doc` may be a shallow copy of a shared base."""
    parts = dotted.split(".")
    node = doc
    for part in parts[:-1]:
        child = node.get(part)
        child = dict(child) if isinstance(child, dict) else {}
        node[part] = child
        node = child
    last = parts[-1]
    if isinstance(value, dict) and isinstance(node.get(last), dict):
        node[last] = deep_merge(node[last], value)
    else:
        node[last] = copy_tree(value)


def split_namespace(dotted: str) -> tuple[str, str]:
    """('recipe'|'resources'|'env'|'software'|'container', rest) for a sweep key; plain keys address the recipe
    (software.* and container.* are checked and resolved by orchestrator/spec/software.py)."""
    head, _, rest = dotted.partition(".")
    if head in NAMESPACES and rest:
        return head, rest
    if head == "recipe" and rest:
        return "recipe", rest
    return "recipe", dotted


def model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `MoEConfig | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            model = model_of(arg)
            if model is not None:
                return model
    return None


def unknown_key_problem(dotted: str, model: type[BaseModel] = Recipe, root: str = "") -> str | None:
    """None when `dotted` names a field path of `model`; else a message listing what is allowed there."""
    current: type[BaseModel] | None = model
    walked: list[str] = []
    for part in dotted.split("."):
        if current is None:
            where = ".".join(walked)
            return f"{where!r} is a value, not a section: nothing can be set below it"
        fields = current.model_fields
        if part not in fields:
            where = ".".join(walked) or (root or "the recipe")
            close = difflib.get_close_matches(part, list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            allowed = ", ".join(fields)
            return f"unknown key {part!r} in {where}{hint}; allowed: {allowed}"
        walked.append(part)
        current = model_of(fields[part].annotation)
    return None


# ---- what may reach a job script or a process (launchers/safety.py's rules, asked at validate time) --------
SCRIPT_KEYS = ("container.image",)  # swept values written into a job script as one token: no control character


def env_key_problem(name: str) -> str | None:
    """Why `name` cannot be an environment name a campaign sets, sweeps or passes (None: it can)."""
    return env_name_problem(name) or name_problem(name)


def key_problem(key: str) -> str | None:
    """Why a sweep (or bisect) key can never be set from a campaign: an `env.NAME` that is no variable name or
    that mbx reserves (orchestrator/spec/reserved_env.py). Other namespaces are checked by the trainer kinds."""
    if key.startswith("env."):
        return env_key_problem(key[len("env.") :])
    return None


def strings_in(value: Any) -> list[str]:
    """Every string (and mapping key) inside a value from YAML: scalars, lists and mappings."""
    if isinstance(value, dict):
        return [text for k, v in value.items() for text in (*strings_in(k), *strings_in(v))]
    if isinstance(value, list):
        return [text for item in value for text in strings_in(item)]
    return [value] if isinstance(value, str) else []


def value_problem(key: str, value: Any) -> str | None:
    """Why a value of sweep key `key` would be refused when rendered (None: it would not): a control character
    in a value written into a job script (container.image), a NUL anywhere (it reaches a process)."""
    if key in SCRIPT_KEYS and value is not None:
        return control_problem(value)
    for text in strings_in(value):
        if problem := nul_problem(text):
            return problem
    return None


def values_problems(key: str, values: list[Any]) -> list[tuple[int, str]]:
    """(index, problem) of each value of `key` that `value_problem` refuses; a long list of plain values costs
    one C-level JSON dump (a NUL shows there as \\u0000), not a Python call per value."""
    if key not in SCRIPT_KEYS and "\\u0000" not in json.dumps(values, default=str):
        return []
    return [(index, problem) for index, value in enumerate(values) if (problem := value_problem(key, value))]
