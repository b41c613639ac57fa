"""Writing a file the user named (`--out`): atomically, with a clean UsageError when the path cannot take it."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.errors import UsageError


def write_out(out: Path, text: str, label: str = "--out") -> None:
    """Write `text` to `out` through a temporary file and a rename; a directory or an unwritable path →
    UsageError naming `label` and the path (nothing half-written is left)."""
    out = Path(out)
    if out.is_dir():
        raise UsageError(f"{label} {out}: is a directory, give a file name")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"{label} {out}: cannot be written ({err.strerror or err})") from None
