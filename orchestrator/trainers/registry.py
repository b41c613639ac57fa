"""Trainer kinds by name: every module of orchestrator/trainers/kinds/ is one kind, registered with @register.

A kind's module is imported when the kind is first asked for (orchestrator/spec/trainer_section.py finds it by
name): a bundled campaign's `validate` loads nothing of the command kind (its argv templates, Megatron layout
rules, log parsers).
"""

from __future__ import annotations

from typing import TypeVar, get_args

from orchestrator.spec import trainer_section
from orchestrator.trainers.base import TrainerKind

_KINDS: dict[str, TrainerKind] = {}
T = TypeVar("T", bound=type[TrainerKind])


def register(cls: T) -> T:
    """Class decorator: make a kind available under `cls.name`, its `Section` the campaign's `trainer:` schema of
    that name. Refuses a kind whose module is not named as it is, or whose section names another kind."""
    module = f"{trainer_section.KINDS_PACKAGE}.{cls.name}"
    if cls.__module__ != module:
        raise RuntimeError(f"trainer kind {cls.name!r} ({cls.__qualname__}) must be defined in {module}")
    if get_args(cls.Section.model_fields["kind"].annotation) != (cls.name,):
        raise RuntimeError(f"{cls.__qualname__}.Section must have `kind: Literal[{cls.name!r}]`")
    _KINDS[cls.name] = cls()
    trainer_section.register_schema(cls.name, cls.Section)
    return cls


def names() -> list[str]:
    """The names of every kind, sorted, without importing any."""
    return trainer_section.kind_names()


def get(name: str) -> TrainerKind:
    """The trainer kind called `name` (only its module is imported); KeyError lists the known names."""
    trainer_section.load_kind(name)
    return _KINDS[name]


def every_kind() -> dict[str, TrainerKind]:
    """Every trainer kind, by name (every kind's module imported)."""
    return {name: get(name) for name in names()}
