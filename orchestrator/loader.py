"""Read a campaign file into a validated Campaign, turning every problem into `file: key.path: message`."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.campaign import TRAINER_KINDS, Campaign
from orchestrator.errors import ConfigError
from orchestrator.keys import model_of
from orchestrator.yamlio import load_yaml_file

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
            model = TRAINER_KINDS.get(kind or "bundled")
            continue
        model = model_of(model.model_fields[part].annotation)
    return [f.alias or name for name, f in model.model_fields.items()] if model else []


def _untag(loc: tuple[Any, ...], root: type[BaseModel]) -> tuple[tuple[Any, ...], str | None]:
    """Drop the trainer-kind tag pydantic puts into the path of a discriminated union (trainer.command.x)."""
    if root is Campaign and len(loc) > 1 and loc[0] == "trainer" and loc[1] in TRAINER_KINDS:
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
            kinds = ", ".join(map(repr, TRAINER_KINDS))
            lines.append(f"trainer.kind: must be one of {kinds} (got {shown_value(got)})")
        elif kind == "missing":
            lines.append(f"{path}: required key is missing")
        else:
            lines.append(f"{path}: {item['msg'].removeprefix('Value error, ')}{_got(item)}")
    return lines


def launcher_problems(campaign: Campaign) -> list[str]:
    """`launcher` and every `launchers.<name>` section checked against the backends' typed settings."""
    from launchers import registry

    known = list(registry.backends())
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
        settings = _settings_model(backend)
        try:
            settings.model_validate(section or {})
        except ValidationError as err:
            problems.extend(validation_problems(err, settings, f"launchers.{name}."))
    return problems


def _settings_model(backend: str) -> type[BaseModel]:
    from launchers import registry

    settings_model = getattr(registry, "settings_model", None)
    return settings_model(backend) if settings_model else registry.get(backend).Settings


def load_campaign(path: Path) -> Campaign:
    """Parse and validate a campaign file; ConfigError names the file and every bad key path."""
    data = load_yaml_file(path)
    if not isinstance(data, dict):
        raise ConfigError(
            "a campaign file must be a YAML mapping (name:, trainer:, sweep:, ...)", file=str(path)
        )
    try:
        campaign = Campaign.model_validate(data)
    except ValidationError as err:
        raise ConfigError(validation_problems(err), file=str(path)) from None
    problems = launcher_problems(campaign)
    if problems:
        raise ConfigError(problems, file=str(path))
    return campaign
