"""`python -m trainer`: point the JIT caches at rank-local dirs first, then import torch and train (or print FLOPs)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# Only torch-free modules above this line's callers: the JIT cache variables must be set before torch loads.
from trainer import jit_cache
from trainer.cli import load_recipe, parse_args


def _write_failed_status(out: Path, reason: str, started_at: float) -> None:
    """The recipe could not be read: record that in status.json (rank 0) without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    from trainer import rundir

    if int(os.environ.get("RANK", 0)) != 0:
        return
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "unknown"
    out.mkdir(parents=True, exist_ok=True)
    rundir.write_status(out, rundir.trainer_status(
        state="failed", reason=reason, steps_completed=0, steps_planned=0, skipped_iterations=0,
        nan_iterations=0, flops_per_step=0.0, world_size=int(os.environ.get("WORLD_SIZE", 1)), device="cpu",
        gpu_name=None, torch_version=torch_version, params=0, started_at=started_at, ended_at=time.time(),
    ), rundir.TRAINER)


def run(argv: list[str]) -> int:
    started_at = time.time()
    args = parse_args(argv)
    try:
        recipe = load_recipe(args.recipe, args.overrides)
    except Exception as err:  # noqa: BLE001 (file, YAML or schema errors: one line, exit 2)
        from trainer.rundir import one_line

        reason = one_line(err)
        print(f"error: {reason}", file=sys.stderr)
        if args.command == "train":
            _write_failed_status(Path(args.out), reason, started_at)
        return 2
    if args.command == "flops":
        from trainer import flops

        return flops.main(recipe, args.world_size)

    record = jit_cache.setup_jit_caches(recipe.cache_dir)
    jit_cache.write_record(record, args.out)
    replaced = ", ".join(sorted(record["replaced"])) or "nothing"
    print(f"JIT caches of rank {record['rank']} under {record['rank_dir']} (replaced inherited: {replaced})",
          flush=True)
    from trainer import checkpoint, train  # imports torch: only now

    if problem := checkpoint.load_problem(recipe, int(os.environ.get("WORLD_SIZE", 1))):
        print(f"error: {problem}", file=sys.stderr)  # a checkpoint this recipe cannot continue from: exit 2
        _write_failed_status(Path(args.out), problem, started_at)
        return 2
    return train.main(recipe, Path(args.out), started_at)


def exit_now(code: int) -> None:
    """Exit without tearing the interpreter down: everything is written and flushed, and freeing the
    distributed trainer can deadlock (trainer.train._KEPT_UNTIL_EXIT says how)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(run(sys.argv[1:]))
