"""What two compared points ran with: each point's resolved configuration, flattened, and the differences.

A point's configuration is its swept values (`sweep.<key>`), its cells' resolved recipe (the base recipe with
the swept values applied), their resources and environment, the campaign's trainer settings (command template, kind), the launcher it ran with
and that launcher's settings, the container, cluster and software sections, and the measured window. Keys
are dotted paths (`trainer.recipe.cross_entropy`); a command's argv, and its template `trainer.command`, are split
into their flags (`trainer.recipe.argv --cross-entropy-fusion-impl`), so one changed flag is one line. A key whose
value differs between a point's own repeats is shown as varying, not as a difference of the sides.

Each change is said once (`grouped`): a swept key (`sweep.env.SLOW`) and the keys it set with the same A → B
(`env.SLOW`, the argv flag its template fills with `{env.SLOW}`, the flag a param renders to) are one line, as are
a command trainer's `trainer.params.X`, its recipe's `trainer.recipe.params.X` and the flag `--x` they render to; a
key that only happens to change alike stays on its own.

Suspects (`ranked`): of the differing keys, the known performance keys come first, in the order of the rule that
names them (PERFORMANCE_KEYS: the trainer itself, precision, parallel layout, batch and sequence, recompute, kernels and fusions,
MoE dispatch, communication and overlap, optimizer memory, container and software), each tagged with its rule;
every other key follows in key order, untagged: no rule ranks it, so it is no suspect (a label, a log's path).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from fnmatch import fnmatchcase
from typing import Any, TypeVar

from orchestrator.run.store import CellRow
from reports import secrets

T = TypeVar("T")
SECTIONS = ("container", "cluster", "software")  # campaign sections that shape a run, besides the cell's
UNSET = "(unset)"
VARIES = "(varies by repeat)"
MAX_VALUE = 80  # characters of a value shown; longer values end with …
PERFORMANCE_KEYS = (  # (rule, key patterns): known performance keys, most likely suspect first
    ("the trainer itself", ("trainer.kind",)),  # Bridge vs the bundled trainer: every other key follows from it
    ("precision", ("*precision", "*--fp8*", "*--fp4*", "*--bf16", "*--fp16")),
    ("parallel layout", ("*.parallel.*", "*-parallel-size", "*--sequence-parallel", "resources.nodes",
                         "resources.gpus_per_node")),
    ("batch and sequence", ("*micro_batch_size", "*global_batch_size", "*seq_length", "*--micro-batch-size",
                            "*--global-batch-size", "*--seq-length")),
    ("recompute", ("*recompute*",)),
    ("kernels and fusions", ("*cross_entropy*", "*--cross-entropy*", "*.compile", "*grouped_gemm", "*grouped-gemm",
                             "*expert_wgrad", "*--attention-backend", "*--transformer-impl", "*cuda-graph*",
                             "*fusion*", "*--use-flash-attn")),
    ("MoE dispatch", ("*.moe.capacity_factor", "*pad_to_capacity", "*dispatch*", "*expert_weights", "*--moe-*")),
    ("communication and overlap", ("*overlap*", "env.NCCL_*", "env.TORCH_NCCL_*", "env.NVTE_*",
                                   "env.CUDA_DEVICE_MAX_CONNECTIONS")),
    ("optimizer memory", ("*.optimizer.main_grads", "*.optimizer.moments", "*.optimizer.master_weights",
                          "*distributed-optimizer*", "*precision-aware-optimizer*")),
    ("container and software", ("container.*", "software.*")),
)  # fmt: skip


ARGV_KEYS = ("argv", "trainer.command")  # lists shown flag by flag: a command's argv and its template
TEMPLATE = "trainer.command "  # a command template's flags as flattened: `trainer.command --flag` → `{env.X}`
ARGV = "trainer.recipe.argv "  # the rendered argv's flags
PARAMS = "trainer.params."  # a command trainer's params as the campaign gives them (its recipe has them too)


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def argv_flags(argv: list[str]) -> dict[str, str]:
    """`--flag value`, `--flag=value` and bare `--flag` (→ "true") by flag; other tokens by position."""
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--") and len(token) > 2:
            name, sep, value = token.partition("=")
            if not sep and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            flags[name] = value if (sep or value) else "true"
        else:
            flags[f"[{i}]"] = token
        i += 1
    return flags


def flatten(value: Any, prefix: str = "", out: dict[str, str] | None = None) -> dict[str, str]:
    """Dotted keys → shown values (empty mappings leave no key)."""
    out = {} if out is None else out
    if isinstance(value, dict):
        for key, item in value.items():
            flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list) and prefix.endswith(ARGV_KEYS) and all(isinstance(x, str) for x in value):
        for key, item in argv_flags(value).items():
            out[f"{prefix} {key}"] = _text(item)
    elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        for i, item in enumerate(value):
            flatten(item, f"{prefix}[{i}]", out)
    elif prefix:
        out[prefix] = _text(value)
    return out


def cell_config(spec: dict[str, Any], launcher: str | None, cell: CellRow) -> dict[str, str]:
    """One cell's resolved configuration, flattened."""
    trainer = {k: v for k, v in (spec.get("trainer") or {}).items() if k != "recipe"}
    trainer.update(kind=cell.trainer_kind, recipe=cell.recipe)
    tree: dict[str, Any] = {"sweep": cell.params, "trainer": trainer, "resources": cell.resources, "env": cell.env}
    if launcher:
        tree["launcher"] = launcher
        tree["launchers"] = {launcher: (spec.get("launchers") or {}).get(launcher)}
    tree.update({key: spec.get(key) for key in SECTIONS})
    tree["collect"] = {"window": (spec.get("collect") or {}).get("window")}
    return flatten(secrets.redact_distinct(tree))  # masked before flatten cuts it: a cut token is no token


def point_config(spec: dict[str, Any], launcher: str | None, cells: list[CellRow]) -> dict[str, str]:
    """The configuration a point's cells share (keys whose value differs between its repeats: VARIES)."""
    configs = [cell_config(spec, launcher, cell) for cell in cells]
    merged: dict[str, str] = {}
    for key in dict.fromkeys(k for c in configs for k in c):
        values = {c.get(key, UNSET) for c in configs}
        merged[key] = values.pop() if len(values) == 1 else VARIES
    return merged


def config_diff(a: dict[str, str], b: dict[str, str]) -> list[dict[str, str]]:
    """{key, a, b} for every key whose value differs (or is set on one side only), in key order."""
    keys = sorted(set(a) | set(b))
    return [{"key": k, "a": a.get(k, UNSET), "b": b.get(k, UNSET)} for k in keys
            if a.get(k, UNSET) != b.get(k, UNSET)]  # fmt: skip


def diff_line(item: dict[str, str]) -> str:
    return f"{item['key']}: {item['a']} → {item['b']}"


def sets(source: str, key: str, templates: dict[str, str]) -> bool:
    """Whether `key` is set from `source` (a swept `sweep.K` or any key K): K itself, a key ending in `.K` (the
    recipe's; a command trainer's `trainer.params.K` sets the recipe's `trainer.recipe.params.K`), a command's
    argv flag its template fills with `{K}`, or the flag K renders to (`--micro-batch-size` for
    `training.micro_batch_size`)."""
    name = source.removeprefix("sweep.")
    names = {name, name.removeprefix("trainer.")} if name.startswith(PARAMS) else {name}
    if key != source and any(key == n or key.endswith(f".{n}") for n in names):
        return True
    if not key.startswith(ARGV):
        return False
    flag = key.removeprefix(ARGV)
    rendered = "--" + name.rsplit(".", 1)[-1].replace("_", "-")
    return templates.get(flag) in (f"{{{name}}}", f"{{params.{name}}}") or flag == rendered


def grouped(diff: list[dict[str, str]], templates: dict[str, str]) -> list[tuple[dict[str, str], list[str]]]:
    """Each change once: (its source's item, the keys set from it with the same A → B), swept keys first (what
    the user changed: `sweep.env.SLOW` sets `env.SLOW` and the argv flag templated `{env.SLOW}`), then the
    others in key order. `templates`: a command template's flags (`trainer.command --flag` keys, flag → value)."""
    order = sorted(diff, key=lambda item: (not item["key"].startswith("sweep."), item["key"]))
    taken: set[str] = set()
    groups = []
    for item in order:
        if item["key"] in taken:
            continue
        same = [o["key"] for o in order if o["key"] not in taken and (o["a"], o["b"]) == (item["a"], item["b"])
                and sets(item["key"], o["key"], templates)]  # fmt: skip
        taken.update([item["key"], *same])
        groups.append((item, same))
    return groups


def templates_of(config: dict[str, str] | None) -> dict[str, str]:
    """A command template's flags (flag → its value, e.g. `--fake-slowdown` → `{env.SLOW}`) from a flattened
    configuration."""
    return {k.removeprefix(TEMPLATE): v for k, v in (config or {}).items() if k.startswith(TEMPLATE)}


def suspect_rule(key: str) -> tuple[int, str] | None:
    """(rank, rule) of the PERFORMANCE_KEYS rule that names `key` (None: no known performance key)."""
    for rank, (rule, patterns) in enumerate(PERFORMANCE_KEYS):
        if any(fnmatchcase(key, pattern) for pattern in patterns):
            return rank, rule
    return None


def _by_rule(entries: list[T], rule_of: Callable[[T], tuple[int, str] | None]) -> list[tuple[T, str | None]]:
    """Entries with their rule, those a rule names first (by its rank, stable), the rest after with None."""
    rules = [rule_of(e) for e in entries]
    order = sorted(range(len(entries)), key=lambda i: (rules[i] or (len(PERFORMANCE_KEYS), ""))[0])
    return [(entries[i], (rules[i] or (0, None))[1]) for i in order]


def ranked_groups(diff: list[dict[str, str]], templates: dict[str, str]) -> list[tuple[str, str | None]]:
    """One line per change (`grouped`), `key: A → B (also: keys it set)`, with the rule that makes any of its keys
    a suspect: known performance keys first (by rule rank), then the others, each in `grouped`'s order."""

    def best_rule(group: tuple[dict[str, str], list[str]]) -> tuple[int, str] | None:
        return min(filter(None, (suspect_rule(k) for k in (group[0]["key"], *group[1]))), default=None)

    return [(diff_line(item) + (f" (also: {', '.join(also)})" if also else ""), rule)
            for (item, also), rule in _by_rule(grouped(diff, templates), best_rule)]  # fmt: skip


def ranked(diff: list[dict[str, str]]) -> list[tuple[dict[str, str], str | None]]:
    """Every difference with the rule that makes it a suspect: known performance keys first (by rule rank, then
    key), then the others in key order with None."""
    return _by_rule(diff, lambda item: suspect_rule(item["key"]))
