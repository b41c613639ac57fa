"""Per-rank entry of the Slurm backends: torch.distributed env from Slurm's variables, then the trainer command.

`python -u <mbx>/launchers/_rank.py --tasks TABLE [--index N] [--port-base 20000]`

srun starts this once per task (one per GPU). It reads its attempt from the task table (a JSON file written
at submission: the entry at SLURM_ARRAY_TASK_ID, else --index, else 0), so no campaign value ever passes
through a shell. Then, on every rank:

- RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK from SLURM_PROCID/NTASKS/LOCALID/..., MASTER_ADDR =
  the first host of SLURM_JOB_NODELIST (parsed here: no `scontrol` inside containers), MASTER_PORT = port base +
  job id mod 20000; under torchrun (NeMo-Run's local executor) torchrun's own values are kept;
- the table's environment values (non-secret), MBX_* and PYTHONPATH are set; JIT cache variables inherited
  from the submitting shell are removed (the trainer entry point sets them per rank);
- stdout/stderr go to <run dir>/logs/rank-<r>.log.

Rank 0 writes the node side of the environment fingerprint and the job's Slurm context (node.json) and
runs the command under launchers._attempt (time limit, exit.json, fallback status.json); the other ranks exec
the command.
A requeued job (SLURM_RESTART_COUNT > 0) first moves the previous run's outputs to <run dir>/requeued/<n>/.

Standard library only: this runs inside the job's container, where only the mbx checkout is mounted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__" and sys.path and Path(sys.path[0]).resolve() == ROOT / "launchers":
    sys.path[0] = str(ROOT)  # run by path: launchers/*.py must not shadow top-level modules
PORT_SPAN = 20000

# Inherited values of these are never trusted (the trainer sets the cache ones per rank itself).
JIT_CACHE_VARIABLES = (
    "TRITON_CACHE_DIR", "TRITON_HOME", "TORCHINDUCTOR_CACHE_DIR", "PYTORCH_KERNEL_CACHE_PATH", "CUDA_CACHE_PATH",
    "TILELANG_CACHE_DIR", "TILELANG_TMP_DIR", "DG_JIT_CACHE_DIR", "EP_JIT_CACHE_DIR", "DEEP_EP_JIT_CACHE_DIR",
    "CUPY_CACHE_DIR", "TORCH_EXTENSIONS_DIR",
)  # fmt: skip
DIST_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
RUN_OUTPUTS = ("status.json", "exit.json", "metrics.jsonl", "env.json", "node.json", "logs")


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list (`gpu[01-03,7],login-a,x[1-2]-ib`) as host names, in order."""
    hosts: list[str] = []
    for group in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", hostlist):
        prefixes = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", group):
            if not literal and not ranges:
                continue
            prefixes = [p + literal for p in prefixes]
            if ranges:
                suffixes: list[str] = []
                for part in ranges.split(","):
                    low, _, high = part.partition("-")
                    if high:
                        suffixes += [f"{n:0{len(low)}d}" for n in range(int(low), int(high) + 1)]
                    else:
                        suffixes.append(low)
                prefixes = [p + s for p in prefixes for s in suffixes]
        hosts.extend(prefixes)
    return hosts


def dist_env(environ: dict[str, str], port_base: int) -> dict[str, str]:
    """torch.distributed variables of this task from Slurm's (or torchrun's, when those are already set)."""
    if "SLURM_PROCID" not in environ or ("TORCHELASTIC_RUN_ID" in environ and "RANK" in environ):
        keep = {k: environ[k] for k in DIST_VARIABLES if k in environ}
        return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", **keep}
    hosts = expand_hostlist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "localhost")
    job_id = int(environ.get("SLURM_JOB_ID", "0") or 0)
    ntasks = environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS") or "1"
    local_size = environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or "1"
    local_size = re.match(r"\d+", local_size).group(0) if re.match(r"\d+", local_size) else "1"
    return {
        "RANK": environ["SLURM_PROCID"],
        "WORLD_SIZE": ntasks,
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": local_size,
        "NODE_RANK": environ.get("SLURM_NODEID", "0"),
        "MASTER_ADDR": hosts[0] if hosts else "localhost",
        "MASTER_PORT": str(port_base + job_id % PORT_SPAN),
    }


def pick_entry(table: list[dict], index: int | None, environ: dict[str, str]) -> dict:
    if index is None:
        index = int(environ.get("SLURM_ARRAY_TASK_ID") or 0)
    if not 0 <= index < len(table):
        raise SystemExit(f"_rank: task index {index} is not in the task table ({len(table)} entries)")
    return table[index]


def prepare_env(entry: dict, port_base: int) -> dict[str, str]:
    """The environment the trainer command gets on this rank."""
    env = dict(os.environ)
    for name in JIT_CACHE_VARIABLES:
        env.pop(name, None)
    dist = dist_env(env, port_base)
    for name in DIST_VARIABLES:
        env.pop(name, None)
    env.update(dist)
    if "OMP_NUM_THREADS" not in env and int(dist.get("LOCAL_WORLD_SIZE", "1")) > 1:
        env["OMP_NUM_THREADS"] = (
            env.get("SLURM_CPUS_PER_TASK") or "1"
        )  # as torchrun does: no oversubscription
    env.update({str(k): str(v) for k, v in entry.get("env", {}).items()})
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    return env


def archive_previous_run(run_dir: Path, restart: int) -> None:
    """A requeued job runs again in the same run dir: keep what the interrupted run left under requeued/<n>/."""
    target = run_dir / "requeued" / str(restart - 1)
    if target.exists():
        return
    target.mkdir(parents=True, exist_ok=True)
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.exists():
            shutil.move(str(path), str(target / name))


def _metadata_version(*names: str) -> str | None:
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _torch_cuda_version() -> str | None:
    """torch's CUDA version read from torch/version.py, without importing torch."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return None
    match = re.search(r"^cuda(?:: [^=]+)? = '([^']+)'", text, re.MULTILINE)
    return match.group(1) if match else None


def node_fingerprint(entry: dict, env: dict[str, str]) -> dict:
    """GPU, driver, CUDA, torch, TE, NCCL versions where present; container image; git SHA; hosts."""
    import socket

    gpus: list[list[str]] = []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        if out.returncode == 0:
            gpus = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "hostname": socket.gethostname(),
        "hosts": expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) or None,
        "gpu_name": gpus[0][0] if gpus else None,
        "gpu_count": len(gpus),
        "driver": gpus[0][1] if gpus and len(gpus[0]) > 1 else env.get("CUDA_DRIVER_VERSION"),
        "cuda": _torch_cuda_version() or env.get("CUDA_VERSION"),
        "torch": _metadata_version("torch") or env.get("PYTORCH_VERSION"),
        "te": _metadata_version("transformer_engine", "transformer-engine", "transformer_engine_torch"),
        "nccl": _metadata_version("nvidia-nccl-cu13", "nvidia-nccl-cu12") or env.get("NCCL_VERSION"),
        "container_image": entry.get("container_image"),
        "git_sha": entry.get("git_sha"),
    }


def write_node_fingerprint(run_dir: Path, entry: dict, env: dict[str, str]) -> None:
    """Write node.json: the node's fingerprint and the job's Slurm context. Only the node writes this file and
    only the login side writes launch.json, so neither can lose the other's update (a requeued rerun and the
    login side relabelling its attempt used to race on launch.json)."""
    slurm_keys = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST",
                  "SLURM_RESTART_COUNT", "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION")  # fmt: skip
    node = {k: v for k, v in node_fingerprint(entry, env).items() if v is not None}
    node["job"] = {
        "slurm": {k: env[k] for k in slurm_keys if k in env},
        "master_addr": env.get("MASTER_ADDR"),
        "master_port": env.get("MASTER_PORT"),
        "world_size": env.get("WORLD_SIZE"),
        "written_at": time.time(),
    }
    from launchers._attempt import _write_json  # (ROOT is on sys.path: see the top of this file and main)

    _write_json(run_dir / "node.json", node)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="_rank.py")
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
    logs = run_dir / "logs"
    if rank == 0 and restart > 0:
        archive_previous_run(run_dir, restart)
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"rank-{rank}.log"
    command = [str(c) for c in entry["argv"]]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(run_dir)
    if rank != 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.execvpe(command[0], command, env)

    sys.path.insert(0, str(ROOT))
    from launchers import _attempt

    try:
        write_node_fingerprint(run_dir, entry, env)
    except OSError as err:  # the fingerprint is a nice-to-have; never stop the run for it
        print(f"_rank: could not write the node fingerprint: {err}", file=sys.stderr)

    wrapper = ["--run-dir", str(run_dir), "--log", str(log)]
    if entry.get("time_limit_s"):
        wrapper += ["--time-limit-s", str(entry["time_limit_s"])]
    return _attempt.main([*wrapper, "--", *command])


if __name__ == "__main__":
    sys.exit(main())
