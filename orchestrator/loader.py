"""Read a campaign file into a validated Campaign, turning every problem into `file: key.path: message`."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.campaign import TRAINER_KINDS, Campaign
from orchestrator.errors import ConfigError
from orchestrator.keys import _model_of
from orchestrator.yamlio import load_yaml_file


def _allowed_here(loc: tuple[Any, ...], kind: str | None = None) -> list[str]:
    """Field names of the model that holds the last element of `loc` (for unknown-key messages)."""
    model: type[BaseModel] | None = Campaign
    for part in loc[:-1]:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return []
        if model is Campaign and part == "trainer":
            model = TRAINER_KINDS.get(kind or "bundled")
            continue
        model = _model_of(model.model_fields[part].annotation)
    return [f.alias or name for name, f in model.model_fields.items()] if model else []


def _untag(loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], str | None]:
    """Drop the trainer-kind tag pydantic puts into the path of a discriminated union (trainer.command.x)."""
    if len(loc) > 1 and loc[0] == "trainer" and loc[1] in TRAINER_KINDS:
        return (loc[0], *loc[2:]), str(loc[1])
    return loc, None


def validation_problems(err: ValidationError) -> list[str]:
    """One line per pydantic error: dotted key path, what is wrong, what is allowed."""
    lines = []
    for item in err.errors():
        loc, kind = _untag(tuple(item["loc"]))
        path = (
            ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")
            or "(top level)"
        )
        trainer_kind, kind = kind, item["type"]
        if kind == "extra_forbidden":
            allowed = _allowed_here(loc, trainer_kind)
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(f"{path}: unknown key{hint}; allowed: {', '.join(allowed)}")
        elif kind == "literal_error":
            lines.append(f"{path}: must be one of {item['ctx']['expected']} (got {item.get('input')!r})")
        elif kind == "invalid_trainer_kind":
            got = (
                item.get("input", {}).get("kind")
                if isinstance(item.get("input"), dict)
                else item.get("input")
            )
            lines.append(f"trainer.kind: must be one of {', '.join(map(repr, TRAINER_KINDS))} (got {got!r})")
        elif kind == "missing":
            lines.append(f"{path}: required key is missing")
        else:
            lines.append(f"{path}: {item['msg'].removeprefix('Value error, ')} (got {item.get('input')!r})")
    return lines


def load_campaign(path: Path) -> Campaign:
    """Parse and validate a campaign file; ConfigError names the file and every bad key path."""
    data = load_yaml_file(path)
    if not isinstance(data, dict):
        raise ConfigError(
            "a campaign file must be a YAML mapping (name:, trainer:, sweep:, ...)", file=str(path)
        )
    try:
        return Campaign.model_validate(data)
    except ValidationError as err:
        raise ConfigError(validation_problems(err), file=str(path)) from None
