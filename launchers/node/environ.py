"""A rank's environment on a Slurm node: torch.distributed variables from Slurm's, the task's values, no JIT caches."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.jit_cache import RANK_LOCAL_VARS, SHARED_VARS

ROOT = Path(__file__).resolve().parent.parent.parent  # the mbx checkout
PORT_SPAN = 20000  # MASTER_PORT = port base + job id mod PORT_SPAN

# Set per rank by the trainer's entry point (trainer/jit_cache.py); inherited values are never trusted.
JIT_CACHE_VARIABLES = (*RANK_LOCAL_VARS, *SHARED_VARS)
DIST_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


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


def dist_env(environ: Mapping[str, str], port_base: int) -> dict[str, str]:
    """torch.distributed variables of this task from Slurm's (or torchrun's, when those are already set)."""
    if "SLURM_PROCID" not in environ or ("TORCHELASTIC_RUN_ID" in environ and "RANK" in environ):
        keep = {k: environ[k] for k in DIST_VARIABLES if k in environ}
        return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", **keep}
    hosts = expand_hostlist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "localhost")
    job_id = int(environ.get("SLURM_JOB_ID", "0") or 0)
    ntasks = environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS") or "1"
    per_node = re.match(
        r"\d+", environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or "1"
    )
    return {
        "RANK": environ["SLURM_PROCID"],
        "WORLD_SIZE": ntasks,
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": per_node.group(0) if per_node else "1",
        "NODE_RANK": environ.get("SLURM_NODEID", "0"),
        "MASTER_ADDR": hosts[0] if hosts else "localhost",
        "MASTER_PORT": str(port_base + job_id % PORT_SPAN),
    }


def prepare_env(
    entry: Mapping[str, Any], port_base: int, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment the attempt's command gets on this rank."""
    env = dict(os.environ if environ is None else environ)
    for name in JIT_CACHE_VARIABLES:
        env.pop(name, None)
    dist = dist_env(env, port_base)
    for name in DIST_VARIABLES:
        env.pop(name, None)
    env.update(dist)
    if "OMP_NUM_THREADS" not in env and int(dist.get("LOCAL_WORLD_SIZE", "1")) > 1:
        # as torchrun does: no oversubscription
        env["OMP_NUM_THREADS"] = env.get("SLURM_CPUS_PER_TASK") or "1"
    env.update({str(k): str(v) for k, v in entry.get("env", {}).items()})
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    return env
