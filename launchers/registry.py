"""Launcher backends by name: every module in this package registers its class with @register."""

from __future__ import annotations

import importlib
import pkgutil
from typing import TypeVar

from launchers.base import Launcher

_BACKENDS: dict[str, type[Launcher]] = {}
_NOT_BACKENDS = {"base", "registry", "jobenv"}
T = TypeVar("T", bound=type[Launcher])


def register(cls: T) -> T:
    """Class decorator: make a backend available under `cls.name`; refuses duplicates."""
    if cls.name in _BACKENDS and _BACKENDS[cls.name] is not cls:
        raise RuntimeError(f"launcher name {cls.name!r} registered twice ({_BACKENDS[cls.name]} and {cls})")
    _BACKENDS[cls.name] = cls
    return cls


def _load_all() -> None:
    import launchers

    for info in pkgutil.iter_modules(launchers.__path__):
        if info.name not in _NOT_BACKENDS and not info.name.startswith("_"):
            importlib.import_module(f"launchers.{info.name}")


def backends() -> dict[str, type[Launcher]]:
    """All registered backends, by name."""
    _load_all()
    return dict(sorted(_BACKENDS.items()))


def get(name: str) -> type[Launcher]:
    """The backend called `name`; KeyError lists the known names."""
    known = backends()
    if name not in known:
        raise KeyError(f"no such launcher {name!r}; known: {', '.join(known)}")
    return known[name]
