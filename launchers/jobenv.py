"""Environment an attempt's processes get: campaign values, rank-local JIT cache root, never secret values."""

from __future__ import annotations

from launchers.base import LaunchSpec

# Variables the trainer entry point sets per rank itself; never inherited from the submitting shell.
JIT_CACHE_VARIABLES = (
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TILELANG_CACHE_DIR",
    "TILELANG_TMP_DIR",
    "CUDA_CACHE_PATH",
    "TORCH_EXTENSIONS_DIR",
)


def runtime_env(spec: LaunchSpec, rank: int | None) -> dict[str, str]:
    """Values to set for the attempt (excluding pass-through names, which backends export by name)."""
    env = dict(spec.env)
    env["MBX_RUN_DIR"] = str(spec.run_dir)
    env["MBX_CELL_ID"] = spec.cell_id
    env["MBX_ATTEMPT"] = str(spec.attempt)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if rank is not None:
        env["RANK"] = str(rank)
    return env
