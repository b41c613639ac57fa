"""Verdict kinds by name: every module of orchestrator/judge/kinds/ is one kind (as parity is), registered with
@register: its campaign section, how it is judged from the store and recorded, its share of the outcome, the
points it rules out of "best", its closing lines and its records in the report view.

A kind's module is imported when the kind is first asked for (a campaign that has its section, a view holding its
records); outcome, closing, views, the runner, the lifecycle and freeze iterate the kinds here and name none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel
from rich.text import Text

from orchestrator.judge.parts import Part
from orchestrator.run.store import Store
from orchestrator.spec import verdict_section
from orchestrator.spec.campaign import Campaign

# One kind's records: JSON-able dicts, each with a `verdict` of parts.VERDICTS.
Records = list[dict[str, Any]]


class VerdictKind:
    """A kind of verdict a campaign may ask for with its own top-level section (`<name>:`)."""

    name: ClassVar[str]  # the kind's name, its module's and its campaign key
    Section: ClassVar[type[BaseModel]]  # the campaign section's schema
    description: ClassVar[str]  # the campaign key's description (`mbx schema campaign`)

    def judge(self, store: Store, name: str, campaign: Campaign) -> Records:
        """The kind's records for stored campaign `name` (its `campaign` has this kind's section),
        judged in memory from its cells' latest attempts; what the report view, freeze and `record` hold."""
        raise NotImplementedError

    def record(self, store: Store, name: str, records: Records) -> None:
        """Store the records judged by a run, resume or regate (the kind's own table; none by default)."""

    def announce(self, records: Records) -> list[Text]:
        """The lines a run prints as it records them (one per record, say)."""
        return []

    def part(self, records: Records) -> Part | None:
        """The kind's share of the campaign's outcome (orchestrator/judge/outcome.py), None without records."""
        raise NotImplementedError

    def blame(self, records: Records) -> dict[str, tuple[str, str]]:
        """Cell id → (verdict, why) of every cell a record that did not pass rules out of "best" (freeze, the
        report's and status's best, card export); the verdict FAIL or INCONCLUSIVE."""
        return {}

    def closing_lines(self, records: Records) -> list[str]:
        """The lines under the closing line (run, resume, regate, status): what did not pass, and why."""
        return []


_KINDS: dict[str, VerdictKind] = {}
T = TypeVar("T", bound=type[VerdictKind])


def register(cls: T) -> T:
    """Class decorator: make a kind available under `cls.name`, its `Section` the campaign's `<name>:` section.
    Refuses a kind whose module is not named as it is."""
    module = f"{verdict_section.KINDS_PACKAGE}.{cls.name}"
    if cls.__module__ != module:
        raise RuntimeError(f"verdict kind {cls.name!r} ({cls.__qualname__}) must be defined in {module}")
    _KINDS[cls.name] = cls()
    verdict_section.register_section(cls.name, cls.Section, cls.description)
    return cls


def names() -> list[str]:
    """The names of every verdict kind, sorted, without importing any."""
    return verdict_section.kind_names()


def get(name: str) -> VerdictKind:
    """The verdict kind called `name` (only its module is imported); KeyError lists the known names."""
    verdict_section.load_kind(name)
    return _KINDS[name]


def asked(campaign: Campaign) -> list[VerdictKind]:
    """The kinds whose section the campaign has, in name order."""
    return [get(name) for name in names() if getattr(campaign, name, None) is not None]


def asked_in_spec(spec: Mapping[str, Any]) -> bool:
    """Whether a stored campaign spec (a dict) has any verdict kind's section, without validating it."""
    return any(spec.get(name) for name in names())


def of_view(view: Any) -> dict[str, Records]:
    """Kind name → its records in a report view (`judge.views.campaign_view` puts them under the kind's name)."""
    return {name: list(getattr(view, name)) for name in names() if getattr(view, name, None)}
