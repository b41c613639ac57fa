"""The hot path: one run's iteration-line layout, learnt once, then applied to one line or to a whole span of lines with C-level builtins.

A Megatron run prints every iteration line with the same fields in the same order, so after the
first line the parser knows the key sequence. `IterationLayout.build` turns one line's body into a
row with `str.split`, `map(float)` and `itemgetter`; `build_many` turns the `findall` groups of a
regex made for that exact layout into rows column by column (`zip`, `map`), no Python code per
field. Both must give exactly what `megatron_lm.parse_iteration_fields` gives (tests check it); a
line that does not fit returns None and goes to that slow, general path.
"""

from __future__ import annotations

import math
import operator
import re
import sys
from collections import deque
from itertools import repeat
from operator import itemgetter
from typing import Any

from reports.parsers.rows import ROW_FIELDS, Row, new_row

# "key" in the iteration line → (row field or None for `extra`, int-valued?)
ITERATION_FIELDS: dict[str, tuple[str | None, bool]] = {
    "consumed samples": (None, True),
    "skipped samples": (None, True),
    "elapsed time per iteration (ms)": ("step_time_ms", False),
    "throughput per GPU (TFLOP/s/GPU)": ("tflops_per_gpu", False),
    "energy per GPU (J/iter/GPU)": (None, False),
    "power per GPU (W/GPU)": (None, False),
    "learning rate": ("lr", False),
    "global batch size": (None, True),
    "lm loss": ("loss", False),
    "loss scale": (None, False),
    "grad norm": ("grad_norm", False),
    "num zeros": (None, False),
    "params norm": (None, False),
    "max attention logit": (None, False),
    "number of skipped iterations": (None, True),
    "number of nan iterations": (None, True),
}
_SQUASHED_KEYS = frozenset(k.replace(" ", "").lower() for k in ITERATION_FIELDS)
SKIPPED_KEY = "number of skipped iterations"
NAN_KEY = "number of nan iterations"
TRAIN_ITERS_KEY = "train iters"
TIMESTAMP_KEY = "timestamp"

# Columns whose values repeat line after line: converted once per distinct string.
MEMO_FIELDS = frozenset(
    {"global batch size", "loss scale", SKIPPED_KEY, NAN_KEY, "skipped samples", TRAIN_ITERS_KEY}
)
MEMO_LIMIT = 4096

_BLANK = new_row(0)
_ZERO = repeat(0)
_WS = r"[^\S\n\r]"  # whitespace within one line (the line path splits at "\r")
# the timestamp rule of MegatronLMParser._iteration: "[dd...:...]" right before "iteration"
_STAMP = r"\[(\d\d[^\[\]\n\r\x1b:]*:[^\[\]\n\r\x1b]*)\]" + _WS + "*"
_GREEDY = "*+" if sys.version_info >= (3, 11) else "*"  # possessive: no backtracking (3.11+)
_HEAD = r"iteration" + _WS + r"+(\d+)" + _WS + "*/" + _WS + r"*(\d+)" + _WS + r"*\|"


class IterationLayout:
    """The keys of one iteration-line layout and how each maps onto the row."""

    __slots__ = (
        "keys",
        "fields",
        "iterations_per_line",
        "_row_names",
        "_row_get",
        "_extra_names",
        "_extra_get",
        "_ints",
        "_templates",
        "_memos",
    )

    def __init__(self, keys: list[str], fields: list[tuple[str, str | None, bool]]):
        self.keys = keys  # toks[0::2] of a matching body, raw (" consumed samples", ..., "")
        self.fields = fields  # (name, row field or None, int-valued) per field, in line order
        self.iterations_per_line = 1 + sum(k.count("iteration") for k in keys)
        row_idx = [(i, target) for i, (_, target, _) in enumerate(fields) if target is not None]
        extra_idx = [(i, name) for i, (name, target, _) in enumerate(fields) if target is None]
        self._row_names = tuple(name for _, name in row_idx)
        self._row_get = _getter([i for i, _ in row_idx])
        self._extra_names = tuple(name for _, name in extra_idx)
        self._extra_get = _getter([i for i, _ in extra_idx])
        self._ints = tuple(name for name, target, is_int in fields if target is None and is_int)
        self._templates: dict[bool, re.Pattern[str]] = {}
        self._memos: dict[str, _Memo] = {}

    @classmethod
    def learn(cls, toks: list[str]) -> IterationLayout | None:
        """The layout of a well-formed body split into `toks` (every field " key: value |", known
        keys spelt exactly), else None."""
        if len(toks) < 3 or len(toks) % 2 == 0 or toks[-1].strip():
            return None
        keys = toks[0::2]
        fields: list[tuple[str, str | None, bool]] = []
        for raw in keys[:-1]:
            key = raw.strip()
            if not key or raw != " " + key:
                return None
            spec = ITERATION_FIELDS.get(key)
            if spec is None and key.replace(" ", "").lower() in _SQUASHED_KEYS:
                return None  # a known key whose spaces a terminal wrap ate: the general path knows it
            target, is_int = spec or (None, False)
            fields.append((key, target, is_int))
        return cls(keys, fields)

    # ---- one line ------------------------------------------------------------------------------
    def build(self, step: int, total: int, toks: list[str]) -> Row | None:
        """The row of one body with this layout (`toks` as in `learn`), or None if a value is not
        a plain number."""
        try:
            values = list(map(float, toks[1::2]))
            extra = dict(zip(self._extra_names, self._extra_get(values), strict=False))
            for key in self._ints:
                value = extra[key]
                if not value.is_integer():
                    return None
                extra[key] = int(value)
        except (ValueError, OverflowError):
            return None
        row = _BLANK.copy()
        row["step"] = step
        row.update(zip(self._row_names, self._row_get(values), strict=False))
        extra[TRAIN_ITERS_KEY] = total
        row["extra"] = extra
        skipped = extra.get(SKIPPED_KEY)
        row["skipped"] = None if skipped is None else skipped > 0
        row["nan"] = nan_flag(row["loss"], extra.get(NAN_KEY))
        return row

    # ---- many lines ----------------------------------------------------------------------------
    def template(self, stamped: bool) -> re.Pattern[str]:
        """A regex matching a whole line of this layout (with the `[timestamp] ` before
        "iteration" when `stamped`, else at the start of the line), up to its newline."""
        pattern = self._templates.get(stamped)
        if pattern is None:
            body = "".join(
                " " + re.escape(name) + r":([^|:\n\r\x1b]" + _GREEDY + r")\|" for name, _, _ in self.fields
            )
            head = _STAMP + _HEAD if stamped else "(?m)^" + _WS + "*" + _HEAD
            pattern = self._templates[stamped] = re.compile(head + body + _WS + r"*(?=\n)")
        return pattern

    def build_many(self, groups: list[tuple[str, ...]], stamped: bool) -> tuple[list[Row], list[int]] | None:
        """(rows, steps) of `template(stamped).findall(...)` groups, built column by column; None
        if any value is not a plain number (the caller then parses those lines one by one)."""
        columns = list(zip(*groups, strict=False))
        stamps = columns.pop(0) if stamped else None
        steps = list(map(int, columns[0]))
        by_name: dict[str, Any] = {}
        try:
            totals = list(map(self._convert(TRAIN_ITERS_KEY, int), columns[1]))
            for (name, _, is_int), col in zip(self.fields, columns[2:], strict=False):
                by_name[name] = list(map(self._convert(name, int if is_int else float), col))
        except (ValueError, OverflowError):
            return None
        extra_cols: list[tuple[str, Any]] = [(name, by_name[name]) for name in self._extra_names]
        extra_cols.append((TRAIN_ITERS_KEY, totals))
        if stamps is not None:
            extra_cols.append((TIMESTAMP_KEY, stamps))
        row_cols: dict[str, Any] = {
            target: by_name[name] for name, target, _ in self.fields if target is not None
        }
        row_cols["step"] = steps
        skipped = by_name.get(SKIPPED_KEY)
        row_cols["skipped"] = None if skipped is None else list(map(operator.gt, skipped, _ZERO))
        row_cols["nan"] = _nan_column(row_cols.get("loss"), by_name.get(NAN_KEY))
        row_cols["extra"] = _dicts(extra_cols, len(steps))
        return _dicts([(name, row_cols.get(name)) for name in (*ROW_FIELDS, "extra")], len(steps)), steps

    def _convert(self, name: str, kind: type):
        """`kind` itself, or a memoised `kind` for columns whose values repeat."""
        if name not in MEMO_FIELDS:
            return kind
        memo = self._memos.get(name)
        if memo is None or len(memo) > MEMO_LIMIT:
            memo = self._memos[name] = _Memo(kind)
        return memo.__getitem__


class _Memo(dict):
    """str → converted value, filled on first sight."""

    __slots__ = ("kind",)

    def __init__(self, kind: type):
        super().__init__()
        self.kind = kind

    def __missing__(self, text: str):
        value = self[text] = self.kind(text)
        return value


def nan_flag(loss: float | None, nans: float | int | None) -> bool | None:
    """A row's `nan`: its loss is not finite, or Megatron counted a NaN iteration in the interval."""
    if loss is not None and not math.isfinite(loss):
        return True
    return None if nans is None else nans > 0


def _nan_column(losses: list[float] | None, nans: list[int] | None) -> list[bool | None] | None:
    if losses is None:
        return None if nans is None else list(map(operator.gt, nans, _ZERO))
    bad = map(operator.not_, map(math.isfinite, losses))
    if nans is None:
        return list(map(_true_or_none, bad))
    return list(map(operator.or_, bad, map(operator.gt, nans, _ZERO)))


def _true_or_none(bad: bool) -> bool | None:
    return True if bad else None


def _dicts(columns: list[tuple[str, list[Any] | None]], n: int) -> list[dict[str, Any]]:
    """`n` dicts from named columns (None: every value None), keys in column order. Columns that
    hold one value throughout (loss scale, batch size, counts...) go into a template that is
    copied per row; the others are filled in with `dict.update`, all in C."""
    template: dict[str, Any] = {}
    names: list[str] = []
    values: list[list[Any]] = []
    for name, col in columns:
        if col is None:
            template[name] = None
        elif not isinstance(col[0], dict) and col.count(col[0]) == n:  # never share a mutable value
            template[name] = col[0]
        else:
            template[name] = None
            names.append(name)
            values.append(col)
    rows = list(map(dict.copy, repeat(template, n)))
    if names:
        deque(map(dict.update, rows, map(zip, repeat(names), zip(*values, strict=True))), maxlen=0)
    return rows


def _getter(indices: list[int]):
    """`itemgetter` that always returns a tuple."""
    if not indices:
        return lambda values: ()
    if len(indices) == 1:
        i = indices[0]
        return lambda values: (values[i],)
    return itemgetter(*indices)
