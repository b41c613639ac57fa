"""Command-trainer argv: params rendered Megatron-LM or Megatron-Bridge style, {placeholder} templates, one point.

Pure functions; the command trainer kind (orchestrator/trainers/kinds/command.py, whose `CommandTrainer` is the
campaign's `trainer:` schema) resolves its points with `resolve_point` and fills an attempt's placeholders with
`attempt_argv`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import ValidationError

from orchestrator.spec import software
from orchestrator.spec.campaign import Campaign, Resources
from orchestrator.spec.keys import copy_tree, deep_merge, set_path, unknown_key_problem
from orchestrator.spec.loader import validation_problems
from orchestrator.spec.sweep import PointProblems, ResolvedPoint

# `{name}` or `{a.b.c}`; `{{` and `}}` are literal braces; `${...}` (OmegaConf interpolation) is left alone.
PLACEHOLDER_RE = re.compile(r"\{\{|\}\}|(?<!\$)\{([A-Za-z_][A-Za-z0-9_.\-]*)\}")
# Filled in per attempt by the engine; kept literally (and in the cell identity) until then.
RUNTIME_NAMES = ("run_dir", "log_dir", "cell_id", "attempt")
RESOURCE_NAMES = ("nodes", "gpus_per_node", "world_size", "time_limit_min")
PARAMS_SLOT = "{params}"
NAMESPACES = ("params", "resources", "env", "software", "container")
SOFTWARE_PLACEHOLDER = "software."  # `{software.NAME}`: a repo's worktree, filled in per attempt


class TemplateError(ValueError):
    """A template or params problem, reported as a campaign error."""


@runtime_checkable
class CommandFields(Protocol):
    """What this module reads of a command campaign's `trainer:` section (its schema, with every field's meaning:
    orchestrator/trainers/kinds/command.py's CommandTrainer, a layer above)."""

    command: list[str]
    params: dict[str, Any]
    style: Literal["megatron-lm", "megatron-bridge"]
    log_format: str
    seq_length: int | None
    num_gpus: int | None
    steps: int | None
    resolved_config: str | None


# ---- values ------------------------------------------------------------------------------------------------
def scalar_text(value: Any) -> str:
    """A scalar as argv text: true/false for booleans, repr-exact floats, strings verbatim."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _hydra_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    return scalar_text(value)


def flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted leaves, in insertion order (an empty mapping stays a leaf)."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def nest(params: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys (`model.seq_length: 4096`) as nested mappings, so sweeps address one spelling."""
    nested: dict[str, Any] = {}
    for key, value in params.items():
        value = nest(value) if isinstance(value, dict) else value
        parts = str(key).split(".")
        node = nested
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise TemplateError(f"params: {key!r} sets a key below {part!r}, which already holds a value")
            node = child
        last = parts[-1]
        if last in node and (isinstance(node[last], dict) != isinstance(value, dict)):
            raise TemplateError(f"params: {key!r} is given both as a value and as a section")
        node[last] = deep_merge(node[last], value) if isinstance(value, dict) and last in node else value
    return nested


def render_megatron_lm(params: dict[str, Any]) -> list[str]:
    """`--flag-name value` tokens: underscores → dashes, true → bare flag, false/None/[] → omitted,
    lists → the flag followed by every item."""
    argv: list[str] = []
    for key, value in params.items():
        if isinstance(value, dict):
            raise TemplateError(f"params.{key}: megatron-lm params are flat flag names, not sections")
        flag = "--" + str(key).lstrip("-").replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, list | tuple):
            if value:
                argv.append(flag)
                for item in value:
                    if isinstance(item, dict | list | tuple):
                        raise TemplateError(f"params.{key}: list items must be scalars")
                    argv.append(scalar_text(item))
        else:
            argv += [flag, scalar_text(value)]
    return argv


def render_megatron_bridge(params: dict[str, Any]) -> list[str]:
    """Hydra-style overrides `key.path=value` (nested mappings flattened; true/false, null, [a,b]).

    Strings go in verbatim: quote them in the campaign file the way Hydra wants them
    (`"'a value with spaces'"`) when they hold characters Hydra's grammar reads specially.
    """
    return [f"{key}={_hydra_value(value)}" for key, value in flatten(params).items()]


def render_params(params: dict[str, Any], style: str) -> list[str]:
    if style == "megatron-bridge":
        return render_megatron_bridge(params)
    return render_megatron_lm(params)


# ---- templates ----------------------------------------------------------------------------------------------
def placeholders(template: list[str]) -> list[str]:
    """Every placeholder name in a template, in order of appearance."""
    return [m.group(1) for item in template for m in PLACEHOLDER_RE.finditer(item) if m.group(1)]


def _brace_escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _substitute(item: str, lookup: dict[str, Any], keep: tuple[str, ...]) -> list[str]:
    """One template element → zero, one or several argv elements.

    With `keep` (a first stage: some placeholders are filled later), literal braces stay doubled and
    substituted values are brace-escaped, so the later stage leaves them verbatim."""
    text = _brace_escape if keep else str
    whole = PLACEHOLDER_RE.fullmatch(item)
    if whole and whole.group(1) and whole.group(1) not in keep:
        value = lookup[whole.group(1)]
        if value is None:
            return []
        if isinstance(value, list | tuple):
            if any(isinstance(v, dict | list | tuple) for v in value):
                raise TemplateError(f"{item}: list items must be scalars")
            return [text(scalar_text(v)) for v in value]
        if isinstance(value, dict):
            raise TemplateError(f"{item}: is a section, not a value")
        return [text(scalar_text(value))]

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name is None:
            return m.group(0) if keep else m.group(0)[0]
        if name in keep:
            return m.group(0)
        value = lookup[name]
        if isinstance(value, dict | list | tuple) or value is None:
            raise TemplateError(
                f"{item!r}: {{{name}}} is {_kind(value)}; only a whole argv element can take it"
            )
        return text(scalar_text(value))

    return [PLACEHOLDER_RE.sub(one, item)]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return "a list" if isinstance(value, list | tuple) else "a section"


def fill(template: list[str], lookup: dict[str, Any], keep: tuple[str, ...] = ()) -> list[str]:
    """The template with every placeholder replaced (those in `keep` stay, with `{{`/`}}` as written)."""
    argv: list[str] = []
    for item in template:
        argv.extend(_substitute(item, lookup, keep))
    return argv


def attempt_argv(
    argv: list[str], run_dir: Path, cell_id: str, attempt: int, paths: dict[str, str] | None = None
) -> list[str]:
    """A point's argv with its per-attempt placeholders filled in (what the launcher runs); `paths` gives
    `software.NAME` → the repo's worktree (software.placeholder_paths)."""
    lookup: dict[str, Any] = {
        "run_dir": str(run_dir),
        "log_dir": str(Path(run_dir) / "logs"),
        "cell_id": cell_id,
        "attempt": attempt,
    }
    for name in placeholders(argv):
        if name.startswith(SOFTWARE_PLACEHOLDER):
            lookup[name] = (paths or {}).get(name.lower(), "")
    return fill(argv, lookup)


# ---- points ------------------------------------------------------------------------------------------------
def split_key(key: str, style: str) -> tuple[str, str]:
    """(namespace, rest) of a sweep key of a command campaign; bare names address params."""
    head, _, rest = key.partition(".")
    if head in NAMESPACES and rest:
        namespace = head
    elif head == "recipe" and rest:
        raise TemplateError(f"{key!r}: a command trainer has no recipe; sweep params.{rest} instead")
    else:
        namespace, rest = "params", key
    if namespace in ("software", "container"):
        return namespace, rest
    if namespace == "env" and "." in rest:
        raise TemplateError(f"{key!r}: env keys are single names, got {rest!r}")
    if namespace == "params" and style == "megatron-lm" and "." in rest:
        raise TemplateError(f"{key!r}: megatron-lm params are flat flag names (no dots); got {rest!r}")
    return namespace, rest


def key_problems(campaign: Campaign, keys: list[tuple[str, str]]) -> list[str]:
    """`where: problem` for sweep keys a command campaign cannot address."""
    trainer = command_trainer(campaign)
    problems = []
    for where, key in keys:
        try:
            namespace, rest = split_key(key, trainer.style)
        except TemplateError as err:
            problems.append(f"{where}: {err}")
            continue
        problem = None
        if namespace == "resources":
            problem = unknown_key_problem(rest, Resources, "resources")
        elif namespace in ("software", "container"):
            problem = software.key_problem(campaign.software, key)
        if problem:
            problems.append(f"{where}: {problem}")
    return problems


def command_trainer(campaign: Campaign) -> CommandFields:
    """The campaign's `trainer:` section, which must be a command's."""
    if not isinstance(campaign.trainer, CommandFields):
        raise TypeError(f"campaign {campaign.name!r} does not run a command trainer")
    return campaign.trainer


def planned_steps(trainer: CommandFields, params: dict[str, Any]) -> int | None:
    """The planned iterations: the `steps` hint, else the params' train_iters (Bridge: train.train_iters)."""
    if trainer.steps:
        return trainer.steps
    flat = flatten(params)
    for key in ("train_iters", "train.train_iters"):
        value = flat.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _assign(
    campaign: Campaign, assignment: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """(params, resources mapping, env) of one point: the campaign's base with the sweep assignment applied."""
    trainer = command_trainer(campaign)
    bridge = trainer.style == "megatron-bridge"
    params = nest(copy_tree(trainer.params)) if bridge else copy_tree(trainer.params)
    resources_doc = campaign.resources.model_dump()
    env = dict(campaign.env.values)
    for key, value in assignment.items():
        namespace, rest = split_key(key, trainer.style)
        if namespace in ("software", "container"):
            continue  # resolved by orchestrator/spec/software.py
        if namespace == "env":
            env[rest] = scalar_text(value)
        elif namespace == "resources":
            set_path(resources_doc, rest, value)
        elif bridge:
            set_path(params, rest, value)
        else:
            params[rest] = copy_tree(value)
    return params, resources_doc, env


def _lookup(
    name: str,
    fixed: dict[str, Any],
    res: dict[str, Any],
    env: dict[str, str],
    flat: dict[str, Any],
    bridge: bool,
) -> tuple[Any, str | None]:
    """The value of one template placeholder, and the params key it consumes (None: not a param)."""
    head, _, rest = name.partition(".")
    if name in fixed:
        return fixed[name], None
    if head == "software":
        raise TemplateError(f"trainer.command: {{{name}}}: {rest!r} is not a repo of software.repos")
    if head == "resources" and rest in res:
        return res[rest], None
    if head == "env" and rest:
        if rest not in env:
            raise TemplateError(
                f"trainer.command: {{{name}}}: {rest!r} is not set in env.values"
                + (f" (set: {', '.join(env)})" if env else "")
            )
        return env[rest], None
    key = rest if head == "params" and rest else name
    if key in flat:
        return flat[key], key
    if bridge and any(k.startswith(key + ".") for k in flat):
        raise TemplateError(f"trainer.command: {{{name}}} is a section of params, not a value")
    known = [
        *fixed,
        *RUNTIME_NAMES,
        *(f"params.{k}" for k in flat),
        *(f"env.{k}" for k in env),
        "software.NAME",
    ]
    raise TemplateError(f"trainer.command: unknown placeholder {{{name}}}; known here: {', '.join(known)}")


def command_argv(
    campaign: Campaign,
    params: dict[str, Any],
    res: dict[str, Any],
    env: dict[str, str],
    campaign_file: Path | None,
) -> list[str]:
    """The point's argv: placeholders filled (per-attempt ones kept), the remaining params rendered at `{params}`."""
    trainer = command_trainer(campaign)
    bridge = trainer.style == "megatron-bridge"
    if trainer.command.count(PARAMS_SLOT) > 1:
        raise TemplateError("trainer.command: `{params}` may appear once")
    for item in trainer.command:
        if item != PARAMS_SLOT and "params" in placeholders([item]):
            raise TemplateError(f"trainer.command: {item!r}: `{{params}}` must be a whole argv element")
    flat = flatten(params) if bridge else params
    root = campaign_file.parent.resolve() if campaign_file else Path.cwd()
    fixed: dict[str, Any] = {"campaign": campaign.name, "campaign_dir": str(root)}
    fixed.update({name: res[name] for name in RESOURCE_NAMES})
    lookup: dict[str, Any] = {}
    consumed: set[str] = set()
    repos = {f"{SOFTWARE_PLACEHOLDER}{name}" for name in campaign.software.repos}
    later = (*RUNTIME_NAMES, *sorted(repos))  # filled in per attempt
    for name in placeholders(trainer.command):
        if name in later or name == "params":
            continue
        lookup[name], key = _lookup(name, fixed, res, env, flat, bridge)
        if key is not None:
            consumed.add(key)
    rendered = render_params({k: v for k, v in flat.items() if k not in consumed}, trainer.style)
    template = list(trainer.command)
    if PARAMS_SLOT not in template:
        return [*fill(template, lookup, later), *map(_brace_escape, rendered)]
    index = template.index(PARAMS_SLOT)
    head_argv = fill(template[:index], lookup, later)
    tail_argv = fill(template[index + 1 :], lookup, later)
    return [*head_argv, *map(_brace_escape, rendered), *tail_argv]


RELATIVE_PREFIXES = ("./", "../")  # an argv element that starts so is a path relative to the campaign file


def resolve_relative(argv: list[str], campaign_file: Path | None) -> list[str]:
    """`argv` with every element that starts with ./ or ../ (`[python, ./train.py]`) made absolute against the
    campaign file's folder (else the current directory): a trainer runs in its run directory, where the path
    as written would name nothing. The campaign (and a card's copy of it) keeps the path as written."""
    root = campaign_file.parent.resolve() if campaign_file else Path.cwd()
    return [str(root / item) if item.startswith(RELATIVE_PREFIXES) else item for item in argv]


def _config_path(path: str, campaign_file: Path | None, where: str) -> Path:
    """trainer.resolved_config, relative to the campaign file's folder; PointProblems when it is not a file."""
    full = (campaign_file.parent if campaign_file else Path.cwd()) / path
    if not full.is_file():
        raise PointProblems([f"{where}trainer.resolved_config: {path!r} is not a file (relative to the campaign "
                             "file's folder; write one with `--dryrun`)"])  # fmt: skip
    return full.resolve()


def resolve_point(
    campaign: Campaign,
    assignment: dict[str, Any],
    campaign_file: Path | None,
    where: str = "",
    versions: dict[str, str] | None = None,
    *,
    kind: str,
) -> ResolvedPoint:
    """The argv, env and resources of one point (sweep assignment applied; `versions`: its software env,
    orchestrator/spec/software.py; `kind`: the trainer kind's name, part of the point's identity). Raises
    PointProblems."""
    trainer = command_trainer(campaign)
    try:
        params, resources_doc, env = _assign(campaign, assignment)
        env.update(versions or {})
        resources = Resources.model_validate(resources_doc)
        res = resources.model_dump(mode="json")
        res["world_size"] = resources.nodes * resources.gpus_per_node
        written = command_argv(campaign, params, res, env, campaign_file)
        argv = resolve_relative(written, campaign_file)
    except TemplateError as err:
        raise PointProblems([f"{where}{err}"]) from None
    except ValidationError as err:
        raise PointProblems(validation_problems(err, Resources, f"{where}resources.")) from None
    recipe = {
        "argv": argv,
        "params": params,
        "style": trainer.style,
        "log_format": trainer.log_format,
        "seq_length": trainer.seq_length,
        "num_gpus": trainer.num_gpus,
        "steps": planned_steps(trainer, params),
    }
    if written != argv:  # what a card publishes: the command line with its paths as the campaign wrote them
        recipe["argv_as_written"] = written
    if trainer.resolved_config:
        recipe["bridge_config"] = str(_config_path(trainer.resolved_config, campaign_file, where))
    identity = {
        "trainer": kind,
        "argv": written,  # as written (relative paths kept): the point's id does not depend on where the file is
        "env": software.identity_env(env),
        "resources": resources.model_dump(mode="json", exclude_defaults=True),
    }
    return ResolvedPoint(recipe, resources.model_dump(mode="json"), env, identity)
