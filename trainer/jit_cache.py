"""Rank-local JIT caches: point every kernel cache at <root>/rank-<r>/ before torch or triton is imported.

Ranks that share one JIT cache directory (a home directory on NFS, or one node's /tmp
under several ranks) race on the same files: half-written cubins, "Stale file handle",
kernels built for another GPU. So every rank gets its own directory per cache, and
only the torch C++ extension build cache (which takes a file lock) is shared.

Values inherited from the submitting shell are replaced, not trusted: a login node's
TRITON_CACHE_DIR on a shared filesystem is exactly what this avoids.

This module imports nothing but the standard library (and the stdlib-only trainer.rundir); `trainer/__main__.py` calls
`setup_jit_caches()` before anything imports torch.
"""

from __future__ import annotations

import getpass
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

from trainer import rundir

# env var -> sub-directory of <root>/rank-<r>/. A library that is not installed ignores its variable.
RANK_LOCAL_VARS: dict[str, str] = {
    "TRITON_CACHE_DIR": "triton",  # Triton compiled kernels
    "TRITON_HOME": "triton-home",  # Triton ≥3 also keeps dump/override dirs under $TRITON_HOME/.triton
    "TORCHINDUCTOR_CACHE_DIR": "inductor",  # torch.compile: FX graph, AOT autograd and inductor code caches
    "PYTORCH_KERNEL_CACHE_PATH": "torch-kernels",  # torch's NVRTC/jiterator kernel cache (~/.cache/torch/kernels)
    "CUDA_CACHE_PATH": "cuda",  # the CUDA driver's PTX→SASS JIT cache (~/.nv/ComputeCache)
    "TILELANG_CACHE_DIR": "tilelang",  # TileLang compiled kernels
    "TILELANG_TMP_DIR": "tilelang-tmp",  # TileLang build scratch
    "DG_JIT_CACHE_DIR": "deep_gemm",  # DeepGEMM JIT kernels
    "EP_JIT_CACHE_DIR": "deep_ep",  # DeepEP V2 / Hybrid-EP JIT kernels
    "DEEP_EP_JIT_CACHE_DIR": "deep_ep",  # the same, as some DeepEP builds spell it
    "CUPY_CACHE_DIR": "cupy",  # CuPy RawKernel cache
}
# One cache shared by all ranks: torch.utils.cpp_extension builds take a file lock there.
SHARED_VARS: dict[str, str] = {"TORCH_EXTENSIONS_DIR": "torch_extensions"}


def cache_root(explicit: str | None = None, environ: dict[str, str] | None = None) -> Path:
    """Recipe `cache_dir`, else $MBX_CACHE_DIR, else $XDG_CACHE_HOME/mbx, else /tmp/mbx-cache-$USER."""
    env = os.environ if environ is None else environ
    if explicit:
        return Path(explicit).expanduser()
    if env.get("MBX_CACHE_DIR"):
        return Path(env["MBX_CACHE_DIR"]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "mbx"
    try:
        user = env.get("USER") or getpass.getuser()
    except (KeyError, OSError):  # no passwd entry inside some containers
        user = str(os.getuid())
    return Path(f"/tmp/mbx-cache-{user}")


def global_rank(environ: dict[str, str] | None = None) -> int:
    """RANK (torchrun), else SLURM_PROCID (srun), else 0."""
    env = os.environ if environ is None else environ
    for name in ("RANK", "SLURM_PROCID"):
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


# Set by the launchers for an external trainer command (launchers/command.py): the root of its rank-local caches
# (`<run dir>/jit-cache`); each rank's entry points the variables below it at rank-<r> (`point_caches`).
ROOT_VAR = "MBX_JIT_CACHE_ROOT"


def setup_jit_caches(explicit_root: str | None = None) -> dict:
    """Point the JIT cache variables of this process at rank-local dirs, create them, return a record.

    Must run before torch/triton are imported: they read some of these variables once at import.
    """
    return point_caches(os.environ, cache_root(explicit_root).resolve(), global_rank())


def point_caches(environ: MutableMapping[str, str], root: Path, rank: int) -> dict:
    """Set every JIT cache variable of `environ` to `<root>/rank-<rank>/...` (the shared ones to `<root>/...`),
    create the dirs; the record says what was chosen and which inherited values were replaced."""
    rank_dir = root / f"rank-{rank}"
    chosen: dict[str, str] = {}
    replaced: dict[str, str] = {}
    for var, sub in [*((v, rank_dir / s) for v, s in RANK_LOCAL_VARS.items()),
                     *((v, root / s) for v, s in SHARED_VARS.items())]:
        path = str(sub)
        os.makedirs(path, exist_ok=True)
        old = environ.get(var)
        if old is not None and old != path:
            replaced[var] = old
        environ[var] = path
        chosen[var] = path
    return {
        "rank": rank,
        "root": str(root),
        "rank_dir": str(rank_dir),
        "env": chosen,
        "replaced": replaced,
        # The contract: nothing may have imported torch/triton before this ran.
        "torch_imported_before": "torch" in sys.modules or "triton" in sys.modules,
    }


def write_record(record: dict, out_dir: str | os.PathLike) -> Path:
    """Save the record as <out>/logs/jit-cache-rank<r>.json (one file per rank; tests compare them), through
    trainer/rundir.py (the run-dir format)."""
    return rundir.write_jit_cache_record(Path(out_dir), record)
