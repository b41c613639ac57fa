"""Rank-local JIT caches for an external trainer command: point them at `$MBX_JIT_CACHE_ROOT/rank-<r>`, then exec it.

    python -m launchers.node.jit_env -- COMMAND...

An external trainer (Megatron-Bridge, Megatron-LM) does not set its own JIT caches the way the bundled trainer does
(trainer/jit_cache.py), so every rank's entry does it before the command starts: the local backend runs the command
through this module (once per rank under torchrun), the Slurm rank entry (launchers/node/rank.py) calls
`apply` in-process. Each rank writes `<run dir>/logs/jit-cache-rank<r>.json`. Standard library only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

from trainer import jit_cache


def apply(environ: MutableMapping[str, str], rank: int | None = None) -> dict | None:
    """The rank's caches set in `environ` when the launcher asked for them (MBX_JIT_CACHE_ROOT), the record written
    next to the rank logs; None when not asked."""
    root = environ.get(jit_cache.ROOT_VAR)
    if not root:
        return None
    rank = jit_cache.global_rank(dict(environ)) if rank is None else rank
    record = jit_cache.point_caches(environ, Path(root), rank)
    run_dir = environ.get("MBX_RUN_DIR")
    if run_dir:
        try:
            jit_cache.write_record(record, run_dir)
        except OSError as err:  # the record is evidence, not a reason to stop the run
            print(f"jit_env: could not write the cache record: {err}", file=sys.stderr)
    return record


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[1:] if args[:1] == ["--"] else args
    if not command:
        print("usage: python -m launchers.node.jit_env -- COMMAND...", file=sys.stderr)
        return 2
    apply(os.environ)
    try:
        os.execvp(command[0], command)
    except OSError as err:
        print(f"jit_env: cannot start {command[0]!r}: {err}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
