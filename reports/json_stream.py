"""A large JSON document read one value at a time from a bounded text stream (reports/limits.py): the members of
its top-level object, and the items of one list member, without holding the document whole."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reports import limits

_SEPARATORS = re.compile(r"[\s,]*")
_SPACE = re.compile(r"\s*")


class JsonStream:
    """A cursor over a JSON text given in chunks; `value()` reads one whole value (at most `max_value` characters:
    a bigger one is a LimitError), keeping in memory only the value at hand and the unread chunk."""

    def __init__(self, chunks: Iterator[str], path: Path, max_value: int):
        self._chunks = chunks
        self.path = path
        self.max_value = max_value
        self._text = ""
        self._pos = 0
        self._eof = False
        self._decode = json.JSONDecoder().raw_decode

    def _more(self, at_least: int = 1) -> bool:
        """Read more text (the consumed part dropped); False at the end."""
        added = 0
        while added < at_least and not self._eof:
            chunk = next(self._chunks, None)
            if chunk is None:
                self._eof = True
                break
            self._text = self._text[self._pos :] + chunk
            self._pos = 0
            added += len(chunk)
        return added > 0

    def peek(self, separators: bool = False) -> str:
        """The next character after blanks (and commas, with `separators`); "" at the end."""
        pattern = _SEPARATORS if separators else _SPACE
        while True:
            self._pos = pattern.match(self._text, self._pos).end()
            if self._pos < len(self._text):
                return self._text[self._pos]
            if not self._more():
                return ""

    def take(self, char: str) -> None:
        """Step over `char`, the next character (after blanks); ValueError when it is something else."""
        found = self.peek()
        if found != char:
            shown = repr(found) if found else "the end"
            raise ValueError(f"{self.path}: not valid JSON (expected {char!r}, found {shown})")
        self._pos += 1

    def value(self) -> Any:
        """The next JSON value, read whole."""
        self.peek()
        return self._value_here()

    def _value_here(self) -> Any:
        """The JSON value that starts at the cursor, read whole (more text read while it is cut at the end)."""
        while True:
            try:
                start = self._pos
                value, self._pos = self._decode(self._text, start)
            except json.JSONDecodeError as err:
                self._incomplete_or_raise(err)
                continue
            except ValueError:  # int() refuses a number past sys.get_int_max_str_digits()
                raise self._too_many_digits() from None
            except RecursionError:
                raise limits.LimitError(f"{self.path}: nested too deeply (more than about {limits.MAX_JSON_DEPTH:,} "
                                        "levels; the limit for a JSON file)") from None  # fmt: skip
            self._check_size(start)
            return value

    def _too_many_digits(self) -> ValueError:
        """A number too long for Python to read (no profiler writes one: a 64-bit integer has 20 digits)."""
        return ValueError(f"{self.path}: a number of more than {sys.get_int_max_str_digits():,} digits, too long "
                          "to read (a 64-bit integer has at most 20)")  # fmt: skip

    def _check_size(self, start: int) -> None:
        if self._pos - start > self.max_value:
            raise limits.LimitError(f"{self.path}: one value is larger than {limits.size_text(self.max_value)} "
                                    "characters (the limit for one event of a profiler trace)")  # fmt: skip

    def _incomplete_or_raise(self, err: json.JSONDecodeError) -> None:
        """A value cut at the end of the text read so far: read more (up to max_value); else the error."""
        held = len(self._text) - self._pos
        cut = err.msg.startswith("Unterminated") or err.pos >= len(self._text) - 1
        if not cut or self._eof:
            raise ValueError(f"{self.path}: not valid JSON ({err.msg} at character {err.pos - self._pos} of a "
                             "value)") from None  # fmt: skip
        if held > self.max_value:
            raise limits.LimitError(f"{self.path}: one value is larger than {limits.size_text(self.max_value)} "
                                    "characters (the limit for one event of a profiler trace)")  # fmt: skip
        if not self._more(at_least=max(held, 1 << 20)):  # read as much again: no value is parsed many times
            raise ValueError(
                f"{self.path}: not valid JSON ({err.msg}: the file ends inside a value)"
            ) from None

    def items(self) -> Iterator[Any]:
        """The items of the list that starts here, one at a time."""
        self.take("[")
        separators, decode = _SEPARATORS.match, self._decode
        while True:
            self._pos = separators(self._text, self._pos).end()
            if self._pos >= len(self._text):
                if not self._more():
                    raise ValueError(f"{self.path}: not valid JSON (the file ends inside a list)")
                continue
            if self._text[self._pos] == "]":
                self._pos += 1
                return
            try:  # the common case inline (a list of a million items: no call per item)
                start = self._pos
                value, self._pos = decode(self._text, start)
            except (json.JSONDecodeError, RecursionError):
                value = self._value_here()
            except ValueError:  # int() refuses a number past sys.get_int_max_str_digits()
                raise self._too_many_digits() from None
            else:
                if self._pos - start > self.max_value:
                    self._check_size(start)
            yield value


class NotAnObject(ValueError):
    """The document is not a JSON object, or has no list under the key asked for."""


def list_member(stream: JsonStream, key: str, what: str) -> Iterator[Any]:
    """The items of the list under `key` in the top-level object, one at a time (the other members are read and
    dropped; nothing after the list is read). NotAnObject when the document is not an object with that list."""
    first = stream.peek()
    if first != "{":
        found = {"[": "a JSON list", "": "an empty file"}.get(first, "not a JSON object")
        raise NotAnObject(f"{stream.path}: not {what} (a JSON object with a {key!r} list; found {found})")
    stream.take("{")
    while (char := stream.peek(separators=True)) != "}":
        if not char:
            raise ValueError(f"{stream.path}: not valid JSON (the file ends inside the top-level object)")
        name = stream.value()
        stream.take(":")
        if name == key and stream.peek() == "[":
            yield from stream.items()
            return
        stream.value()
    raise NotAnObject(f"{stream.path}: not {what} (no {key!r} list in its top-level object)")
