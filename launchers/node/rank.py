"""The per-rank entry of the Slurm backends: torch.distributed environment from Slurm's, then the attempt's command.

Command line (the contract; `launchers.command.node_entry_argv` builds it, srun or NeMo-Run starts it on every
task, by path, so nothing needs installing on the nodes)::

    PYTHON -u <mbx>/launchers/node/rank.py --tasks TABLE [--index N] [--port-base 20000]

TABLE is a JSON list written at submission (`launchers.slurm.render.task_table`), one entry per attempt:
`{"cell_id", "attempt", "run_dir", "argv", "env", "env_passed_by_name", "time_limit_s", "container_image",
"git_sha"}` and, for a point with a memory estimate, `"gpu_need"`. This task runs entry SLURM_ARRAY_TASK_ID,
else --index, else 0; no campaign value ever passes through a shell. Then, on every rank:

- RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK from SLURM_PROCID/NTASKS/LOCALID/..., MASTER_ADDR =
  the first host of SLURM_JOB_NODELIST (parsed here: no `scontrol` inside containers), MASTER_PORT = port base +
  job id mod 20000; under torchrun (NeMo-Run's local executor) torchrun's own values are kept;
- the entry's environment values (non-secret), MBX_* and PYTHONPATH are set; JIT cache variables inherited
  from the submitting shell are removed (the bundled trainer sets them per rank: trainer/jit_cache.py; for an
  external command, MBX_JIT_CACHE_ROOT asks this entry to point them at <root>/rank-<r>: launchers/node/jit_env.py);
- the working directory is the run dir; stdout/stderr go to <run dir>/logs/rank-<r>.log.

Rank 0 writes node.json (`launchers.node.fingerprint`: the allocation's GPU and its memory among it) and runs
the command under the attempt wrapper (`launchers.node.attempt`: the GPU check, time limit, exit.json,
status.json); the other ranks exec the command. With a `gpu_need` in the entry (`{"min_gib", "planned"}`: what the
point needs per GPU by its memory estimate) a GPU with less memory is refused before any trainer starts: rank 0
records the point infeasible with the reason, every other rank exits 78 without starting its command.
A requeued job (SLURM_RESTART_COUNT > 0) first moves the previous run's outputs (`rundir.RUN_OUTPUTS`) to
<run dir>/requeued/<n>/.

Standard library only: this runs inside the job's container, where only the mbx checkout is mounted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
if __name__ == "__main__" and sys.path and Path(sys.path[0]).resolve() == ROOT / "launchers" / "node":
    sys.path[0] = str(ROOT)  # run by path: the checkout root, not this folder, is where imports start

from launchers.node import attempt, fingerprint, jit_env  # noqa: E402
from launchers.node.environ import prepare_env  # noqa: E402
from trainer import rundir  # noqa: E402


def pick_entry(table: list[dict[str, Any]], index: int | None, environ: dict[str, str]) -> dict[str, Any]:
    """The task table entry this task runs: --index, else SLURM_ARRAY_TASK_ID, else 0."""
    if index is None:
        index = int(environ.get("SLURM_ARRAY_TASK_ID") or 0)
    if not 0 <= index < len(table):
        raise SystemExit(f"rank.py: task index {index} is not in the task table ({len(table)} entries)")
    return table[index]


def archive_previous_run(run_dir: Path, restart: int) -> None:
    """A requeued job runs again in the same run dir: keep what the interrupted run left under requeued/<n>/."""
    target = run_dir / rundir.REQUEUED / str(restart - 1)
    if target.exists():
        return
    target.mkdir(parents=True, exist_ok=True)
    for name in rundir.RUN_OUTPUTS:
        path = run_dir / name
        if path.exists():
            shutil.move(str(path), str(target / name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launchers/node/rank.py")
    parser.add_argument(
        "--tasks", required=True, type=Path, help="task table (JSON list) written at submission"
    )
    parser.add_argument(
        "--index", type=int, default=None, help="entry to run (default: SLURM_ARRAY_TASK_ID or 0)"
    )
    parser.add_argument("--port-base", type=int, default=20000)
    args = parser.parse_args(argv)

    entry = pick_entry(json.loads(args.tasks.read_text()), args.index, dict(os.environ))
    run_dir = Path(entry["run_dir"])
    env = prepare_env(entry, args.port_base)
    rank = int(env["RANK"])
    restart = int(env.get("SLURM_RESTART_COUNT") or 0)
    if rank == 0 and restart > 0:
        archive_previous_run(run_dir, restart)
    logs = run_dir / rundir.LOGS
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"rank-{rank}.log"
    command = [str(c) for c in entry["argv"]]
    jit_env.apply(env, rank)  # an external command's rank-local JIT caches (the bundled trainer sets its own)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(run_dir)
    need = entry.get("gpu_need")
    if rank != 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        refusal = attempt.gpu_refusal(fingerprint.card(fingerprint.query_gpus()), need) if need else None
        if refusal is not None:  # rank 0 records it; this rank only never starts its trainer
            print(f"rank.py: {refusal}", flush=True)
            return attempt.EXIT_INFEASIBLE
        os.execvpe(command[0], command, env)
    gpus = fingerprint.query_gpus()
    try:
        fingerprint.write_node_record(run_dir, fingerprint.node_record(entry, env, gpus))
    except OSError as err:  # the fingerprint is a nice-to-have; never stop the run for it
        print(f"rank.py: could not write {rundir.NODE}: {err}", file=sys.stderr)
    return attempt.run(run_dir, command, log, entry.get("time_limit_s") or None, need, fingerprint.card(gpus))


if __name__ == "__main__":
    sys.exit(main())
