"""node.json: the node's side of the environment fingerprint (rundir.FINGERPRINT_KEYS) and the job's Slurm context."""

from __future__ import annotations

import importlib.util
import platform
import re
import socket
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from launchers.node.environ import expand_hostlist
from trainer import rundir

SLURM_CONTEXT = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST",
                 "SLURM_RESTART_COUNT", "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION")  # fmt: skip


def _version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _torch_cuda_version() -> str | None:
    """torch's CUDA version read from torch/version.py, without importing torch."""
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


def _gpus() -> list[list[str]]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def node_fingerprint(entry: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The FINGERPRINT_KEYS this node knows: GPUs, driver, CUDA, torch, TE, NCCL, python, image, commit, host."""
    gpus = _gpus()
    found = {
        "gpu_name": gpus[0][0] if gpus else None,
        "gpu_count": len(gpus),
        "driver": gpus[0][1] if gpus and len(gpus[0]) > 1 else env.get("CUDA_DRIVER_VERSION"),
        "cuda": _torch_cuda_version() or env.get("CUDA_VERSION"),
        "torch": _version("torch") or env.get("PYTORCH_VERSION"),
        "transformer_engine": _version(
            "transformer_engine", "transformer-engine", "transformer_engine_torch"
        ),
        "nccl": _version("nvidia-nccl-cu13", "nvidia-nccl-cu12") or env.get("NCCL_VERSION"),
        "python": platform.python_version(),
        "container_image": entry.get("container_image"),
        "git_sha": entry.get("git_sha"),
        "hostname": socket.gethostname(),
    }
    return {key: found[key] for key in rundir.FINGERPRINT_KEYS if found.get(key) is not None}


def write_node_record(run_dir: Path, entry: dict[str, Any], env: dict[str, str]) -> None:
    """node.json (rank 0 only): only the node writes it and only the login side writes launch.json, so
    neither can lose the other's update (a requeued rerun and the login side's relabelling used to race)."""
    record: dict[str, Any] = node_fingerprint(entry, env)
    hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST", ""))
    if hosts:
        record["hosts"] = hosts
    record["job"] = {
        "slurm": {k: env[k] for k in SLURM_CONTEXT if k in env},
        "master_addr": env.get("MASTER_ADDR"),
        "master_port": env.get("MASTER_PORT"),
        "world_size": env.get("WORLD_SIZE"),
        "written_at": time.time(),
    }
    rundir.write_node(run_dir, record)
