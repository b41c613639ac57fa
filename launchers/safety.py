"""What may reach a job script or a command: control characters refused, names checked, shell words quoted.

Two kinds of values reach a shell through the launchers:

- values mbx writes into a job script itself: quoted (`shlex.join`, `shell_word`), with control characters
  refused (`check_value`): a newline ends a `#` comment or an `#SBATCH` line and starts a command;
- values a tool writes into a shell script or command line *unquoted* (NeMo-Run's `srun --output DIR`, its
  `mkdir -p DIR`, its rsync `USER@HOST`): refused unless plain (`check_plain`: no shell metacharacter at all).

Errors are `UnsafeValue` (a ValueError: pydantic validators and the orchestrator report it as bad input), one
line, naming where the value came from and showing it shortened. Each rule is one `*_problem` function (the
reason, or None); the `check_*` functions raise it at render, and `mbx campaign validate` asks the same
functions about every campaign and swept value (orchestrator/spec/keys.py `value_problem`), so nothing render would
refuse gets past validation.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # campaign names and cell ids, as campaign files allow them
# a word no shell changes: letters, digits and @%+=:,./-_ anywhere, '#' and '~' (special only first) after that
_PLAIN = re.compile(r"[\w@%+=:,./-][\w@%+=:,./#~-]*")
PLAIN_CHARS = "letters, digits and _ @ % + = : , . / - # ~ ('#' and '~' not first)"
SHOWN_CHARS = 60  # a refused value is shown up to this many characters


class UnsafeValue(ValueError):
    """A value that cannot go into a job script or a command as given (bad input: the CLI exits 2)."""


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)` for an error message, shortened to about `limit` characters (one line, whatever it holds)."""
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def control_problem(value: Any, show: bool = True) -> str | None:
    """Why `value` cannot go into a job script (None: it can); `show=False` leaves the value out of the message."""
    if CONTROL_CHARS.search(str(value)):
        what = f"{shown(value)} contains" if show else "contains"
        return f"{what} a control character (newline, tab, NUL, ...); not allowed in job scripts"
    return None


def refuse_control(value: Any) -> Any:
    """A pydantic validator's body: `value` (a string, each item of a list, each value of a mapping) without
    control characters, else ValueError (pydantic names the key, the campaign loader shows the value)."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]
    for item in items:
        problem = control_problem(item, show=False) if item is not None else None
        if problem:
            raise ValueError(problem)
    return value


def _checked(where: str, value: Any, problem: str | None) -> str:
    """`value` as text, or UnsafeValue(`where: problem`)."""
    if problem:
        raise UnsafeValue(f"{where}: {problem}")
    return str(value)


def check_value(where: str, value: Any) -> str:
    """A value going into a job script as one quoted token: refuse control characters (a newline ends a line)."""
    return _checked(where, value, control_problem(value))


def is_plain(text: str) -> bool:
    """True when a shell reads `text` as one word, unchanged (no quoting needed)."""
    return _PLAIN.fullmatch(text) is not None


def shell_word(text: str) -> str:
    """`text` as one shell word: unchanged when plain (`nvcr.io#nvidia/pytorch:25.01`), else `shlex.quote`d."""
    return text if is_plain(text) else shlex.quote(text)


def plain_problem(value: Any, show: bool = True) -> str | None:
    """Why `value` cannot be written into a shell command unquoted (None: it can); `show` as control_problem."""
    problem = control_problem(value, show)
    if problem is None and not is_plain(str(value)):
        what = f"{shown(value)} contains" if show else "contains"
        problem = f"{what} characters a shell would interpret or split on; use only {PLAIN_CHARS}"
    return problem


def check_plain(where: str, value: Any, why: str) -> str:
    """A value a tool writes into a shell command unquoted: refuse anything but plain characters."""
    problem = plain_problem(value)
    if problem:
        raise UnsafeValue(f"{where}: {problem} ({why})")
    return str(value)


def check_name(where: str, value: str) -> str:
    """A campaign name or cell id (a folder name and part of job names): letters, digits, '.', '_', '-'."""
    if not NAME.fullmatch(value):
        raise UnsafeValue(f"{where}: {shown(value)} is not a name (letters, digits, '.', '_', '-'; not first)")
    return value


def check_env_name(where: str, name: str) -> str:
    """An environment variable name (it reaches pyxis' --container-env and the job script's comments)."""
    problem = env_name_problem(name)
    if problem:
        raise UnsafeValue(f"{where}: {problem}")
    return name


def nul_problem(value: Any, show: bool = True) -> str | None:
    """Why `value` cannot be passed to a process as an argument or environment value (None: it can)."""
    text = str(value)
    if "\0" in text:
        what = f"{shown(text)} contains" if show else "contains"
        return f"{what} a NUL character (no process can receive it)"
    return None


def check_no_nul(where: str, value: Any) -> str:
    """A value passed to a process as an argument or environment value: NUL cannot be passed at all."""
    return _checked(where, value, nul_problem(value))


def env_name_problem(name: Any) -> str | None:
    """Why `name` is not an environment variable name (None: it is one)."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return f"{shown(name)} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
    return None
