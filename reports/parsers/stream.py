"""Streaming machinery under the Megatron parsers: chunks to lines, terminal-wrapped records, rows held by step and emitted."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from reports.limits import MAX_LOG_LINE_CHARS
from reports.parsers.rows import Row, derive_tokens, merge_row, new_row
from reports.parsers.text import LABEL_RE, starts_record, strip_ansi, to_int

MIN_WRAP_WIDTH = 40  # a terminal narrower than this is not worth guessing about
MAX_WRAP_PARTS = 64
# Every physical line of a wrapped record but the last is as wide as the terminal, less the
# trailing spaces a copy/paste (or the log viewer) stripped: Megatron pads numbers with up to 11.
WRAP_SLACK = 12
_NUMBER_END = frozenset("0123456789.")
_NUMBER_GOES_ON = frozenset("0123456789.eE+-")


@dataclass
class OpenRecord:
    """A record (iteration/memory/validation line) whose end has not been seen yet: the log may
    have hard-wrapped it at the terminal width, or cut it short."""

    kind: str
    parts: list[str]
    eol: bool = True  # whether the last physical line ended with a newline
    width: int = 0  # widest physical line so far
    tentative: bool = False  # complete as far as we can tell, unless its last number goes on

    def text(self, known_width: int | None = None) -> str:
        """The physical lines joined back into one: a line narrower than the terminal (the widest
        line seen) lost trailing spaces to the terminal or a copy/paste, so it is joined with a
        space. While the width is unknown and every line lost a space, a key's space may be lost
        ("mtp_1loss"); known keys are still recognised (`text.squash`)."""
        if len(self.parts) == 1:
            return self.parts[0]
        widest = max(max(len(p) for p in self.parts[:-1]), known_width or 0)
        head = "".join(p if len(p) >= widest else p + " " for p in self.parts[:-1])
        return head + self.parts[-1]


def _has_long_line(text: str, stop: int) -> bool:
    """Whether a line of `text[:stop]` (which starts a line and ends with one) is longer than MAX_LOG_LINE_CHARS:
    from each line start, the last newline within the limit is where the next look starts (a few `rfind`s per
    MiB, not one step per line)."""
    pos = 0
    while stop - pos > MAX_LOG_LINE_CHARS:
        newline = text.rfind("\n", pos, pos + MAX_LOG_LINE_CHARS + 1)
        if newline < 0:
            return True
        pos = newline + 1
    return False


def _skip(text: str, start: int, stop: int, last_eol: bool) -> None:
    """A run of lines that needs nothing (`StreamParser._lines`: none holds a marker)."""


class StreamParser:
    """Feed it log text in chunks (`feed`) or lines (`push`); it returns finished step rows.

    `lag` is how many of the newest iteration rows are held back so that memory, validation and
    step-time lines printed around them (often by another rank, before or after) can still join
    them; `lag=None` holds every row until `close()`, which makes the merge lossless. Data for a
    step already emitted is dropped and counted in `late_dropped`.

    A line longer than limits.MAX_LOG_LINE_CHARS sets `overlong`; the readers of whole files (`parse_log`,
    `iter_rows`, `LogFollower.finish`) then refuse the file (LimitError). One still unfinished past the limit
    is dropped up to its newline (nothing more of it is held: memory and time stay linear).

    Subclasses say which lines matter (`MARKERS`, `RARE_MARKERS`) and parse them (`_dispatch`,
    `_record_end`, `_finish`, `_span`).
    """

    format = "megatron"
    #: Substrings of every line `_dispatch` reacts to: other lines are skipped with `str.find`.
    MARKERS: tuple[str, ...] = ()
    #: Those of `MARKERS` that are rare and break the bulk path: text between them goes to `_span`.
    RARE_MARKERS: tuple[str, ...] = ()
    #: Records whose end is not marked (their last field runs to the end of the line).
    FUZZY_END_KINDS: tuple[str, ...] = ()

    def __init__(self, *, lag: int | None = 1, seq_length: int | None = None, num_gpus: int | None = None):
        if lag is not None and lag < 1:
            raise ValueError("lag must be >= 1 or None")
        self.lag = lag
        self.seq_length = seq_length
        self.num_gpus = num_gpus
        self.args: dict[str, str] = {}  # Megatron's "arguments" dump, when the log has it
        self.wrap_width: int | None = None  # learnt from the first record seen hard-wrapped
        self.late_dropped = 0
        self._pending: dict[int, Row] = {}
        self._recent: list[int] = []  # newest iteration steps, oldest first (at most `lag`)
        self._last_iteration: int | None = None
        self._pending_max: int | None = None  # an upper bound of the steps held
        self._flushed_max: int | None = None
        self._open: OpenRecord | None = None
        self._out: list[Row] = []
        self._buf = ""
        self._skipping = False  # inside an over-long line: drop text up to its newline
        self.overlong = False
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._closed = False

    # ---- input -------------------------------------------------------------------------------
    def feed(self, chunk: str | bytes) -> list[Row]:
        """Take the next piece of the log (any size, may end mid-line); return the rows finished."""
        if isinstance(chunk, bytes):
            chunk = self._decoder.decode(chunk)
        if chunk and self._skipping:
            end = chunk.find("\n")
            chunk = "" if end < 0 else chunk[end + 1 :]
            self._skipping = end < 0
        if chunk:
            data = self._buf + chunk if self._buf else chunk
            cut = data.rfind("\n")
            if cut < 0:
                self._buf = data
                if len(data) > MAX_LOG_LINE_CHARS:
                    self._buf, self._skipping, self.overlong = "", True, True
            else:
                self._buf = data[cut + 1 :]
                if cut >= MAX_LOG_LINE_CHARS and not self.overlong:
                    self.overlong = _has_long_line(data, cut)
                self._scan(data, cut + 1, True)
        return self._take()

    def push(self, line: str) -> list[Row]:
        """Take one line (with or without its newline); return the rows finished."""
        if line.endswith("\n"):
            self._push(line[:-1], True)
        else:
            self._push(line, False)
        return self._take()

    def close(self) -> list[Row]:
        """End of the log: parse what is left (a last line without newline is treated as possibly cut
        short), close any open record and emit every held row, in step order."""
        if self._closed:
            return []
        tail = self._buf + self._decoder.decode(b"", final=True)
        self._buf = ""
        if tail:
            self._scan(tail, len(tail), False)
        if self._open is not None:
            self._close_open()
        for step in sorted(self._pending):
            self._emit(self._pending[step])
        self._pending.clear()
        self._closed = True
        return self._take()

    def iter_lines(self, lines: Iterable[str]) -> Iterator[Row]:
        """Rows of an iterable of lines (e.g. an open text file), then of `close()`: the slow,
        line-by-line path that `feed` must agree with."""
        push = self._push
        for line in lines:
            if line.endswith("\n"):
                push(line[:-1], True)
            else:
                push(line, False)
            if self._out:
                yield from self._take()
        yield from self.close()

    # ---- scanning text -------------------------------------------------------------------------
    def _needs_lines(self) -> bool:
        """True while every line matters (a record is open, or a block is being read)."""
        return self._open is not None

    def _scan(self, text: str, n: int, last_eol: bool, start: int = 0) -> None:
        """Process `text[start:n]`, whole lines (the last one without newline if `last_eol` is
        False): runs of lines between `RARE_MARKERS` go to `_span`, rare lines one by one."""
        self._between(text, start, n, last_eol, self.RARE_MARKERS, self._span)

    def _span(self, text: str, start: int, stop: int, last_eol: bool) -> None:
        """Lines `text[start:stop]`, none holding a rare marker. Subclasses may parse a run of
        uniform lines in bulk; this default goes line by line."""
        self._lines(text, start, stop, last_eol)

    def _lines(self, text: str, start: int, stop: int, last_eol: bool) -> None:
        """Lines `text[start:stop]` one by one, skipping those without any of `MARKERS` while no
        record is open."""
        self._between(text, start, stop, last_eol, self.MARKERS, _skip)

    def _between(self, text: str, start: int, stop: int, last_eol: bool, markers: tuple[str, ...],
                 span: Callable[[str, int, int, bool], None]) -> None:  # fmt: skip
        """Lines `text[start:stop]`: while a record is open one by one; else each run of lines holding
        none of `markers` goes to `span` and each line holding one goes the line path. Each marker's
        next position is found once and kept until the scan passes it."""
        find = text.find
        nxt = [find(m, start, stop) for m in markers]
        pos = start
        while pos < stop:
            if self._needs_lines():
                pos = self._one_line(text, pos, stop, last_eol)
                continue
            hit = -1
            for k, p in enumerate(nxt):
                if 0 <= p < pos:
                    p = nxt[k] = find(markers[k], pos, stop)
                if p >= 0 and (hit < 0 or p < hit):
                    hit = p
            line = stop if hit < 0 else (text.rfind("\n", pos, hit) + 1 or pos)
            if line > pos:
                span(text, pos, line, last_eol or line < stop)
                pos = line
            if hit >= 0:
                pos = self._one_line(text, pos, stop, last_eol)

    def _one_line(self, text: str, pos: int, stop: int, last_eol: bool) -> int:
        """Push the line starting at `pos`; return where the next one starts."""
        end = text.find("\n", pos, stop)
        if end < 0:
            self._push(text[pos:stop], last_eol)
            return stop
        self._push(text[pos:end], True)
        return end + 1

    def _push(self, line: str, eol: bool) -> None:
        if line.endswith("\r"):
            line = line.rstrip("\r")
        if "\r" in line:  # progress bars: carriage returns separate overwritten pieces
            pieces = line.split("\r")
            for piece in pieces[:-1]:
                self._physical(piece, True)
            line = pieces[-1]
        self._physical(line, eol)

    def _physical(self, line: str, eol: bool) -> None:
        if "\x1b" in line:
            line = strip_ansi(line)
        if self._open is not None and self._continue(line, eol):
            return
        self._dispatch(line, eol)

    def _dispatch(self, line: str, eol: bool) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # ---- wrapped / cut records -----------------------------------------------------------------
    def _start_record(self, kind: str, line: str, eol: bool, *, tentative: bool = False) -> None:
        """Hold `line` as the head of a record that is not complete yet, or (`tentative`) that looks
        complete but ends in a number the next physical line may continue."""
        self._open = OpenRecord(kind, [line], eol, len(line), tentative)

    def _may_continue(self, line: str) -> bool:
        """Whether a line that looks complete but ends in a number may be cut by a wrap: it is wide
        enough to have been wrapped (or as wide as the known wrap width)."""
        width = MIN_WRAP_WIDTH if self.wrap_width is None else self.wrap_width
        return len(line) >= width - WRAP_SLACK and line[-1:] in _NUMBER_END

    def _continue(self, line: str, eol: bool) -> bool:
        rec = self._open
        assert rec is not None
        last = rec.parts[-1]
        wrapped = (
            len(last) >= max(MIN_WRAP_WIDTH, rec.width) - WRAP_SLACK
            and len(rec.parts) < MAX_WRAP_PARTS
            and line.strip() != ""
            and (not rec.tentative or line[:1] in _NUMBER_GOES_ON)
            and LABEL_RE.match(line)
            is None  # a terminal wrap has no launcher label; another rank's line does
            and not starts_record(line)
        )
        if not wrapped:
            self._close_open()
            return False
        rec.parts.append(line)
        rec.eol = eol
        rec.width = max(rec.width, len(line))
        rec.tentative = False
        text = rec.text(self.wrap_width)
        end = self._record_end(rec.kind, text)
        if end is None:
            return True
        if (
            rec.kind in self.FUZZY_END_KINDS
            and len(line) >= rec.width - WRAP_SLACK
            and line[-1:] in _NUMBER_END
        ):
            rec.tentative = True  # complete-looking, but this full-width line may cut its last number
            return True
        self._open = None
        self.wrap_width = max(self.wrap_width or 0, *(len(p) for p in rec.parts[:-1]))
        self._finish(rec.kind, text[:end], eol=True)
        rest = text[end:]
        if rest.strip():
            self._dispatch(rest, eol)
        return True

    def _close_open(self) -> None:
        rec = self._open
        self._open = None
        if rec is not None:
            if len(rec.parts) > 1:
                self.wrap_width = max(self.wrap_width or 0, *(len(p) for p in rec.parts[:-1]))
            self._finish(rec.kind, rec.text(self.wrap_width), eol=rec.eol)

    def _record_end(self, kind: str, text: str) -> int | None:  # pragma: no cover - abstract
        """Index just past the end of a complete record of `kind` in `text`, or None if incomplete."""
        raise NotImplementedError

    def _finish(self, kind: str, text: str, eol: bool) -> None:  # pragma: no cover - abstract
        """Parse one logical record; `eol` False means its last field may be cut short."""
        raise NotImplementedError

    # ---- rows --------------------------------------------------------------------------------
    def _add_iteration(self, row: Row) -> None:
        step = row["step"]
        self._last_iteration = step
        pending = self._pending
        if self._flushed_max is not None and step <= self._flushed_max and step not in pending:
            self._flushed_max = None  # the iteration count went back: a restart in the same log
        if step in pending:
            merge_row(pending[step], row)
        else:
            pending[step] = row
            if self._pending_max is None or step > self._pending_max:
                self._pending_max = step
        lag = self.lag
        if lag is None:
            return
        recent = self._recent
        if step in recent:
            recent.remove(step)
        recent.append(step)
        if len(recent) > lag:
            del recent[0]
        if len(pending) > lag:
            for s in [s for s in pending if s not in recent]:
                self._emit(pending.pop(s))

    def _bulk_ok(self) -> bool:
        """Whether `_add_iterations` may skip the per-row bookkeeping (subclasses add conditions)."""
        return self.lag is None or self.lag == 1

    def _add_iterations(self, rows: list[Row], steps: list[int]) -> None:
        """`_add_iteration` for each row, in bulk when the steps simply go up from what is held
        (the first row may join a row held for the same step, e.g. its memory printed first)."""
        if not self._bulk_ok() or not all(map(int.__lt__, steps, steps[1:])):
            for row in rows:
                self._add_iteration(row)
            return
        if not self._bulk_follows(steps[0]):
            self._add_iteration(rows[0])
            rows, steps = rows[1:], steps[1:]
            if not rows:
                return
            if not self._bulk_follows(steps[0]):
                for row in rows:
                    self._add_iteration(row)
                return
        pending = self._pending
        self._last_iteration = self._pending_max = steps[-1]
        if self.lag is None:
            pending.update(zip(steps, rows, strict=True))
            return
        for row in pending.values():
            self._emit(row)
        pending.clear()
        if self._has_tokens_inputs():
            for row in rows[:-1]:
                self._emit(row)
        else:
            self._out.extend(rows[:-1])
            if len(rows) > 1:
                self._flushed_max = steps[-2]
        pending[steps[-1]] = rows[-1]
        self._recent = [steps[-1]]

    def _bulk_follows(self, first: int) -> bool:
        """Whether rows starting at step `first` come after everything held and emitted."""
        return (self._flushed_max is None or first > self._flushed_max) and (
            not self._pending or self._held_max() < first
        )

    def _held_max(self) -> int:
        """The largest step held (exact when few rows are held, else an upper bound)."""
        if len(self._pending) <= 8 or self._pending_max is None:
            return max(self._pending)
        return self._pending_max

    def _attach(self, step: int, fields: Row) -> None:
        """Join fields printed apart from the iteration line (memory, validation) to the row of `step`."""
        row = self._pending.get(step)
        if row is not None:
            merge_row(row, fields)
            return
        if self.lag is not None and self._flushed_max is not None and step <= self._flushed_max:
            self.late_dropped += 1
            return
        self._pending[step] = merge_row(new_row(step), fields)
        if self._pending_max is None or step > self._pending_max:
            self._pending_max = step

    def _latest(self) -> Row | None:
        """The newest iteration row, if it is still held."""
        if self._last_iteration is None:
            return None
        return self._pending.get(self._last_iteration)

    def _has_tokens_inputs(self) -> bool:
        return bool(
            (self.seq_length or "seq_length" in self.args) and (self.num_gpus or "world_size" in self.args)
        )

    def _emit(self, row: Row) -> None:
        if self._has_tokens_inputs():
            derive_tokens(
                row,
                self.seq_length or to_int(self.args.get("seq_length")),
                self.num_gpus or to_int(self.args.get("world_size")),
            )
        self._out.append(row)
        step = row["step"]
        if self._flushed_max is None or step > self._flushed_max:
            self._flushed_max = step

    def _take(self) -> list[Row]:
        out = self._out
        if not out:
            return []
        self._out = []
        return out


