"""Read a campaign file into a validated Campaign, turning every problem into `file: key.path: message`."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.errors import ConfigError
from orchestrator.rows import DEFAULT_KIND
from orchestrator.spec import trainer_section, verdict_section
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.keys import env_key_problem, key_problem, model_of, strings_in, values_problems
from orchestrator.spec.yamlio import load_yaml_file

DRY_RUN_HINT = (
    "launcher: 'dry-run' is not a backend; name the backend that submits (local, submitit, nemo-run) and "
    "see what it would submit with `mbx campaign run FILE --dry-run`"
)


def _allowed_here(loc: tuple[Any, ...], root: type[BaseModel], kind: str | None = None) -> list[str]:
    """Field names of the model that holds the last element of `loc` (for unknown-key messages)."""
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return []
        if model is Campaign and part == "trainer":
            model = trainer_section.schema_of(kind or DEFAULT_KIND)  # (`_untag` gives only known kinds)
            continue
        if model is Campaign and part in verdict_section.kind_names():
            model = verdict_section.section_of(part)[0]  # a verdict kind's section, by its kind's schema
            continue
        model = model_of(model.model_fields[part].annotation)
    return [f.alias or name for name, f in model.model_fields.items()] if model else []


def _untag(loc: tuple[Any, ...], root: type[BaseModel]) -> tuple[tuple[Any, ...], str | None]:
    """Drop the trainer-kind tag a `trainer:` section's errors carry in their path (trainer.command.x:
    orchestrator/spec/trainer_section.py)."""
    if root is Campaign and len(loc) > 1 and loc[0] == "trainer" and loc[1] in trainer_section.kind_names():
        return (loc[0], *loc[2:]), str(loc[1])
    return loc, None


MAX_SHOWN = 100  # characters of an offending value quoted in a message


def shown_value(value: Any) -> str:
    """repr of a value from the file, cut at MAX_SHOWN characters (a long string or list is not repeated whole)."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


def _got(item: Any) -> str:
    """` (got X)` for a scalar input; nothing for a whole section (it would repeat the file)."""
    value = item.get("input")
    return "" if isinstance(value, dict) else f" (got {shown_value(value)})"


def validation_problems(
    err: ValidationError, model: type[BaseModel] = Campaign, prefix: str = ""
) -> list[str]:
    """One line per pydantic error: dotted key path, what is wrong, what is allowed.

    `model` is the model that was validated (the campaign by default; a recipe, the resources or a
    launcher's settings for parts of it) and `prefix` the key path (or point) it sits at, e.g.
    `point [top_k=16]: trainer.recipe.` or `launchers.local.`.
    """
    lines = []
    for item in err.errors():
        loc, trainer_kind = _untag(tuple(item["loc"]), model)
        path = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")
        path = prefix + path if path else (prefix.rstrip(".") or "(top level)")
        kind = item["type"]
        if kind == "extra_forbidden":
            allowed = _allowed_here(loc, model, trainer_kind)
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(f"{path}: unknown key{hint}; allowed: {', '.join(allowed)}")
        elif kind in ("literal_error", "enum"):
            lines.append(f"{path}: must be one of {item['ctx']['expected']} (got {shown_value(item.get('input'))})")
        elif kind == "invalid_trainer_kind":
            got = item["input"].get("kind") if isinstance(item.get("input"), dict) else item.get("input")
            kinds = ", ".join(map(repr, trainer_section.kind_names()))
            lines.append(f"trainer.kind: must be one of {kinds} (got {shown_value(got)})")
        elif kind == "missing":
            lines.append(f"{path}: required key is missing")
        else:
            lines.append(f"{path}: {item['msg'].removeprefix('Value error, ')}{_got(item)}")
    return lines


def launcher_problems(campaign: Campaign) -> list[str]:
    """`launcher` and every `launchers.<name>` section checked against the backends' typed settings (only the
    backends a section names are imported)."""
    from launchers import registry

    known = registry.names()
    problems = []
    if campaign.launcher == "dry-run":
        problems.append(DRY_RUN_HINT)
    elif campaign.launcher not in known:
        problems.append(f"launcher: no such launcher {campaign.launcher!r}; known: {', '.join(known)}")
    for name, section in campaign.launchers.items():
        backend = name if name in known else name.replace("_", "-")
        if backend not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"launchers.{name}: no such launcher{hint}; known: {', '.join(known)}")
            continue
        settings = registry.settings_model(backend)
        try:
            settings.model_validate(section or {})
        except ValidationError as err:
            problems.extend(validation_problems(err, settings, f"launchers.{name}."))
    return problems


def sweep_entries(campaign: Campaign) -> list[tuple[str, str, list[Any]]]:
    """(where in the file, dotted key, its values) of every key the sweep sets (axes, zip groups, cells, and the
    parity section's toggle and pairs)."""
    sweep = campaign.sweep
    found = [(f"sweep.axes.{k}", k, list(v)) for k, v in sweep.axes.items()]
    found += [(f"sweep.zip[{i}].{k}", k, list(v)) for i, group in enumerate(sweep.zip) for k, v in group.items()]
    found += [(f"sweep.cells[{i}].{k}", k, [v]) for i, cell in enumerate(sweep.cells) for k, v in cell.items()]
    parity = campaign.parity  # its sides become sweep factors (orchestrator/spec/parity.py with_parity_axes)
    if parity is not None:
        found += [(f"parity.toggle.{k}", k, list(v)) for k, v in (parity.toggle or {}).items()]
        for i, pair in enumerate(parity.pairs or []):
            found += [(f"parity.pairs[{i}].{side}.{k}", k, [v]) for side in ("off", "on")
                      for k, v in getattr(pair, side).items()]  # fmt: skip
    return found


def trust_problems(campaign: Campaign) -> list[str]:
    """What a campaign may not set and what render would refuse, found before anything runs: environment names
    mbx reserves (orchestrator/spec/reserved_env.py) in env.values, env.pass and `env.NAME` sweep keys, and values
    launchers/safety.py refuses (a control character in a swept container.image, a NUL in any value); names that
    change which code runs unless env.allow_code_loading lists them."""
    from launchers.safety import nul_problem
    from orchestrator.spec.reserved_env import code_loading_problem

    allowed = campaign.env.allow_code_loading
    problems = []
    for name, value in campaign.env.values.items():
        if problem := env_key_problem(name) or code_loading_problem(name, allowed) or nul_problem(value):
            problems.append(f"env.values.{name}: {problem}")
    for index, name in enumerate(campaign.env.pass_names):
        if problem := env_key_problem(name) or code_loading_problem(name, allowed):
            problems.append(f"env.pass[{index}]: {problem}")
    for where, key, values in sweep_entries(campaign):
        loads_code = key.startswith("env.") and code_loading_problem(key[len("env.") :], allowed)
        if problem := key_problem(key) or loads_code:
            problems.append(f"{where}: {problem}")
            continue
        several = where.startswith(("sweep.axes.", "sweep.zip[", "parity.toggle."))
        for index, problem in values_problems(key, values):
            problems.append(f"{where}{f'[{index}]' if several else ''}: {problem}")
    for index, rule in enumerate(campaign.sweep.exclude):
        problems += [f"sweep.exclude[{index}].{k}: {p}" for k in rule if (p := key_problem(k))]
    return problems


SECRET_HINT = (
    "pass secrets by name with env.pass (their values are read from the submitting environment), never in the file"
)


def secret_problems(data: Any) -> tuple[list[str], Any]:
    """`key.path: contains a credential (NAME=<redacted>): ...` for a secret value anywhere in the file (env, argv,
    params, sweeps, tags, entity, cluster, launchers, container, pip args, descriptions), one line per key path,
    the value never shown; and the file's data with them masked (the schema's messages quote values). The scanner
    is reports/secrets.py, the one every output of mbx goes through."""
    from reports.secrets import scan_and_redact

    found, masked = scan_and_redact(data)
    return list(dict.fromkeys(f"{f.where or '(top level)'}: contains {f.describe()}: {SECRET_HINT}" for f in found)), masked


def nul_problems(data: Any, path: str = "") -> list[str]:
    """`key.path: contains a NUL` for every string of the file holding one (no process can receive it)."""
    from launchers.safety import nul_problem

    if isinstance(data, dict):
        return [p for key, item in data.items() for p in nul_problems(item, f"{path}.{key}" if path else str(key))]
    if isinstance(data, list):
        return [p for i, item in enumerate(data) for p in nul_problems(item, f"{path}[{i}]")]
    problem = next((nul_problem(text) for text in strings_in(data) if "\0" in text), None)
    return [f"{path or '(top level)'}: {problem}"] if problem else []


def load_campaign(path: Path) -> Campaign:
    """Parse and validate a campaign file; ConfigError names the file and every bad key path."""
    data = load_yaml_file(path)
    if not isinstance(data, dict):
        raise ConfigError(
            "a campaign file must be a YAML mapping (name:, trainer:, sweep:, ...)", file=str(path)
        )
    secrets, data = secret_problems(data)  # the schema's messages quote values: they see the file masked
    try:
        campaign = Campaign.model_validate(data)
    except ValidationError as err:
        raise ConfigError(secrets + validation_problems(err), file=str(path)) from None
    problems = secrets + launcher_problems(campaign) + trust_problems(campaign)
    if "\\u0000" in json.dumps(data, default=str):  # cheap (C) test first: the walk only locates them
        covered = ("env.", "sweep.axes.", "sweep.zip[", "sweep.cells[")  # trust_problems located those
        problems += [p for p in nul_problems(data) if not p.startswith(covered)]
    if problems:
        raise ConfigError(problems, file=str(path))
    return campaign
