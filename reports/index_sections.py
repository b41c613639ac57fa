"""The report's sections by name: every module of reports/sections/ is one section, registered with @register, its
template (`<name>.html.j2`) beside it. The index page renders every section that applies, in its order; the
Markdown summary joins their parts in their summary order."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, ClassVar, TypeVar

from reports.index_data import IndexPage
from reports.site_format import TEMPLATE_DIR, environment

PACKAGE = "reports.sections"


class Section:
    """One section of the report: a block of the index page and a part of the Markdown summary, either optional.
    On the page, a section that does not apply leaves only its separator (a blank line)."""

    name: ClassVar[str]  # the module's name, and the id of the section's element (the nav's anchor)
    order: ClassVar[int | None]  # its place on the page, top first; None: not on the page
    summary_order: ClassVar[int | None] = None  # its place in summary.md; None: not in it
    nav: ClassVar[str] = ""  # its link's text in the page's nav, "" for none
    nav_order: ClassVar[int | None] = None  # its place in the nav, when not its place on the page

    @property
    def template(self) -> str:
        """Its template's file name, beside its module."""
        return f"{self.name}.html.j2"

    def applies(self, page: IndexPage) -> bool:
        """Whether the page shows this section."""
        return True

    def context(self, page: IndexPage) -> dict[str, Any]:
        """The names its template uses (asked only when it applies)."""
        raise NotImplementedError

    def summary(self, page: IndexPage) -> list[str]:
        """Its lines of the Markdown summary, from the blank line before its heading ([] for nothing to say)."""
        return []


_SECTIONS: dict[str, Section] = {}
S = TypeVar("S", bound=type[Section])


def register(cls: S) -> S:
    """Class decorator: the index shows `cls` as the section `cls.name`. Refuses a section defined outside its own
    module (reports/sections/<name>.py) or named as one of the site's shared templates."""
    module = f"{PACKAGE}.{cls.name}"
    if cls.__module__ != module:
        raise RuntimeError(f"report section {cls.name!r} ({cls.__qualname__}) must be defined in {module}")
    if (TEMPLATE_DIR / f"{cls.name}.html.j2").exists():
        raise RuntimeError(f"report section {cls.name!r} has the name of a template of {TEMPLATE_DIR}")
    _SECTIONS[cls.name] = cls()
    return cls


def folders() -> list[str]:
    """Where the sections' modules (and their templates) are."""
    return list(importlib.import_module(PACKAGE).__path__)


def every_section() -> list[Section]:
    """Every section, by name (every module of reports/sections/ imported); a module that registers no section of
    its name is an error."""
    for module in pkgutil.iter_modules(folders()):
        importlib.import_module(f"{PACKAGE}.{module.name}")
        if module.name not in _SECTIONS:
            raise RuntimeError(f"{PACKAGE}.{module.name} registers no report section named {module.name!r}")
    return sorted(_SECTIONS.values(), key=lambda s: s.name)


def sections() -> list[Section]:
    """The sections of the index page, in page order."""
    return sorted((s for s in every_section() if s.order is not None), key=lambda s: (s.order, s.name))


def summary_sections() -> list[Section]:
    """The sections of the Markdown summary, in summary order."""
    parts = [s for s in every_section() if s.summary_order is not None]
    return sorted(parts, key=lambda s: (s.summary_order, s.name))


def render(page: IndexPage) -> tuple[Any, list[tuple[str, str]]]:
    """The sections' HTML in page order (markup) and the nav's links, (anchor, text), of those that apply."""
    from markupsafe import Markup

    env = environment(folders())
    every = sections()
    shown = [s for s in every if s.applies(page)]
    parts = [env.get_template(s.template).render(**s.context(page)) if s in shown else "" for s in every]
    linked = sorted((s for s in shown if s.nav), key=lambda s: s.order if s.nav_order is None else s.nav_order)  # fmt: skip
    return Markup("\n".join(parts)), [(s.name, s.nav) for s in linked]
