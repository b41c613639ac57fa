"""The campaign's `trainer:` section: its `kind` names a trainer kind, whose own module gives the schema of the rest.

The campaign schema lists no kind. Every module of orchestrator/trainers/kinds/ is one kind, named as the module,
and registers its schema (a `TrainerSection` subclass with `kind: Literal["<name>"]`) when it is imported; a
section is validated by the schema of the kind it names, whose module alone is imported (a bundled campaign loads
nothing of the command kind). The kinds sit a layer above this module and are found by name, never imported by a
statement: the one seam by which the campaign schema reaches them (as launchers/registry.py finds a backend).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from orchestrator.rows import DEFAULT_KIND

KINDS_PACKAGE = "orchestrator.trainers.kinds"  # one module per trainer kind, named as the kind


class TrainerSection(BaseModel):
    """What every kind's `trainer:` section has: the kind's name. A kind's schema subclasses it."""

    model_config = ConfigDict(extra="forbid")

    kind: str


_SCHEMAS: dict[str, type[TrainerSection]] = {}


def register_schema(name: str, schema: type[TrainerSection]) -> None:
    """Make `schema` the `trainer:` section of kind `name` (orchestrator/trainers/registry.py's `register`)."""
    _SCHEMAS[name] = schema


def kind_names() -> list[str]:
    """The names of every trainer kind, sorted, none of their modules imported."""
    folders = importlib.import_module(KINDS_PACKAGE).__path__  # (the package's own module lists nothing)
    return sorted(info.name for info in pkgutil.iter_modules(folders) if not info.name.startswith("_"))


def load_kind(name: str) -> None:
    """Import the module of kind `name` (it registers itself); KeyError naming the known kinds."""
    if name not in _SCHEMAS:
        if name not in kind_names():
            raise KeyError(f"no such trainer kind {name!r}; known: {', '.join(kind_names())}")
        importlib.import_module(f"{KINDS_PACKAGE}.{name}")
    if name not in _SCHEMAS:
        raise RuntimeError(f"{KINDS_PACKAGE}.{name} registers no trainer kind called {name!r}")


def schema_of(name: str) -> type[TrainerSection]:
    """The `trainer:` schema of kind `name` (only its module is imported); KeyError as `load_kind`."""
    load_kind(name)
    return _SCHEMAS[name]


def default_section() -> TrainerSection:
    """The `trainer:` section of a campaign that has none: the default kind's, at its defaults."""
    return schema_of(DEFAULT_KIND)()


def _validate(value: Any) -> TrainerSection:
    """A `trainer:` section validated by the schema of the kind it names (DEFAULT_KIND when it names none);
    errors carry the kind after `trainer` in their location, as a pydantic tagged union's do."""
    if isinstance(value, TrainerSection):
        return value
    kind = value.get("kind", DEFAULT_KIND) if isinstance(value, dict) else DEFAULT_KIND
    known = kind_names()
    if not isinstance(kind, str) or kind not in known:
        raise PydanticCustomError("invalid_trainer_kind", "trainer.kind must be one of {kinds}",
                                  {"kinds": ", ".join(map(repr, known))})  # fmt: skip
    try:
        return schema_of(kind).model_validate(value)
    except ValidationError as err:
        tagged = [{"type": e["type"], "loc": (kind, *e["loc"]), "input": e["input"],
                   **({"ctx": e["ctx"]} if "ctx" in e else {})} for e in err.errors()]  # fmt: skip
        raise ValidationError.from_exception_data(err.title, tagged) from None  # type: ignore[arg-type]


class ByKind:
    """Annotation of the campaign's `trainer` field: validated by `_validate`; its JSON Schema is one of every
    kind's schema."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(_validate)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
                                     ) -> JsonSchemaValue:  # fmt: skip
        sections = [schema_of(name).__pydantic_core_schema__ for name in kind_names()]
        found = handler(core_schema.union_schema(sections))
        return {"oneOf": found.pop("anyOf"), **found}
