"""`outside_compile`: torch.compiler.disable, applied when it can matter, so importing the trainer does not import
torch._dynamo (`@torch.compiler.disable` at import costs every trainer process ~1-4 s of CPU).

Nothing can compile before torch._dynamo is imported, so until then a marked function is called as it is. From
its first call after that, or from `install()` (which `trainer.parallelize` calls before `torch.compile`), the
module or class attribute that held the marker is replaced by `torch.compiler.disable(fn)`: what torch.compile
sees from then on is exactly what decorating the function at import would have given it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])
_PENDING: list[Callable[[], Callable[..., Any]]] = []  # the `install` of each marker not yet replaced


def install() -> None:
    """Replace every marker by torch.compiler.disable(fn) now (imports torch._dynamo): call before torch.compile,
    so a compiled function never traces a marker."""
    for replace in list(_PENDING):
        replace()


def outside_compile(fn: F) -> F:
    """Mark a module-level function or a method (not a nested function) to run outside torch.compile's tracing."""
    *owner_path, name = fn.__qualname__.split(".")
    if "<locals>" in owner_path:
        raise TypeError(f"outside_compile: {fn.__qualname__} is a nested function (no attribute to replace)")
    disabled: Callable[..., Any] | None = None

    def replace() -> Callable[..., Any]:
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)
            owner: Any = sys.modules[fn.__module__]
            for part in owner_path:
                owner = getattr(owner, part)
            if vars(owner).get(name) is marker:
                setattr(owner, name, disabled)
            _PENDING.remove(replace)
        return disabled

    @functools.wraps(fn)
    def marker(*args: Any, **kwargs: Any) -> Any:
        if disabled is None and "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)  # nothing is compiling: torch.compile imports torch._dynamo first
        return replace()(*args, **kwargs)

    _PENDING.append(replace)
    return marker  # type: ignore[return-value]
