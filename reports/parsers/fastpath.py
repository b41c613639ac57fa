"""The hot path: one run's iteration-line layout, learnt once, then applied to one line or to a whole span of lines with C-level builtins.

A Megatron run prints every iteration line with the same fields in the same order, so after the
first line the parser knows the key sequence. `IterationLayout.build` turns one line's body into a
row with `str.split`, `map(float)` and `itemgetter`. For many lines, `IterationLayout.split` cuts a
span of text with a regex made for that exact layout (`template`; a fast variant with cheap
character classes, checked, else the exact one) into each matched line's groups and the text
between the lines, which `MegatronLMParser._bulk` scans for other records; `build_many` converts
the groups column by column (`map`; memos for columns whose values repeat, a column constant over
the span converted once into the row templates) and makes the rows in one loop compiled for the
layout that fills copies of the templates. Both must give exactly what
`megatron_lm.parse_iteration_fields` and the line path give (tests check it, and
tests/test_parsers_speedpaths.py compares the two paths branch by branch); a line that does not fit
goes to that slow, general path.

Where the time goes (1 GB benchmark log, ~2M rows, 2-core machine, ~12 s): the regex split about a
third, `float`/`int` of the values about a quarter, filling the row dicts a fifth, the rest reading,
decoding, scanning the text between lines and freeing the rows.
"""

from __future__ import annotations

import math
import re
import sys
from operator import itemgetter
from typing import Any

from reports.parsers.rows import ROW_FIELDS, Row, new_row

# "key" in the iteration line → (row field or None for `extra`, int-valued?)
ITERATION_FIELDS: dict[str, tuple[str | None, bool]] = {
    "consumed samples": (None, True),
    "skipped samples": (None, True),
    "elapsed time per iteration (ms)": ("step_time_ms", False),
    "throughput per GPU (TFLOP/s/GPU)": ("tflops_per_gpu", False),
    "energy per GPU (J/iter/GPU)": ("energy_j", False),  # Megatron --log-energy: J per step per GPU
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
_WS = r"[^\S\n\r]"  # whitespace within one line (the line path splits at "\r")
# the timestamp rule of MegatronLMParser._iteration: "[dd...:...]" right before "iteration"
_STAMP = r"\d\d[^\[\]\n\r\x1b:]*:[^\[\]\n\r\x1b]*"
_GREEDY = "*+" if sys.version_info >= (3, 11) else "*"  # possessive: no backtracking (3.11+)
_VALUE = r"[^|:\n\r\x1b]" + _GREEDY
# the fast regex's: single-character classes (checked afterwards, see IterationLayout.split)
_FAST_STAMP = r"\d\d[^:]" + _GREEDY + r":[^\]]" + _GREEDY
_FAST_VALUE = "[^|]" + _GREEDY


class IterationLayout:
    """The keys of one iteration-line layout and how each maps onto the row."""

    __slots__ = (
        "keys",
        "fields",
        "_row_names",
        "_row_get",
        "_extra_names",
        "_extra_get",
        "_ints",
        "_variants",
        "_guesses",
        "_builders",
        "_memos",
        "_caches",
        "_cache_rows",
        "_uncached",
        "_converters",
        "_row_template_cache",
        "_constant_slots",
        "_loss",
        "_nans",
        "_skipped",
    )

    def __init__(self, keys: list[str], fields: list[tuple[str, str | None, bool]]):
        self.keys = keys  # toks[0::2] of a matching body, raw (" consumed samples", ..., "")
        self.fields = fields  # (name, row field or None, int-valued) per field, in line order
        row_idx = [(i, target) for i, (_, target, _) in enumerate(fields) if target is not None]
        extra_idx = [(i, name) for i, (name, target, _) in enumerate(fields) if target is None]
        self._row_names = tuple(name for _, name in row_idx)
        self._row_get = _getter([i for i, _ in row_idx])
        self._extra_names = tuple(name for _, name in extra_idx)
        self._extra_get = _getter([i for i, _ in extra_idx])
        self._ints = tuple(name for name, target, is_int in fields if target is None and is_int)
        self._variants: dict[tuple[Any, ...], _Variant] = {}
        self._guesses: dict[bool, tuple[tuple[int, str], ...]] = {}
        self._builders: dict[tuple[Any, ...], Any] = {}
        self._memos: dict[tuple[str, type], _Memo] = {}  # columns whose values repeat (MEMO_FIELDS)
        self._caches: dict[str, _Memo] = {}  # the same for the other columns, while it pays
        self._cache_rows: dict[str, int] = {}  # lines converted since each cache started
        self._uncached: set[str] = set()  # columns whose values did not repeat enough
        self._converters: list[Any] | None = None  # per slot (train iters, then the fields)
        self._row_template_cache: dict[tuple[Any, ...], tuple[Row, dict[str, Any]]] = {}
        # memoised columns that may go into the templates: train iters (-1) and the fields in
        # MEMO_FIELDS whose key no other field of the line (nor train iters, timestamp) writes
        keys = [target or name for name, target, _ in fields] + [TRAIN_ITERS_KEY, TIMESTAMP_KEY]
        memoised = [(i, keys[i]) for i, (name, _, _) in enumerate(fields) if name in MEMO_FIELDS]
        memoised.append((-1, TRAIN_ITERS_KEY))
        self._constant_slots = frozenset(i for i, key in memoised if keys.count(key) == 1)
        # the fields whose values the row keeps for `loss` and the skipped / NaN flags (the last)
        self._loss = _last(fields, lambda name, target: target == "loss")
        self._nans = _last(fields, lambda name, target: name == NAN_KEY)
        self._skipped = _last(fields, lambda name, target: name == SKIPPED_KEY)

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
    def variant(self, stamped: bool, fast: bool = False, fixed: tuple[tuple[int, str], ...] = ()) -> _Variant:
        """The regex for whole lines of this layout and how its `split` items map onto fields.

        The regex matches a line with the `[timestamp] ` before "iteration" when `stamped`, else
        at the start of the line, up to its newline. Its groups hold every part of the line that
        is not literal text (`line_text` puts it back together): the timestamp, whitespace, the
        step and train iters with the whitespace around them (which `int` skips), the values,
        trailing whitespace.

        `fast`: the same with cheaper character classes (sre runs `[^|]*` and ` *` in a tight
        loop, the exact classes about ten times slower): its whitespace is only spaces, which
        rejects some lines the exact regex takes (`MegatronLMParser._bulk` then splits with the
        exact one); its values and timestamp may hold more than the exact regex lets through
        (`split` checks them). `fixed` ((field index or -1 for train iters, text) pairs, fast
        only): those values written into the regex, so that they cost no group (`guess`)."""
        key = (stamped, fast, fixed)
        found = self._variants.get(key)
        if found is None:
            if len(self._variants) > 64:
                self._variants.clear()
            found = self._variants[key] = _Variant(self, stamped, fast, dict(fixed))
        return found

    def template(self, stamped: bool, fast: bool = False) -> re.Pattern[str]:
        """The regex of `variant(stamped, fast)`."""
        return self.variant(stamped, fast).pattern

    def guess(self, stamped: bool) -> tuple[tuple[int, str], ...]:
        """The counters and sizes that held one value over the last span (as printed): the
        likely `fixed` values of the next."""
        return self._guesses.get(stamped, ())

    def split(
        self, text: str, stamped: bool, fast: bool = True, fixed: tuple[tuple[int, str], ...] = ()
    ) -> tuple[list[str], _Variant] | None:
        """`variant(stamped, fast, fixed).pattern.split(text)` and that variant when the fast
        regex's matches are ones the exact regex makes too (no "\r" in the text, no newline in
        a value, a timestamp without "[", "]", newline or ESC; a value holding ":" or ESC fails
        its conversion), else the exact regex's. None when a timestamp holds "iteration" (the old
        check that counted "iteration" in the text sent such text the line path)."""
        if fast and "\r" not in text:
            variant = self.variant(stamped, True, fixed)
            items = variant.pattern.split(text)
            stride = variant.stride
            if stamped:
                stamps = "".join(items[1::stride])
                if "[" in stamps or "]" in stamps or "\n" in stamps or "\x1b" in stamps:
                    return self.split(text, stamped, fast=False)
                if "iteration" in stamps:
                    return None
            # (+1: the items start with the text before the first line)
            if not any("\n" in "".join(items[i + 1 :: stride]) for i in variant.values):
                return items, variant
        variant = self.variant(stamped)
        items = variant.pattern.split(text)
        if stamped and "iteration" in "".join(items[1 :: variant.stride]):
            return None
        return items, variant

    def line_text(self, groups: list[str], variant: _Variant) -> str:
        """The text of a matched line from its groups (a slice of the `split` items)."""
        return "".join([piece if isinstance(piece, str) else groups[piece] for piece in variant.pieces])

    def build_many(self, items: list[str], variant: _Variant) -> tuple[list[Row], list[int]] | None:
        """(rows, steps) of matched lines, given as `variant.stride` items each of
        `variant.pattern.split(...)` (a line's groups, then the text after it); None if any
        value is not a plain number (the caller then parses those lines one by one).

        Values are converted column by column (`map`, no Python code per value): counters and
        sizes that repeat line after line (batch size, loss scale, skipped/NaN counts, train
        iters) through a memo, other columns through a cache while their values repeat (a
        lookup costs a quarter of a `float`: step time, throughput, grad norm printed with few
        decimals repeat). A memoised column that holds one value over all the lines (or is
        fixed in the regex) is converted once and put into the row / `extra` templates.
        Then a function compiled for this layout (`_compile`) makes the rows: one loop that
        fills copies of the templates."""
        stride = variant.stride
        stamped = variant.stamped
        index = variant.index
        n = len(items) // stride
        consts: dict[int, Any] = {}  # field index (-1: train iters) → its value in every line
        guess = []
        converters = self._converters
        if converters is None:
            converters = self._converters = [self._converter(slot) for slot in range(-1, len(self.fields))]
        try:
            columns: list[list[Any]] = [list(map(int, items[variant.step :: stride]))]  # the steps
            if stamped:
                columns.append(items[0::stride])
            for slot, convert in enumerate(converters, -1):
                text = variant.fixed.get(slot)
                if text is None:
                    texts = items[index[slot] :: stride]
                    if slot in self._constant_slots:
                        text = texts[0]
                        if texts.count(text) != n:
                            text = None
                if text is not None:
                    value = convert(text)
                    if slot != self._nans or self._loss is None or not value > 0:
                        consts[slot] = value
                        guess.append((slot, text))
                        continue
                    texts = [text] * n
                columns.append(list(map(convert, texts)))
        except (ValueError, OverflowError):
            return None
        if n >= 8:  # (a counter that changes every few lines is not worth guessing)
            self._guesses[stamped] = tuple(guess)
        self._settle_caches(n)
        key = (stamped, *consts)
        build = self._builders.get(key)
        if build is None:
            build = self._builders[key] = self._compile(stamped, frozenset(consts))
        templates = self._row_template_cache
        key = (stamped, *consts.items())
        pair = templates.get(key)
        if pair is None:
            if len(templates) > 64:
                templates.clear()
            pair = templates[key] = self._row_templates(stamped, consts)
        row, extra = pair
        return build(row.copy, extra.copy, *columns), columns[0]

    def _converter(self, slot: int):
        """str → value for field `slot` (-1: train iters): `int`/`float`, or a memo's lookup."""
        if slot < 0:
            name, is_int = TRAIN_ITERS_KEY, True
        else:
            name, _, is_int = self.fields[slot]
        kind = int if is_int else float
        if slot < 0 or name in MEMO_FIELDS:
            memo = self._memos.get((name, kind))
            if memo is None:
                memo = self._memos[name, kind] = _Memo(kind)
            return memo.__getitem__
        if name in self._uncached:
            return kind
        cache = self._caches.get(name)
        if cache is None:
            cache = self._caches[name] = _Memo(kind)
        return cache.__getitem__

    def _settle_caches(self, n: int) -> None:
        """After `n` more lines: a memo that grew past `MEMO_LIMIT` starts over; so does a full
        cache if most lookups found their value, else its column is converted directly from
        then on (learning rate, losses...)."""
        for key, memo in self._memos.items():
            if len(memo) > MEMO_LIMIT:
                self._memos[key] = _Memo(memo.kind)
                self._converters = None
        rows = self._cache_rows
        for name, cache in list(self._caches.items()):
            rows[name] = rows.get(name, 0) + n
            if len(cache) > MEMO_LIMIT:
                if len(cache) * 2 > rows[name]:
                    self._uncached.add(name)
                    del self._caches[name]
                else:
                    self._caches[name] = _Memo(cache.kind)
                    rows[name] = 0
                self._converters = None

    def _row_templates(self, stamped: bool, consts: dict[int, Any]) -> tuple[Row, dict[str, Any]]:
        """The row and `extra` dicts every row of a span starts as: None, or the constants."""
        row = dict.fromkeys((*ROW_FIELDS, "extra"))
        extra = dict.fromkeys((*self._extra_names, TRAIN_ITERS_KEY, *((TIMESTAMP_KEY,) if stamped else ())))
        for slot, value in consts.items():
            if slot < 0:
                extra[TRAIN_ITERS_KEY] = value
                continue
            name, target, _ = self.fields[slot]
            if target is None:
                extra[name] = value
            else:
                row[target] = value
            if slot == self._skipped:
                row["skipped"] = value > 0
            if slot == self._nans:  # (with a loss column, only when no NaN was counted)
                row["nan"] = value > 0 if self._loss is None else None
        return row, extra

    def _compile(self, stamped: bool, consts: frozenset[int]):
        """A function (row_copy, extra_copy, steps, [stamps,] *columns) → rows for this layout,
        `columns` holding the converted values of train iters and of each field not in `consts`
        (those are in the templates already): the same values, keys and key order as `build`
        gives line by line."""
        fields = self.fields
        args = ["s", *(["stamp"] if stamped else [])]  # loop variables: step, timestamp, values
        args += ["total" if i < 0 else f"c{i}" for i in range(-1, len(fields)) if i not in consts]
        body = ["        r = row_copy()", "        x = extra_copy()", '        r["step"] = s']
        for i, (name, target, _) in enumerate(fields):
            if i not in consts:
                body.append(f"        {'r' if target is not None else 'x'}[{target or name!r}] = c{i}")
        if -1 not in consts:
            body.append(f"        x[{TRAIN_ITERS_KEY!r}] = total")
        if stamped:
            body.append(f"        x[{TIMESTAMP_KEY!r}] = stamp")
        skipped, nans, loss = self._skipped, self._nans, self._loss
        if skipped is not None and skipped not in consts:
            body.append(f'        r["skipped"] = c{skipped} > 0')
        # a float is finite exactly when x - x == 0.0 (inf - inf and nan - nan are nan); a
        # constant NaN count is 0 here (see build_many), so `or` it would give the same bool
        if loss is not None and nans is not None and nans not in consts:
            body.append(f'        r["nan"] = c{loss} - c{loss} != 0.0 or c{nans} > 0')
        elif loss is not None and nans is not None:
            body.append(f'        r["nan"] = c{loss} - c{loss} != 0.0')
        elif loss is not None:
            body.append(f'        r["nan"] = True if c{loss} - c{loss} != 0.0 else None')
        elif nans is not None and nans not in consts:
            body.append(f'        r["nan"] = c{nans} > 0')
        body += ['        r["extra"] = x', "        add_row(r)"]
        columns = [f"{name}_column" for name in args]
        source = "\n".join(
            [
                f"def build(row_copy, extra_copy, {', '.join(columns)}):",
                "    rows = []",
                "    add_row = rows.append",
                f"    for {', '.join(args)}, in zip({', '.join(columns)}):",
                *body,
                "    return rows",
            ]
        )
        namespace: dict[str, Any] = {}
        exec(compile(source, f"<iteration layout {id(self):x}>", "exec"), namespace)  # noqa: S102
        return namespace["build"]


class _Variant:
    """One form of a layout's line regex (see `IterationLayout.variant`): the compiled pattern,
    how many `split` items a line adds (`stride`: its groups, then the text after it), where the
    step and each captured value sit among a line's groups (`step`, `index`; the timestamp is
    group 0 when `stamped`), the values written into the regex (`fixed`), and the literal texts
    and group numbers that put a line back together (`pieces`)."""

    __slots__ = ("stamped", "fast", "fixed", "pattern", "stride", "step", "index", "values", "pieces")

    def __init__(self, layout: IterationLayout, stamped: bool, fast: bool, fixed: dict[int, str]):
        self.stamped = stamped
        self.fast = fast
        self.fixed = fixed
        regex: list[str] = []
        pieces: list[str | int] = []
        index: dict[int, int] = {}  # field index (-1: train iters) → group number

        def literal(text: str) -> None:
            regex.append(re.escape(text))
            if pieces and isinstance(pieces[-1], str):
                pieces[-1] += text
            else:
                pieces.append(text)

        def group(pattern: str, slot: int | None = None) -> None:
            number = sum(isinstance(piece, int) for piece in pieces)
            if slot is not None:
                index[slot] = number
            regex.append("(" + pattern + ")")
            pieces.append(number)

        def value(slot: int, pattern: str) -> None:
            if slot in fixed:
                literal(fixed[slot])
            else:
                group(pattern, slot)

        # (the step and train iters come with the whitespace around them, which `int` skips; a
        # character `int` does not take as whitespace makes the conversion fail, the line go the
        # line path)
        ws = " *" if fast else _WS + "*"
        if stamped:
            literal("[")
            group(_FAST_STAMP if fast else _STAMP)
            literal("]")
        else:
            regex.append("(?m)^")
        group(ws)
        literal("iteration")
        group(" +\\d+ *" if fast else _WS + "+\\d+" + ws)
        literal("/")
        value(-1, " *\\d+ *" if fast else ws + "\\d+" + ws)
        literal("|")
        for slot, (name, _, _) in enumerate(layout.fields):
            literal(" " + name + ":")
            value(slot, _FAST_VALUE if fast else _VALUE)
            literal("|")
        group(ws)
        regex.append("(?=\\n)")
        self.pattern = re.compile("".join(regex))
        self.pieces = pieces
        self.stride = sum(isinstance(piece, int) for piece in pieces) + 1
        self.step = 2 if stamped else 1
        self.index = index
        self.values = [number for slot, number in index.items() if slot >= 0]


class _Memo(dict):
    """str → converted value, filled on first sight."""

    __slots__ = ("kind",)

    def __init__(self, kind: type):
        super().__init__()
        self.kind = kind

    def __missing__(self, text: str):
        value = self[text] = self.kind(text)
        return value


def _last(fields: list[tuple[str, str | None, bool]], match) -> int | None:
    """Index of the last field for which `match(name, target)` holds (the value a row keeps)."""
    found = None
    for i, (name, target, _) in enumerate(fields):
        if match(name, target):
            found = i
    return found


def nan_flag(loss: float | None, nans: float | int | None) -> bool | None:
    """A row's `nan`: its loss is not finite, or Megatron counted a NaN iteration in the interval."""
    if loss is not None and not math.isfinite(loss):
        return True
    return None if nans is None else nans > 0


def _getter(indices: list[int]):
    """`itemgetter` that always returns a tuple."""
    if not indices:
        return lambda values: ()
    if len(indices) == 1:
        i = indices[0]
        return lambda values: (values[i],)
    return itemgetter(*indices)
