"""What a rank runs: the one builder of an attempt's commands and environment, and the interpreter policy.

Every backend builds its commands here, so the local torchrun argv, the Slurm task table entry and NeMo-Run's
script all start the same program the same way:

- `program_argv`: the command every rank of an attempt runs (`PYTHON -u -m MODULE ARGS`, or the spec's argv);
- `local_argv`: the attempt on this machine: the program alone for one rank, under torchrun for several;
- `node_entry_argv`: what srun (or NeMo-Run) starts on every Slurm task: launchers/node/rank.py by path;
- `attempt_argv`: the attempt wrapper (launchers/node/attempt.py) around a command;
- `runtime_env`: the environment values an attempt's processes get (never pass-through values).

Interpreter policy (one rule for every backend):

- a process started on this machine (the local backend, NeMo-Run's local executor) runs with `sys.executable`,
  the interpreter running mbx (its environment has torch and the trainer), unless the local backend's
  `python` setting names another (`here_python`);
- a process started on a compute node (submitit, NeMo-Run on Slurm) runs with the profile's `cluster.python`,
  default `python3` (`node_python`): the login node's interpreter path often does not exist on the nodes or
  inside the container.
"""

from __future__ import annotations

import sys
from pathlib import Path

from launchers.base import GpuNeed, LaunchSpec
from launchers.profile import SlurmProfile
from trainer import jit_cache, rundir

ROOT = Path(__file__).resolve().parent.parent  # the mbx checkout: launchers/ and trainer/ live here
NODE_ENTRY = ROOT / "launchers" / "node" / "rank.py"
ATTEMPT_MODULE = "launchers.node.attempt"


def here_python(override: str | None = None) -> str:
    """The interpreter of a process started on this machine: `override`, else the one running mbx."""
    return override or sys.executable


def node_python(profile: SlurmProfile) -> str:
    """The interpreter of a process started on a compute node: the profile's `cluster.python`."""
    return profile.cluster.python


JIT_ENV_MODULE = "launchers.node.jit_env"


def jit_cache_root(spec: LaunchSpec) -> Path | None:
    """Where an external command's rank-local JIT caches go (`<run dir>/jit-cache/rank-<r>/`); None for the
    bundled trainer, which sets its own (trainer/jit_cache.py)."""
    return spec.run_dir / rundir.JIT_CACHE if spec.module is None else None


def jit_cache_plan(spec: LaunchSpec) -> dict[str, object] | None:
    """What launch.json says of an external command's JIT caches: the root, the per-rank folder, the variables."""
    root = jit_cache_root(spec)
    if root is None:
        return None
    return {"root": str(root), "per_rank": "rank-<RANK>", "variables": sorted(jit_cache.RANK_LOCAL_VARS),
            "shared": sorted(jit_cache.SHARED_VARS), "records": "logs/jit-cache-rank<RANK>.json"}  # fmt: skip


def program_argv(spec: LaunchSpec, python: str) -> list[str]:
    """The command every rank of an attempt runs: `python -u -m MODULE ARGS`, or the spec's own argv."""
    if spec.module is None:
        return list(spec.args)
    return [python, "-u", "-m", spec.module, *spec.args]


def local_argv(spec: LaunchSpec, python: str) -> list[str]:
    """The attempt's ranks on this machine: the program alone for one rank, under torchrun for several (an
    external command then runs once per rank, as srun runs it on Slurm)."""
    ranks = spec.resources.gpus_per_node
    if spec.module is None:  # each rank sets its JIT caches first (launchers/node/jit_env.py)
        program = [python, "-m", JIT_ENV_MODULE, "--", *spec.args]
        if ranks == 1 or not spec.distributed:
            return program
    elif ranks == 1 or not spec.distributed:
        return program_argv(spec, python)
    else:
        program = ["-m", spec.module, *spec.args]
    return [
        python, "-m", "torch.distributed.run",
        "--standalone", "--nnodes", "1", "--nproc-per-node", str(ranks),
        "--log-dir", str(spec.log_dir / "ranks"), "--tee", "3",
        *(["--no-python"] if spec.module is None else []), *program,
    ]  # fmt: skip


def node_entry_argv(python: str, table: Path, port_base: int, index: int | None = None) -> list[str]:
    """What every Slurm task starts: the per-rank entry by path (nothing needs installing on the nodes)."""
    where = ["--index", str(index)] if index is not None else []
    return [python, "-u", str(NODE_ENTRY), "--tasks", str(table), *where, "--port-base", str(port_base)]


def attempt_argv(
    python: str,
    run_dir: Path,
    log: Path,
    time_limit_s: float | None,
    command: list[str],
    gpu_need: GpuNeed | None = None,
) -> list[str]:
    """`command` under the attempt wrapper (GPU check, time limit, exit.json, fallback status.json)."""
    limit = ["--time-limit-s", str(time_limit_s)] if time_limit_s else []
    if gpu_need is not None:
        limit += ["--gpu-min-gib", f"{gpu_need.min_gib:g}", "--gpu-planned", gpu_need.planned]
    return [
        python,
        "-m",
        ATTEMPT_MODULE,
        "--run-dir",
        str(run_dir),
        "--log",
        str(log),
        *limit,
        "--",
        *command,
    ]


def runtime_env(spec: LaunchSpec) -> dict[str, str]:
    """Values to set for the attempt (excluding pass-through names, which backends export by name)."""
    env = dict(spec.env)
    env["MBX_RUN_DIR"] = str(spec.run_dir)
    env["MBX_CELL_ID"] = spec.cell_id
    env["MBX_ATTEMPT"] = str(spec.attempt)
    if (root := jit_cache_root(spec)) is not None:
        env[jit_cache.ROOT_VAR] = str(root)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
