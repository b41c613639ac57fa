"""CUDA green contexts for the MoE dispatcher: detect torch's API of the day, make a context of N SMs, take its stream.

A green context confines the kernels launched on its stream to a subset of the GPU's SMs, so the
memory-bound permutation (dispatch/combine) can run beside the expert GEMMs on an ordinary stream,
which then get the remaining SMs (two ordinary streams do not overlap there: the GEMMs take every SM).

torch's API differs between releases, so it is detected at run time from the signature:
- torch 2.11: `GreenContext.create(num_sms, device_id)` (positional), methods `Stream`, `set_context`,
  `pop_context`;
- torch 2.13: `GreenContext.create(*, num_sms=None, workqueue_scope=None, workqueue_concurrency_limit=None,
  device_id=None)` (keyword-only), plus `Stream`;
- a later release may build one with the constructor (`GreenContext(num_sms=..., device_id=...)`).
Where it cannot work (no CUDA, no `torch.cuda.green_contexts`, a build or driver without green contexts,
more SMs than the GPU has) `dispatcher_stream` raises NotSupportedError naming `model.moe.dispatcher_sms`,
at Trainer construction, before any step runs.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

import torch

from trainer.support import NotSupportedError

GreenAPI = Literal["keyword", "positional", "constructor", "unknown"]
KEY = "model.moe.dispatcher_sms"


def detect_api(green_context_cls: Any) -> GreenAPI | None:
    """How this torch builds a green context of N SMs; None = it cannot.

    "keyword": `create(*, num_sms=..., device_id=...)`; "positional": `create(num_sms, device_id)`;
    "constructor": `GreenContext(num_sms=..., device_id=...)`; "unknown": a `create` whose signature
    cannot be read (a C builtin): `create_green_context` tries keywords, then positions.
    """
    create = getattr(green_context_cls, "create", None)
    if create is not None:
        try:
            params = inspect.signature(create).parameters
        except (TypeError, ValueError):
            return "unknown"
        num_sms = params.get("num_sms")
        if num_sms is not None and num_sms.kind is inspect.Parameter.KEYWORD_ONLY:
            return "keyword"
        positional = [p for p in params.values()
                      if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        if positional or any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values()):
            return "positional"
        return "keyword" if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) else None
    if callable(green_context_cls):
        try:
            params = inspect.signature(green_context_cls).parameters
        except (TypeError, ValueError):
            return None
        if "num_sms" in params:
            return "constructor"
    return None


def create_green_context(green_context_cls: Any, num_sms: int, device_index: int) -> Any:
    """A green context of `num_sms` SMs on device `device_index`, through whichever API this torch has."""
    api = detect_api(green_context_cls)
    if api == "keyword":
        return green_context_cls.create(num_sms=num_sms, device_id=device_index)
    if api == "positional":
        return green_context_cls.create(num_sms, device_index)
    if api == "constructor":
        return green_context_cls(num_sms=num_sms, device_id=device_index)
    if api == "unknown":
        try:
            return green_context_cls.create(num_sms=num_sms, device_id=device_index)
        except TypeError:
            return green_context_cls.create(num_sms, device_index)
    raise TypeError(f"{green_context_cls!r} offers no known way to create a green context of N SMs")


def context_stream(context: Any) -> Any:
    """The CUDA stream whose kernels run on the context's SMs (`Stream()` in torch 2.11-2.13)."""
    for name in ("Stream", "stream"):
        make = getattr(context, name, None)
        if callable(make):
            return make()
    raise TypeError(f"{type(context).__name__} has no Stream() method")


def green_context_class() -> Any:
    """torch.cuda.green_contexts.GreenContext, or NotSupportedError saying why there is none."""
    try:
        from torch.cuda import green_contexts
    except ImportError as err:
        raise NotSupportedError(f"{KEY}: torch {torch.__version__} has no torch.cuda.green_contexts ({err})") from err
    if not getattr(green_contexts, "SUPPORTED", True):
        raise NotSupportedError(f"{KEY}: torch {torch.__version__} was built without CUDA green-context support")
    return green_contexts.GreenContext


def dispatcher_stream(num_sms: int, device: torch.device) -> tuple[Any, Any]:
    """(green context, its stream) of `num_sms` SMs on `device`; NotSupportedError where that cannot work.

    Keep the context referenced as long as its stream is used.
    """
    if device.type != "cuda" or not torch.cuda.is_available():
        raise NotSupportedError(f"{KEY}={num_sms}: green contexts need a CUDA GPU; this run is on {device.type}")
    cls = green_context_class()
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    if num_sms > props.multi_processor_count:
        raise NotSupportedError(f"{KEY}={num_sms}: more than the {props.multi_processor_count} SMs of {props.name}")
    try:
        context = create_green_context(cls, num_sms, index)
        stream = context_stream(context)
    except (RuntimeError, TypeError) as err:
        raise NotSupportedError(
            f"{KEY}={num_sms}: could not create a green context of {num_sms} SMs on {props.name} with torch "
            f"{torch.__version__} (green contexts need CUDA 12.4+ and a driver that supports them): {err}"
        ) from err
    return context, stream
