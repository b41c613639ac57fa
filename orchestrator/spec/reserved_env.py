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

Names that change which code runs (CODE_LOADING: PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, PYTHONUSERBASE,
PYTHONBREAKPOINT, PYTHONWARNINGS, PYTHONPLATLIBDIR, LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, DYLD_*, BASH_ENV, ENV,
GCONV_PATH, CUDA_INJECTION64_PATH/32, NCCL_NET_PLUGIN, NCCL_TUNER_PLUGIN, NCCL_PROFILER_PLUGIN: each loads a
library, a module or a script it names) are allowed only when the campaign lists them in `env.allow_code_loading`: a campaign from someone else cannot slip a library or a module path into
the trainer unnoticed. mbx prepends its checkout and the software worktrees/overlays to PYTHONPATH; an allowed
campaign value is kept after them.

Not reserved: OMP_NUM_THREADS and PYTHONUNBUFFERED (mbx sets them only when the campaign does not), XDG_CACHE_HOME
and everything else.
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


CODE_LOADING: dict[str, str] = {
    "PYTHONPATH": "Python imports modules from its folders first",
    "PYTHONHOME": "Python loads its standard library from there",
    "PYTHONSTARTUP": "Python runs that file at an interactive start",
    "PYTHONUSERBASE": "Python imports the user site-packages under it",
    "PYTHONBREAKPOINT": "Python imports and calls that function at breakpoint()",
    "LD_PRELOAD": "the dynamic loader loads that library into every process",
    "LD_LIBRARY_PATH": "the dynamic loader takes shared libraries from its folders first",
    "LD_AUDIT": "the dynamic loader runs that library's hooks in every process",
    "DYLD_INSERT_LIBRARIES": "the macOS loader loads that library into every process",
    "DYLD_LIBRARY_PATH": "the macOS loader takes libraries from its folders first",
    "BASH_ENV": "bash runs that file before every script",
    "ENV": "sh runs that file at every interactive start",
    "PYTHONWARNINGS": "Python imports the module a warning filter's category names",
    "PYTHONPLATLIBDIR": "Python loads its platform-specific standard library from there",
    "GCONV_PATH": "glibc's iconv loads character-conversion modules from its folders",
    "CUDA_INJECTION64_PATH": "the CUDA driver loads that library into every CUDA process",
    "CUDA_INJECTION32_PATH": "the CUDA driver loads that library into every 32-bit CUDA process",
    "NCCL_NET_PLUGIN": "NCCL loads that network plugin library",
    "NCCL_TUNER_PLUGIN": "NCCL loads that tuner plugin library",
    "NCCL_PROFILER_PLUGIN": "NCCL loads that profiler plugin library",
}
ALLOW_KEY = "env.allow_code_loading"


def code_loading_problem(name: str, allowed: list[str] | tuple[str, ...]) -> str | None:
    """`'LD_PRELOAD' changes which code runs (...)` for a name of CODE_LOADING the campaign did not allow."""
    if name not in CODE_LOADING or name in allowed:
        return None
    return (f"{name!r} changes which code runs ({CODE_LOADING[name]}); a campaign sets, sweeps or passes it only "
            f"on purpose: list it in {ALLOW_KEY}")  # fmt: skip
