"""The campaign's verdict sections: one top-level key per verdict kind (`parity:`), whose own module gives its schema.

The campaign schema names no verdict kind. Every module of orchestrator/judge/kinds/ is one kind, named as the
module and as its campaign key, and registers its section's schema (a pydantic model) and the key's description
when it is imported (orchestrator/judge/verdict_kinds.py's `register`). The campaign has one optional field per
kind, found by listing the package (no kind's module imported); a section is validated by its kind's schema when
a campaign has it, whose module alone is then imported (a campaign without one loads none). The kinds sit layers
above this module and are found by name, never imported by a statement, as orchestrator/spec/trainer_section.py
finds a trainer kind.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Annotated, Any

from pydantic import BaseModel, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

KINDS_PACKAGE = "orchestrator.judge.kinds"  # one module per verdict kind, named as the kind and its key

_SECTIONS: dict[str, tuple[type[BaseModel], str]] = {}


def register_section(name: str, schema: type[BaseModel], description: str) -> None:
    """Make `schema` the campaign's `<name>:` section, said so by `description` (verdict_kinds.register)."""
    _SECTIONS[name] = (schema, description)


def kind_names() -> list[str]:
    """The names of every verdict kind, sorted, none of their modules imported."""
    folders = importlib.import_module(KINDS_PACKAGE).__path__  # (the package's own module lists nothing)
    return sorted(info.name for info in pkgutil.iter_modules(folders) if not info.name.startswith("_"))


def load_kind(name: str) -> None:
    """Import the module of verdict kind `name` (it registers itself); KeyError naming the known kinds."""
    if name not in _SECTIONS:
        if name not in kind_names():
            raise KeyError(f"no such verdict kind {name!r}; known: {', '.join(kind_names())}")
        importlib.import_module(f"{KINDS_PACKAGE}.{name}")
    if name not in _SECTIONS:
        raise RuntimeError(f"{KINDS_PACKAGE}.{name} registers no verdict kind called {name!r}")


def section_of(name: str) -> tuple[type[BaseModel], str]:
    """(schema, description) of kind `name`'s campaign section (only its module is imported)."""
    load_kind(name)
    return _SECTIONS[name]


class BySection:
    """Annotation of a verdict kind's campaign field: None, or validated by the kind's schema (its module imported
    then); its JSON Schema is the schema's, or null, with the kind's description."""

    def __init__(self, name: str) -> None:
        self.name = name

    def validate(self, value: Any) -> Any:
        if value is None:
            return None
        return section_of(self.name)[0].model_validate(value)  # errors under the field's key, as a model's

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler
                                     ) -> core_schema.CoreSchema:  # fmt: skip
        # a ref'd inner schema: pydantic then gives the field no title of its own, as it gives a model's none
        return core_schema.no_info_after_validator_function(
            self.validate, core_schema.any_schema(ref=f"mbx-verdict-section-{self.name}")
        )

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
                                     ) -> JsonSchemaValue:  # fmt: skip
        return handler(core_schema.nullable_schema(section_of(self.name)[0].__pydantic_core_schema__))

    def describe(self, field_schema: dict[str, Any]) -> None:
        """The field's description, the kind's own (json_schema_extra: after the type and the default)."""
        field_schema["description"] = section_of(self.name)[1]


def campaign_fields() -> dict[str, Any]:
    """The campaign's field of every verdict kind, by its name (pydantic `create_model` field definitions)."""
    fields: dict[str, Any] = {}
    for name in kind_names():
        section = BySection(name)
        fields[name] = (Annotated[Any, section], Field(None, json_schema_extra=section.describe))
    return fields
