"""Launcher backends by name: every module of `launchers.backends` is one backend, registered with @register."""

from __future__ import annotations

import importlib
import pkgutil
from typing import TypeVar

from launchers.base import Launcher, LauncherSettings

_BACKENDS: dict[str, type[Launcher]] = {}
T = TypeVar("T", bound=type[Launcher])


def register(cls: T) -> T:
    """Class decorator: make a backend available under `cls.name`; refuses a name taken by another class."""
    known = _BACKENDS.get(cls.name)
    same = known is not None and (known.__module__, known.__qualname__) == (cls.__module__, cls.__qualname__)
    if known is not None and not same:  # (the same class again: its module was reloaded)
        raise RuntimeError(f"launcher name {cls.name!r} registered twice ({known} and {cls})")
    _BACKENDS[cls.name] = cls
    return cls


def _load_all() -> None:
    import launchers.backends

    for info in pkgutil.iter_modules(launchers.backends.__path__):
        importlib.import_module(f"launchers.backends.{info.name}")
    unlisted = sorted(set(_BACKENDS) - set(launchers.backends.MODULES))
    if unlisted:
        raise RuntimeError(f"launcher backend(s) {', '.join(unlisted)} missing from launchers.backends.MODULES")


def names() -> list[str]:
    """The names of all backends, sorted, without importing any."""
    from launchers.backends import MODULES

    return sorted(MODULES)


def backends() -> dict[str, type[Launcher]]:
    """All registered backends, by name."""
    _load_all()
    return dict(sorted(_BACKENDS.items()))


def get(name: str) -> type[Launcher]:
    """The backend called `name` (only its module is imported); KeyError lists the known names."""
    from launchers.backends import MODULES

    if name not in MODULES:
        raise KeyError(f"no such launcher {name!r}; known: {', '.join(names())}")
    if name not in _BACKENDS:
        importlib.import_module(f"launchers.backends.{MODULES[name]}")
    if name not in _BACKENDS:
        raise RuntimeError(f"launchers.backends.{MODULES[name]} registers no backend called {name!r}")
    return _BACKENDS[name]


def settings_model(name: str) -> type[LauncherSettings]:
    """The settings model of backend `name` (the campaign's `launchers.<name>` section); KeyError as `get`."""
    return get(name).Settings
