"""Read a torch.profiler (Kineto) Chrome trace into time per kernel class per profiled step, with idle and overlap.

GPU traces: every kernel, memcpy and memset is classified by reports/kernels.py with its launch context
(the CPU op / `record_function` stack around the `cudaLaunchKernel` of the same correlation id); times are
kernel durations summed per class, so overlapping streams can add up to more than the wall time:
`overlap_ms` says by how much, `idle_ms` is window time with no GPU activity at all, `exposed_comm_ms`
is communication (MoE exchange included) that no compute kernel ran beside. CPU-only traces (the bundled
trainer on a CPU) get the same figures from the CPU ops' self times. The window is the union of the
`ProfilerStep#N` ranges trainer/profiling.py records (else the whole trace).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reports import limits
from reports.json_stream import JsonStream, list_member
from reports.kernels import COMMUNICATION, IDLE, MEMCPY, MOE_EXCHANGE, classify

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
CPU_CATEGORIES = frozenset({"cpu_op", "user_annotation", "python_function"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "runtime"})
STEP_RANGE = re.compile(r"^ProfilerStep#(\d+)$")
CONTEXT_DEPTH = 16  # innermost enclosing ranges kept per launch
TOP_KERNELS = 5
_US_PER_MS = 1000.0
MAX_TIME_US = 1e18  # |ts| and dur past this (31,000 years in µs) are no profiler's: sums of them stay finite


@dataclass
class TraceBreakdown:
    """Where the time of the profiled steps went, per step (ms)."""

    device: str  # "gpu" (kernel time) or "cpu" (CPU op self time: a trace without GPU activity)
    steps: int
    window_ms: float  # wall time of one profiled step
    classes: dict[str, float]  # class -> ms per step, IDLE included
    overlap_ms: float = 0.0  # summed class time beyond the busy time (concurrent streams/threads)
    exposed_comm_ms: float = 0.0  # communication with no compute beside it
    top: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # class -> [(name, ms/step)]
    source: str = ""
    hta: dict[str, float] | None = None  # reports/profile_hta.py (GPU traces, HTA installed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device, "steps": self.steps, "window_ms": self.window_ms, "classes": self.classes,
            "overlap_ms": self.overlap_ms, "exposed_comm_ms": self.exposed_comm_ms,
            "top": {k: [list(p) for p in v] for k, v in self.top.items()}, "source": self.source,
            "hta": self.hta,
        }  # fmt: skip


def load_events(path: Path) -> list[dict[str, Any]]:
    """The complete ("X") events of a Chrome trace object (.json or .json.gz), each cut down to what the breakdown
    reads (ph, cat, name, ts, dur, pid, tid, args.correlation; names interned and cut at
    limits.MAX_TRACE_NAME_CHARS). Read as a stream, so memory follows the events kept: ValueError when it is not a
    Chrome trace object with timed complete events; LimitError (a ValueError) past limits.MAX_TRACE_BYTES on disk
    or inflated, past limits.MAX_TRACE_EVENTS events, for one event larger than limits.MAX_TRACE_VALUE_CHARS, or
    nested past limits.MAX_JSON_DEPTH. ValueError naming the event and the field for a field no profiler writes (a
    name or category that is not a string, an id that is a list or an object, a time that is not a finite number,
    a negative duration), where the figures would be nan, negative or an internal error."""
    path = Path(path)
    chunks = limits.text_chunks_bounded(path, limits.MAX_TRACE_BYTES, "a profiler trace")
    stream = JsonStream(chunks, path, limits.MAX_TRACE_VALUE_CHARS)
    names: dict[str, str] = {}
    events = []
    for count, event in enumerate(list_member(stream, "traceEvents", "a Chrome trace object"), start=1):
        if count > limits.MAX_TRACE_EVENTS:
            raise limits.LimitError(f"{path}: more than {limits.MAX_TRACE_EVENTS:,} events (the limit for a profiler "
                                    "trace: profile fewer steps or ranks)")  # fmt: skip
        if event.__class__ is dict and event.get("ph") == "X" and event.get("ts") is not None:
            try:  # a complete event without a time is nowhere in the steps
                events.append(_kept(event, names))
            except _BadField as err:
                raise ValueError(f"{path}: not a profiler trace: event {count:,} of its traceEvents: {err}") from None  # fmt: skip
    if not events:
        raise ValueError(f"{path}: not a profiler trace: no timed complete events (ph \"X\" with ts) among its "
                         "traceEvents")  # fmt: skip
    return events


class _BadField(ValueError):
    """One field of one event is not what a Chrome trace holds there (the message names the field)."""


_SCALARS = (str, int, float, type(None))  # what an id (pid, tid, correlation) may be: hashable, printable


def _kept(event: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """What the breakdown reads of one event (a missing one None); repeated names and categories share one string.
    _BadField for a field of the wrong type, a time that is not a finite number, or a negative duration."""
    get = event.get
    name, cat = get("name") or "", get("cat")
    if name.__class__ is not str or cat.__class__ not in (str, type(None)):
        field_name, value = ("name", name) if name.__class__ is not str else ("cat", cat)
        raise _BadField(f"{field_name!r} is {_kind(value)} (a string is allowed)")
    name = name[: limits.MAX_TRACE_NAME_CHARS]  # the same string when it is shorter
    name = names.setdefault(name, name)
    if cat is not None:
        cat = names.setdefault(cat, cat)
    kept = {"ph": "X", "cat": cat, "name": name, "ts": _time(get("ts"), "ts"), "dur": _time(get("dur"), "dur"),
            "pid": _scalar(get("pid"), "pid"), "tid": _scalar(get("tid"), "tid")}  # fmt: skip
    args = get("args")
    if args.__class__ is dict and "correlation" in args:
        kept["args"] = {"correlation": _scalar(args["correlation"], "args.correlation")}
    return kept


def _kind(value: Any) -> str:
    """How a field's value is shown in a refusal: its JSON type, or its first 40 characters."""
    if value.__class__ is bool:
        return "true" if value else "false"
    if value.__class__ in (dict, list):
        return "an object" if value.__class__ is dict else "a list"
    if value.__class__ is int and abs(value) >= 10**40:
        return f"an integer of {len(str(abs(value))):,} digits"
    return repr(value)[:40]


def _scalar(value: Any, key: str) -> Any:
    if value.__class__ not in _SCALARS:
        raise _BadField(f"{key!r} is {_kind(value)} (a number or a string is allowed)")
    return value


def _time(value: Any, key: str) -> float | None:
    """A start (ts) or duration (dur) in µs: a finite number within ±MAX_TIME_US, a duration ≥ 0 (dur may be
    missing)."""
    if value is None and key == "dur":
        return None
    if value.__class__ not in (int, float) or not -MAX_TIME_US <= value <= MAX_TIME_US:  # nan, inf, 10**400
        raise _BadField(f"{key!r} is {_kind(value)} (a finite number of microseconds, at most {MAX_TIME_US:.0e}, "
                        "is allowed)")  # fmt: skip
    if key == "dur" and value < 0:
        raise _BadField(f"'dur' is {value!r} (a duration is at least 0)")
    return value


def _span(event: dict[str, Any]) -> tuple[float, float]:
    start = float(event.get("ts", 0.0))
    return start, start + float(event.get("dur", 0.0) or 0.0)


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by the intervals [starts[i], ends[i])."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    fresh = np.empty(len(s), dtype=bool)
    fresh[0] = True
    fresh[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(fresh)
    last = np.r_[first[1:] - 1, len(s) - 1]
    return float(np.sum(reach[last] - s[first]))


def step_windows(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The CPU-side ProfilerStep#N ranges (the GPU work of a step ends inside it: the step synchronizes)."""
    return sorted(
        _span(e) for e in events
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and STEP_RANGE.match(str(e.get("name", "")))
    )  # fmt: skip


def _nesting(
    ranges: list[dict[str, Any]], points: list[dict[str, Any]]
) -> tuple[dict[int, tuple], list[float]]:
    """Per thread sweep: the enclosing range names of each point (by id), and each range's self time."""
    items = [(float(r["ts"]), -float(r.get("dur", 0.0) or 0.0), 0, i) for i, r in enumerate(ranges)]
    items += [(float(p["ts"]), 0.0, 1, i) for i, p in enumerate(points)]
    items.sort()
    self_time = [float(r.get("dur", 0.0) or 0.0) for r in ranges]
    contexts: dict[int, tuple] = {}
    stack: list[tuple[float, int]] = []  # (end, range index)
    for ts, neg_dur, kind, index in items:
        while stack and stack[-1][0] <= ts:
            stack.pop()
        if kind == 1:
            contexts[index] = tuple(ranges[j]["name"] for _, j in reversed(stack[-CONTEXT_DEPTH:]))
            continue
        if stack:
            self_time[stack[-1][1]] -= -neg_dur
        stack.append((ts - neg_dur, index))
    return contexts, self_time


def launch_contexts(events: list[dict[str, Any]]) -> dict[Any, tuple[str, ...]]:
    """correlation id -> names of the CPU ranges around the launch, innermost first."""
    by_tid: dict[Any, tuple[list, list]] = defaultdict(lambda: ([], []))
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat in CPU_CATEGORIES:
            by_tid[(e.get("pid"), e.get("tid"))][0].append(e)
        elif cat in LAUNCH_CATEGORIES and "correlation" in (e.get("args") or {}):
            by_tid[(e.get("pid"), e.get("tid"))][1].append(e)
    out: dict[Any, tuple[str, ...]] = {}
    for ranges, launches in by_tid.values():
        if not launches:
            continue
        contexts, _ = _nesting(ranges, launches)
        for i, launch in enumerate(launches):
            out[launch["args"]["correlation"]] = contexts.get(i, ())
    return out


class _Windows:
    """The union of the step windows, merged and sorted once: `start in windows` by bisection (O(log n) per
    event: a trace of 75,000 steps took minutes when every event looked at every window). No windows: all in."""

    def __init__(self, windows: list[tuple[float, float]]):
        merged: list[list[float]] = []
        for a, b in sorted(windows):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.everything = not windows
        self.starts = [a for a, _ in merged]
        self.ends = [b for _, b in merged]

    def __contains__(self, start: float) -> bool:
        if self.everything:
            return True
        i = bisect_right(self.starts, start) - 1
        return i >= 0 and start < self.ends[i]


def _summarize(
    rows: list[tuple[str, str, float, float, float]], windows: list[tuple[float, float]], steps: int
) -> dict[str, Any]:
    """rows: (class, name, start, end, counted µs) inside the window -> per-step class ms, idle, overlap."""
    window_us = sum(b - a for a, b in windows)
    per_class: dict[str, float] = defaultdict(float)
    per_name: dict[tuple[str, str], float] = defaultdict(float)
    for cls, name, _s, _e, counted in rows:
        per_class[cls] += counted
        per_name[(cls, name)] += counted
    starts = np.array([r[2] for r in rows], dtype=float)
    ends = np.array([r[3] for r in rows], dtype=float)
    busy = union_length(starts, ends)
    comm = np.array([r[0] in (COMMUNICATION, MOE_EXCHANGE) for r in rows], dtype=bool)
    compute = ~comm & np.array([r[0] != MEMCPY for r in rows], dtype=bool)
    comm_len = union_length(starts[comm], ends[comm])
    overlap_cc = (
        comm_len
        + union_length(starts[compute], ends[compute])
        - union_length(starts[comm | compute], ends[comm | compute])
    )
    classes = {c: v / steps / _US_PER_MS for c, v in per_class.items()}
    classes[IDLE] = max(window_us - busy, 0.0) / steps / _US_PER_MS
    top: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for (cls, name), us in sorted(per_name.items(), key=lambda kv: -kv[1]):
        if len(top[cls]) < TOP_KERNELS:
            top[cls].append((name, us / steps / _US_PER_MS))
    return {
        "window_ms": window_us / steps / _US_PER_MS, "classes": classes,
        "overlap_ms": max(sum(per_class.values()) - busy, 0.0) / steps / _US_PER_MS,
        "exposed_comm_ms": max(comm_len - overlap_cc, 0.0) / steps / _US_PER_MS, "top": dict(top),
    }  # fmt: skip


def gpu_annotation_contexts(
    events: list[dict[str, Any]], kernels: list[dict[str, Any]]
) -> list[tuple[str, ...]]:
    """Per kernel, the `gpu_user_annotation` ranges (record_function ranges as the GPU ran them) around its
    start on its device, innermost first: the context of traces cut down to GPU events (benchmarks/trim_trace.py)."""
    ranges: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if (
            e.get("ph") == "X"
            and e.get("cat") == "gpu_user_annotation"
            and not STEP_RANGE.match(str(e.get("name")))
        ):
            ranges[e.get("pid")].append(e)
    out: list[tuple[str, ...]] = [()] * len(kernels)
    by_pid: dict[Any, list[int]] = defaultdict(list)  # one pass over the kernels, not one per device
    for i, k in enumerate(kernels):
        by_pid[k.get("pid")].append(i)
    for pid, around in ranges.items():
        index = by_pid.get(pid, [])
        contexts, _ = _nesting(around, [kernels[i] for i in index])
        for j, i in enumerate(index):
            out[i] = contexts.get(j, ())
    return out


def _gpu_rows(events: list[dict[str, Any]], windows: list[tuple[float, float]]) -> list[tuple]:
    """Kernels, copies and sets that start inside the window, classified with their launch context (the CPU
    stack), else with the GPU-side annotation ranges around them."""
    launched = launch_contexts(events)
    inside = _Windows(windows)
    gpu, spans = [], []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES:
            span = _span(e)
            if span[0] in inside:
                gpu.append(e)
                spans.append(span)
    contexts = [launched.get((e.get("args") or {}).get("correlation"), ()) for e in gpu]
    bare = [i for i, c in enumerate(contexts) if not c]
    for i, around in zip(bare, gpu_annotation_contexts(events, [gpu[i] for i in bare]), strict=True):
        contexts[i] = around
    rows = []
    for e, context, (start, end) in zip(gpu, contexts, spans, strict=True):
        name = str(e.get("name", ""))
        cls = MEMCPY if e.get("cat") != "kernel" else classify(name, context)
        rows.append((cls, name, start, end, end - start))
    return rows


def _cpu_rows(events: list[dict[str, Any]], windows: list[tuple[float, float]]) -> list[tuple]:
    """CPU ops by self time (a range's time less its children's), classified with their enclosing ranges."""
    by_tid: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if (
            e.get("ph") == "X"
            and e.get("cat") in CPU_CATEGORIES
            and not STEP_RANGE.match(str(e.get("name", "")))
        ):
            by_tid[(e.get("pid"), e.get("tid"))].append(e)
    rows = []
    inside = _Windows(windows)
    for ranges in by_tid.values():
        contexts, self_time = _nesting(ranges, ranges)  # each range as its own point: its ancestors
        for i, r in enumerate(ranges):
            start, end = _span(r)
            if self_time[i] > 0 and r.get("cat") == "cpu_op" and start in inside:
                name = str(r.get("name", ""))
                rows.append((classify(name, contexts.get(i, ())[1:]), name, start, end, self_time[i]))
    return rows


def breakdown_of(
    events: list[dict[str, Any]], steps_hint: int | None = None, source: str = ""
) -> TraceBreakdown:
    """The breakdown of one trace's events (GPU activity if any, else CPU ops)."""
    windows = step_windows(events)
    steps = len(windows) or steps_hint or 1
    gpu = any(e.get("cat") in GPU_CATEGORIES for e in events)
    rows = _gpu_rows(events, windows) if gpu else _cpu_rows(events, windows)
    if not windows:
        spans = [_span(e) for e in events if e.get("ph") == "X" and "ts" in e]
        windows = [(min(a for a, _ in spans), max(b for _, b in spans))] if spans else [(0.0, 0.0)]
    return TraceBreakdown(device="gpu" if gpu else "cpu", steps=steps, source=source,
                          **_summarize(rows, windows, steps))  # fmt: skip
