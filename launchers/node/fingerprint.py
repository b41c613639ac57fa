"""node.json: the node's side of the environment fingerprint (rundir.FINGERPRINT_KEYS: the allocation's GPU and
its memory included, read with nvidia-smi) and the job's Slurm context; `query_gpus` is the one GPU probe (the
attempt wrapper's check and `mbx campaign plan --gpu auto` use it too)."""

from __future__ import annotations

import importlib.util
import math
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


def _torch_version_file(name: str) -> str | None:
    """A value of torch/version.py (`__version__`, `cuda`), read without importing torch. `__version__` is what
    torch.__version__ says (2.11.0+cu130), which the bundled trainer's env.json records; the distribution's
    metadata may say 2.11.0, and the two would read as a false 'fingerprint differs' in a compare."""
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
    match = re.search(rf"^{re.escape(name)}(?:: [^=]+)? = '([^']+)'", text, re.MULTILINE)
    return match.group(1) if match else None


GPU_QUERY = ("name", "memory.total", "driver_version")


def query_gpus() -> list[dict[str, Any]]:
    """This machine's GPUs as nvidia-smi lists them: name, memory (GiB, nvidia-smi's memory.total rounded down
    to 0.1) and driver; [] when there is no nvidia-smi or it fails (no GPU, no driver)."""
    argv = ["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.stdout.splitlines():
        fields = dict(zip(GPU_QUERY, (c.strip() for c in line.split(",")), strict=False))
        if fields.get("name"):
            gpus.append({"name": fields["name"], "memory_gib": _gib(fields.get("memory.total")),
                         "driver": fields.get("driver_version") or None})  # fmt: skip
    return gpus


def _gib(mib: str | None) -> float | None:
    """nvidia-smi's MiB as GiB rounded down to 0.1 (None for "[N/A]" and the like)."""
    try:
        return math.floor(float(mib or "") / 1024 * 10) / 10
    except ValueError:
        return None


def card(gpus: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The allocation's GPU as feasibility sees it: the one with the least memory (name, memory_gib), or None
    when no GPU (or no GPU memory) was found."""
    sized = [g for g in gpus if g.get("memory_gib")]
    return min(sized, key=lambda g: g["memory_gib"]) if sized else None


def node_fingerprint(entry: dict[str, Any], env: dict[str, str],
                     gpus: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """The FINGERPRINT_KEYS this node knows: GPU (the smallest, by memory), GPU count, driver, CUDA, torch, TE,
    NCCL, python, image, commit, host; `gpus` as `query_gpus` returns them (None: asked here)."""
    gpus = query_gpus() if gpus is None else gpus
    smallest = card(gpus) or (gpus[0] if gpus else {})
    found = {
        "gpu_name": smallest.get("name"),
        "gpu_memory_gib": smallest.get("memory_gib"),
        "gpu_count": len(gpus),
        "driver": smallest.get("driver") or env.get("CUDA_DRIVER_VERSION"),
        "cuda": _torch_version_file("cuda") or env.get("CUDA_VERSION"),
        "torch": _torch_version_file("__version__") or _version("torch") or env.get("PYTORCH_VERSION"),
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


def node_record(entry: dict[str, Any], env: dict[str, str],
                gpus: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """What node.json holds: the node's fingerprint (the allocation's GPU and its memory included; `gpus` as
    `query_gpus` returns them, None: asked here) and, in a job (Slurm, torch.distributed), its hosts and
    context."""
    record: dict[str, Any] = node_fingerprint(entry, env, gpus)
    hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST", ""))
    if hosts:
        record["hosts"] = hosts
    if not (env.get("SLURM_JOB_ID") or env.get("MASTER_ADDR")):
        return record  # the local backend's attempt: no job around it
    record["job"] = {
        "slurm": {k: env[k] for k in SLURM_CONTEXT if k in env},
        "master_addr": env.get("MASTER_ADDR"),
        "master_port": env.get("MASTER_PORT"),
        "world_size": env.get("WORLD_SIZE"),
        "written_at": time.time(),
    }
    return record


def write_node_record(run_dir: Path, record: dict[str, Any]) -> None:
    """node.json (rank 0 under Slurm, the attempt wrapper locally): only the node writes it and only the login
    side writes launch.json, so neither can lose the other's update (a requeued rerun and the login side's
    relabelling used to race)."""
    rundir.write_node(run_dir, record)
