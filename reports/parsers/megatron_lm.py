"""Megatron-LM stdout to step rows: `iteration N/M | ...` lines, `memory (MB)` lines, validation losses, argument dump.

Format strings (megatron/training/training.py `training_log`, utils `report_memory`) are quoted in
tests/data/megatron/SOURCES.md. Units: "elapsed time per iteration (ms)" → `step_time_ms`;
"memory (MB)" values are bytes / 1024**2 (MiB) and become GiB by / 1024.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import accumulate

from reports.parsers.fastpath import (
    ITERATION_FIELDS,
    NAN_KEY,
    SKIPPED_KEY,
    TIMESTAMP_KEY,
    TRAIN_ITERS_KEY,
    IterationLayout,
    nan_flag,
)
from reports.parsers.rows import Row, mib_to_gib, new_row
from reports.parsers.stream import StreamParser
from reports.parsers.text import key_values, squash, to_float, to_number

ITERATION_RE = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
MEMORY_RE = re.compile(r"(?:\[Rank (\d+)\]\s*)?\(after (\d+) iterations\) memory \((MB|GB)\)")
VALIDATION_RE = re.compile(r"\b(validation(?:-\d+)?|test) loss at iteration (\d+)([^|]*)\|")
ARGUMENT_RE = re.compile(r"^\s*(\w+) \.+ (.*?)\s*$")

_SQUASHED = {squash(k): k for k in ITERATION_FIELDS}
BULK_WINDOW = 1 << 17  # characters the bulk path takes at a time (more than a read by iter_rows)

MEMORY_MB_FIELDS: dict[str, str] = {
    "allocated": "mem_allocated_gib",
    "max allocated": "mem_max_allocated_gib",
    "reserved": "mem_reserved_gib",
    "max reserved": "mem_max_reserved_gib",
}
_MEMORY_MB_SQUASHED = {squash(k): v for k, v in MEMORY_MB_FIELDS.items()}


def parse_iteration_fields(step: int, body: str, train_iters: int | None = None) -> Row:
    """The row of one iteration line, from `body` = the text after `iteration N/M |`: the general
    (slow) path, also for lines a terminal wrap or a cut made irregular.

    Only fields closed by `|` are read, so a line cut mid-field loses that field, never gets a wrong
    value. Keys whose spaces a wrap ate are recognised. `skipped`/`nan` are True when Megatron
    counted at least one skipped/NaN iteration in the logging interval that ends at this step
    (exactly "this iteration" with the default `--log-interval 1`), or `nan` when the loss printed
    is not finite; the raw counts stay in `extra`. Loss keys other than "lm loss" go to `extra`.
    """
    row = new_row(step)
    extra = row["extra"]
    for seg in body.split("|")[:-1]:
        key, sep, value = seg.partition(":")
        if not sep:
            continue
        key = key.strip()
        spec = ITERATION_FIELDS.get(key)
        if spec is None:
            canonical = _SQUASHED.get(squash(key))
            if canonical is not None:
                key, spec = canonical, ITERATION_FIELDS[canonical]
        target, is_int = spec if spec is not None else (None, False)
        number = to_number(value) if is_int else to_float(value)
        if number is None or not key:
            continue
        if is_int and isinstance(number, float) and number.is_integer():
            number = int(number)
        if target is None:
            extra[key] = number
        else:
            row[target] = number
    if train_iters is not None:
        extra[TRAIN_ITERS_KEY] = train_iters
    skipped = extra.get(SKIPPED_KEY)
    row["skipped"] = None if skipped is None else skipped > 0
    row["nan"] = nan_flag(row["loss"], extra.get(NAN_KEY))
    return row


def parse_memory_mb(body: str, complete: bool = True) -> Row:
    """Memory fields (GiB) of the text after `memory (MB)`; `complete=False` drops the last field,
    which may have been cut short. Other fields go to `extra` as "<name> (MB)"."""
    fields: Row = {"extra": {}}
    for key, value in key_values(body, complete):
        number = to_float(value)
        if number is None:
            continue
        key = key.strip()
        target = MEMORY_MB_FIELDS.get(key) or _MEMORY_MB_SQUASHED.get(squash(key))
        if target is not None:
            fields[target] = mib_to_gib(number)
        elif key:
            fields["extra"][f"{key} (MB)"] = number
    return fields


def parse_validation(kind: str, suffix: str, body: str) -> Row:
    """Fields of a ` validation loss at iteration N | lm loss value: ... | lm loss PPL: ... |` line.

    `eval_loss` is the "lm loss" (else "loss", else the first) value of the validation set;
    every value also goes to `extra` as e.g. "validation lm loss" / "validation lm loss PPL";
    test-set lines (`test loss at ...`, `... on test set`) only fill `extra` ("test lm loss").
    """
    is_test = kind == "test" or "test set" in suffix
    prefix = "test" if is_test else kind
    fields: Row = {"extra": {}}
    values: dict[str, float] = {}
    for seg in body.split("|")[:-1]:
        key, sep, value = seg.partition(":")
        number = to_float(value) if sep else None
        if number is None:
            continue
        key = key.strip()
        if key.endswith(" value"):
            key = key[: -len(" value")]
            values[key] = number
        fields["extra"][f"{prefix} {key}"] = number
    if values and kind == "validation" and not is_test:
        fields["eval_loss"] = values.get("lm loss", values.get("loss", next(iter(values.values()))))
    return fields


class MegatronLMParser(StreamParser):
    """Streaming parser of Megatron-LM logs (one rank's stdout, or several ranks interleaved)."""

    format = "megatron-lm"
    handles_gb_memory = False
    MARKERS = ("iteration", "- arguments -")
    RARE_MARKERS = ("memory (", "loss at iteration", "- arguments -")
    FUZZY_END_KINDS = ("memory",)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._in_args = False
        self._layout: IterationLayout | None = None
        self._layouts: dict[tuple[str, ...], IterationLayout] = {}
        self._stamped = True  # whether the last iteration line had a timestamp
        self._declined: tuple[IterationLayout, bool] | None = None  # (layout, stamped) _bulk gave up on

    def _needs_lines(self) -> bool:
        return self._open is not None or self._in_args

    # ---- the bulk path ---------------------------------------------------------------------------
    def _scan(self, text: str, n: int, last_eol: bool, start: int = 0) -> None:
        """Pieces of about `BULK_WINDOW` characters go the bulk path one after the other (what one
        piece makes stays in the CPU caches while it is used); text it cannot take goes
        `StreamParser._scan`."""
        pos = start
        while pos < n:
            if self._needs_lines():
                pos = self._one_line(text, pos, n, last_eol)
                continue
            stop = n if n - pos <= BULK_WINDOW else text.rfind("\n", pos, pos + BULK_WINDOW) + 1
            if stop <= pos:  # a line longer than the window
                stop = text.find("\n", pos + BULK_WINDOW, n) + 1 or n
            self._declined = None
            if not self._bulk(text, pos, stop, last_eol or stop < n):
                super()._scan(text, stop, last_eol or stop < n, pos)
            pos = stop

    def _span(self, text: str, start: int, stop: int, last_eol: bool) -> None:
        if not self._bulk(text, start, stop, last_eol):
            self._lines(text, start, stop, last_eol)

    def _bulk(self, text: str, start: int, stop: int, last_eol: bool) -> bool:
        """Lines `text[start:stop]` (no record open) with the layout of the last iteration line: one
        `split` by its line regex gives the matched lines and the text between them; the lines
        between that hold none of `MARKERS` need nothing, the others go the line path, and so do
        matched lines while a record is open or whose values do not convert. False (nothing done)
        when no line matches (or a timestamp holds "iteration", see `IterationLayout.split`)."""
        layout = self._layout
        stamped = self._stamped
        if layout is None or self._declined == (layout, stamped):
            return False
        window = text if start == 0 and stop == len(text) else text[start:stop]
        # the fast regex with the counters of the last span written in, without them, the exact
        # regex: the next when the exact regex finds a line in a marked gap (a counter changed,
        # a tab...)
        exact = layout.variant(stamped).pattern
        guess = layout.guess(stamped)
        for fast, fixed in ((True, guess), (True, ()), (False, ()))[0 if guess else 1 :]:
            split = layout.split(window, stamped, fast, fixed)
            if split is None:
                self._declined = (layout, stamped)
                return False
            items, variant = split
            stride = variant.stride
            gaps = items[::stride]  # gaps[k]: the text before matched line k (after line k-1)
            if len(gaps) == 1:  # no line matched
                if variant.fixed or (variant.fast and _odd_space(window) and exact.search(window)):
                    continue
                self._declined = (layout, stamped)  # (the text goes the line path)
                return False
            dirty = self._marked(gaps, "".join(gaps))
            if not variant.fast or not any(exact.search(gaps[k]) for k in dirty):
                break
        count = len(gaps) - 1
        lines = self._lines
        has_marker = self._has_marker
        k = j = slow = 0
        while True:
            gap = gaps[k]
            is_dirty = j < len(dirty) and dirty[j] == k
            if is_dirty:
                j += 1
            if is_dirty or self._needs_lines():
                first = 1 if k else 0  # gaps after a matched line start with its newline
                if k == count:
                    lines(gap, first, len(gap), last_eol)
                    break
                cut = gap.rfind("\n") + 1
                if cut > first:
                    lines(gap, first, cut, True)
                line_path = self._needs_lines() or (is_dirty and has_marker(gap, cut))
            elif k == count:
                break
            else:
                line_path = False
            if line_path or k < slow:
                cut = gap.rfind("\n") + 1
                line = gap[cut:] + layout.line_text(items[k * stride + 1 : (k + 1) * stride], variant)
                self._push(line, True)
                k += 1
                continue
            end = dirty[j] if j < len(dirty) else count  # the lines up to the next marked gap
            built = layout.build_many(items[k * stride + 1 : end * stride + 1], variant)
            if built is None:
                # a value that does not convert: lines k..end-1 go the line path (gap k is done:
                # `j` is past it, so the next turn goes straight to line k)
                slow = end
                continue
            self._add_iterations(*built)
            self._layout = layout
            self._stamped = stamped
            k = end
        return True

    def _marked(self, gaps: list[str], joined: str) -> list[int]:
        """Indices of the texts holding one of `MARKERS`, in order (`joined`: the texts joined)."""
        hits = []
        for marker in self.MARKERS:
            pos = joined.find(marker)
            while pos >= 0:
                hits.append(pos)
                pos = joined.find(marker, pos + 1)
        if not hits:
            return []
        ends = list(accumulate(map(len, gaps)))
        return sorted({bisect_right(ends, pos) for pos in hits})

    def _has_marker(self, text: str, start: int) -> bool:
        return any(text.find(marker, start) >= 0 for marker in self.MARKERS)

    # ---- line by line ----------------------------------------------------------------------------
    def _dispatch(self, line: str, eol: bool) -> None:
        if "iteration" in line:
            m = ITERATION_RE.search(line)
            if m is not None:
                self._iteration_start(line, m, eol)
                return
            if "memory (" in line:
                if MEMORY_RE.search(line) is not None:
                    if not self._memory_complete(line):
                        self._start_record("memory", line, eol)
                    elif not eol or self._may_continue(line):
                        self._start_record("memory", line, eol, tentative=True)
                    else:
                        self._finish("memory", line, eol)
                    return
            if "loss at iteration" in line:
                if VALIDATION_RE.search(line) is not None:
                    if line.rstrip().endswith("|") and eol:
                        self._finish("validation", line, eol)
                    else:
                        self._start_record("validation", line, eol)
                return
        if self._in_args:
            self._argument_line(line)
        elif "- arguments -" in line:
            self._in_args = True
        else:
            self._other(line, eol)

    def _other(self, line: str, eol: bool) -> None:
        """Lines holding none of the Megatron-LM records: a hook for Megatron-Bridge's lines."""

    def _argument_line(self, line: str) -> None:
        if "end of arguments" in line:
            self._in_args = False
            return
        m = ARGUMENT_RE.match(line)
        if m is not None:
            self.args[m.group(1)] = m.group(2)

    def _iteration_start(self, line: str, m: re.Match[str], eol: bool) -> None:
        end = _iteration_end(line, m.end())
        if end is None:
            self._start_record("iteration", line, eol)
            return
        self._iteration(line, m, line[m.end() : end])
        rest = line[end:]
        if rest and rest.strip():  # the next print glued on after the final "|"
            self._dispatch(rest, eol)

    def _iteration(self, line: str, m: re.Match[str], body: str) -> None:
        step, total = int(m.group(1)), int(m.group(2))
        toks = body.replace(":", "|").split("|")
        keys = toks[0::2]
        layout = self._layout
        if layout is None or keys != layout.keys:
            layout = self._layouts.get(tuple(keys))
            if layout is None:
                layout = IterationLayout.learn(toks)
                if layout is not None:
                    self._layouts[tuple(keys)] = layout
        row = layout.build(step, total, toks) if layout is not None else None
        if row is None:
            row = parse_iteration_fields(step, body, total)
        else:
            self._layout = layout
        head = line[: m.start()].rstrip()
        stamped = False
        if head.endswith("]"):
            stamp = head[head.rfind("[") + 1 : -1]
            if stamp[:2].isdigit() and ":" in stamp:
                row["extra"][TIMESTAMP_KEY] = stamp
                stamped = True
        self._stamped = stamped
        self._add_iteration(row)

    # ---- records that may span lines ---------------------------------------------------------------
    def _memory_complete(self, text: str) -> bool:
        if "memory (GB)" in text:
            return True
        pos = text.find("max reserved:")
        return pos >= 0 and to_float(text[pos + len("max reserved:") :].split("|")[0]) is not None

    def _record_end(self, kind: str, text: str) -> int | None:
        if kind == "iteration":
            m = ITERATION_RE.search(text)
            return None if m is None else _iteration_end(text, m.end())
        if kind == "memory":
            return len(text) if self._memory_complete(text) else None
        return len(text) if text.rstrip().endswith("|") else None

    def _finish(self, kind: str, text: str, eol: bool) -> None:
        if kind == "iteration":
            m = ITERATION_RE.search(text)
            if m is not None:
                end = _iteration_end(text, m.end())
                self._iteration(text, m, text[m.end() : end] if end is not None else text[m.end() :])
        elif kind == "memory":
            m = MEMORY_RE.search(text)
            if m is None:
                return
            body = text[m.end() :]
            if m.group(3) == "MB":
                fields = parse_memory_mb(body, complete=eol)
            elif self.handles_gb_memory:
                fields = self._memory_gb(body, complete=eol)
            else:
                return
            if len(fields) > 1 or fields["extra"]:
                self._attach(int(m.group(2)), fields)
        elif kind == "validation":
            m = VALIDATION_RE.search(text)
            if m is not None:
                self._attach(int(m.group(2)), parse_validation(m.group(1), m.group(3), text[m.end() :]))

    def _memory_gb(self, body: str, complete: bool) -> Row:  # pragma: no cover - Bridge only
        return {"extra": {}}


def _odd_space(text: str) -> bool:
    """Whether `text` may hold whitespace other than spaces and newlines (which the exact line
    regex takes where the fast one takes only spaces)."""
    return not text.isascii() or any(c in text for c in "\t\x0b\x0c\x1c\x1d\x1e\x1f")


def _iteration_end(text: str, start: int) -> int | None:
    """Index just past the `|` closing "number of nan iterations", the last field Megatron prints
    (also when a terminal wrap ate the spaces of its name)."""
    k = text.find("nan iterations:", start)
    if k < 0:
        k = _squashed_find(text, "naniterations:", start)
        if k < 0:
            return None
    j = text.find("|", k)
    return None if j < 0 else j + 1


def _squashed_find(text: str, needle: str, start: int) -> int:
    """Where `needle` (written without spaces) begins in `text[start:]`, ignoring spaces in `text`."""
    if needle not in text[start:].replace(" ", ""):
        return -1
    for i in range(start, len(text)):
        if text[i] != needle[0]:
            continue
        j, p = i, 0
        while j < len(text) and p < len(needle):
            if text[j] == " ":
                j += 1
            elif text[j] == needle[p]:
                j += 1
                p += 1
            else:
                break
        if p == len(needle):
            return i
    return -1
