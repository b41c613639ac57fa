"""Environment names mbx sets or reads itself: a campaign may not set (`env.values`), sweep (`env.NAME`), bisect
(`--key env.NAME`) or pass (`env.pass`) them.

Reserved, and why:

- `MBX_*`: mbx's own namespace. The orchestrator records each point's software there and acts on it at launch
  (`MBX_SOFTWARE_<NAME>_SHA`/`_REPO` → a git worktree it builds and may remove, `MBX_PIP_PINS`/`MBX_PIP_ARGS` →
  a `pip install` it runs, `MBX_CONTAINER_IMAGE` → the job's image); launchers/command.py sets `MBX_RUN_DIR`,
  `MBX_CELL_ID`, `MBX_ATTEMPT`; the trainer reads `MBX_TRAINER_PROFILE` and `MBX_CACHE_DIR` (the JIT cache root:
  set it in the recipe's `cache_dir` or the submitting shell); the CLI reads `MBX_DEBUG`, `MBX_MAX_*`, ...
  The whole prefix is reserved so that a name mbx adds later can never collide with a campaign's.
- `SLURM_*`: Slurm sets them per task and mbx's node side reads them (rank, array index, node list, restart
  count); a campaign value would lie to the ranks (and reaches them only after srun, so it configures nothing).
- `TORCHELASTIC_*` and torch.distributed's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK,
  MASTER_ADDR, MASTER_PORT (launchers/node/environ.py `DIST_VARIABLES`): computed per task by mbx from
  Slurm's variables, or kept from torchrun's.
- The JIT cache variables (trainer/jit_cache.py: TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, CUDA_CACHE_PATH,
  TORCH_EXTENSIONS_DIR, ...): the trainer points them at rank-local folders and the node side removes
  inherited values; a shared value is exactly the race they avoid. Choose the root with `cache_dir`.

Not reserved: PYTHONPATH (mbx prepends its checkout and the software worktrees/overlays; a campaign's value is
kept after them), OMP_NUM_THREADS and PYTHONUNBUFFERED (mbx sets them only when the campaign does not),
XDG_CACHE_HOME and everything else.
"""

from __future__ import annotations

from launchers.node.environ import DIST_VARIABLES, JIT_CACHE_VARIABLES

RESERVED_PREFIXES: dict[str, str] = {
    "MBX_": "MBX_ names are mbx's own: the software versions it builds and installs, the run dir, cell id, "
    "attempt, container image, profiler and cache settings",
    "SLURM_": "Slurm sets SLURM_ names for each task and mbx's node side reads them",
    "TORCHELASTIC_": "torchrun sets TORCHELASTIC_ names and mbx's node side reads them",
}
DIST_REASON = "mbx computes torch.distributed's rank variables for every task (launchers/node/environ.py)"
JIT_REASON = (
    "mbx points JIT caches at rank-local folders (trainer/jit_cache.py); choose their root with the recipe's "
    "cache_dir"
)
RESERVED_NAMES: dict[str, str] = {
    **{name: DIST_REASON for name in DIST_VARIABLES},
    **{name: JIT_REASON for name in JIT_CACHE_VARIABLES},
}


def reserved_reason(name: str) -> str | None:
    """Why `name` is reserved for mbx (None: a campaign may use it). Case-sensitive, as environments are."""
    if name in RESERVED_NAMES:
        return RESERVED_NAMES[name]
    for prefix, why in RESERVED_PREFIXES.items():
        if name.startswith(prefix):
            return why
    return None


def name_problem(name: str) -> str | None:
    """`'NAME' is reserved: why` for a reserved name (None: a campaign may set it)."""
    why = reserved_reason(name)
    return f"{name!r} is reserved: {why}; a campaign cannot set, sweep or pass it" if why else None
