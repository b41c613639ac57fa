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

Names that change which code runs (CODE_LOADING below, and its families TRITON_*_PATH and
TORCHINDUCTOR_*REMOTE_CACHE*: each makes a process import a module, load a library, run a program or compiler, or
read compiled code from a place it names; PATH, HOME, CC and CXX among them) are allowed only when the campaign
lists them in `env.allow_code_loading`: a campaign from someone else cannot slip a library, a module path or a
program into the trainer unnoticed. A campaign that needs its own PATH (a python or a compiler of its own) says
so there. mbx prepends its checkout and the software worktrees/overlays to PYTHONPATH; an allowed campaign value
is kept after them.

Not reserved: OMP_NUM_THREADS and PYTHONUNBUFFERED (mbx sets them only when the campaign does not), XDG_CACHE_HOME,
HF_HOME and everything else.
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
    # Python: where it imports modules and bytecode from, what it runs at start
    "PYTHONPATH": "Python imports modules from its folders first",
    "PYTHONHOME": "Python loads its standard library from there",
    "PYTHONSTARTUP": "Python runs that file at an interactive start",
    "PYTHONUSERBASE": "Python imports the user site-packages under it",
    "PYTHONBREAKPOINT": "Python imports and calls that function at breakpoint()",
    "PYTHONWARNINGS": "Python imports the module a warning filter's category names",
    "PYTHONPLATLIBDIR": "Python loads its platform-specific standard library from there",
    "PYTHONPYCACHEPREFIX": "Python reads compiled bytecode from that tree instead of beside the sources",
    "PYTHONEXECUTABLE": "Python on macOS takes it for its own executable, which its subprocesses run",
    "TORCH_CUSTOM_PYTHONPATH": "torch.compile's worker processes import modules from its folders",
    # programs looked up, and the home folder their configuration and Python's user site-packages come from
    "PATH": "every program named without a folder, python and compilers among them, is taken from its folders first",
    "HOME": "Python imports the user site-packages under it and tools read their start-up files there",
    "BASH_ENV": "bash runs that file before every script",
    "ENV": "sh runs that file at every interactive start",
    # the dynamic loader and libraries loaded by name
    "LD_PRELOAD": "the dynamic loader loads that library into every process",
    "LD_LIBRARY_PATH": "the dynamic loader takes shared libraries from its folders first",
    "LD_AUDIT": "the dynamic loader runs that library's hooks in every process",
    "DYLD_INSERT_LIBRARIES": "the macOS loader loads that library into every process",
    "DYLD_LIBRARY_PATH": "the macOS loader takes libraries from its folders first",
    "GCONV_PATH": "glibc's iconv loads character-conversion modules from its folders",
    "CUDA_INJECTION64_PATH": "the CUDA driver loads that library into every CUDA process",
    "CUDA_INJECTION32_PATH": "the CUDA driver loads that library into every 32-bit CUDA process",
    "NVTX_INJECTION64_PATH": "NVTX loads that library into every process that marks a range",
    "NVTX_INJECTION32_PATH": "NVTX loads that library into every 32-bit process that marks a range",
    "TORCH_CUPTI_MONITOR_LIBCUPTI_PATH": "torch's profiler loads that CUPTI library",
    "NCCL_NET_PLUGIN": "NCCL loads that network plugin library",
    "NCCL_TUNER_PLUGIN": "NCCL loads that tuner plugin library",
    "NCCL_PROFILER_PLUGIN": "NCCL loads that profiler plugin library",
    # compilers that JIT builds (Triton, torch.compile, C++/CUDA extensions) run, and what they compile in
    "CC": "Triton, torch.compile and extension builds run that C compiler and load what it builds",
    "CXX": "torch.compile and C++/CUDA extension builds run that C++ compiler and load what it builds",
    "CUDAHOSTCXX": "nvcc runs that host compiler for CUDA extensions",
    "NVCC_CCBIN": "nvcc runs that host compiler",
    "NVCC_PREPEND_FLAGS": "nvcc adds those options to every compilation; -ccbin picks the compiler it runs",
    "NVCC_APPEND_FLAGS": "nvcc adds those options to every compilation; -ccbin picks the compiler it runs",
    "PYTORCH_NVCC": "torch's extension builds run that nvcc",
    "CUDA_HOME": "torch's and Triton's builds run nvcc and ptxas from under it",
    "CUDA_PATH": "torch's and Triton's builds run nvcc and ptxas from under it",
    "TORCHINDUCTOR_CUTLASS_DIR": "torch.compile compiles the CUTLASS sources there into its kernels",
    "TORCHINDUCTOR_CK_DIR": "torch.compile compiles the Composable Kernel sources there into its kernels",
    "TRITON_CACHE_MANAGER": "Triton imports that module:class to manage its kernel cache",
    "TRITON_REMOTE_CACHE_BACKEND": "Triton imports that module:class and loads compiled kernels from it",
    "TRITON_OVERRIDE_DIR": "Triton replaces kernels with the ones in that folder when TRITON_KERNEL_OVERRIDE is set",
    "TRITON_KERNEL_OVERRIDE": "Triton replaces kernels with the ones in TRITON_OVERRIDE_DIR",
    "TORCHINDUCTOR_REDIS_URL": "torch.compile's remote cache loads compiled code from that server",
    "TORCHINDUCTOR_REDIS_HOST": "torch.compile's remote cache loads compiled code from that server",
    "TORCHINDUCTOR_REDIS_PORT": "torch.compile's remote cache loads compiled code from that server",
}
# Whole families: (prefix, what the name must contain or end with, why). A name of one is CODE_LOADING's too.
CODE_LOADING_FAMILIES: tuple[tuple[str, str, str], ...] = (
    (
        "TRITON_",
        "_PATH",
        "Triton runs the tool, or loads the library or headers, that it names: ptxas, cuobjdump, libcuda, ...",
    ),
    ("TORCHINDUCTOR_", "REMOTE_CACHE", "torch.compile loads compiled code from its remote cache"),
)
ALLOW_KEY = "env.allow_code_loading"


def code_loading_reason(name: str) -> str | None:
    """What `name` makes run (None: it does not change which code runs): CODE_LOADING or one of its families."""
    if name in CODE_LOADING:
        return CODE_LOADING[name]
    for prefix, part, why in CODE_LOADING_FAMILIES:
        if name.startswith(prefix) and part in name[len(prefix) :]:
            return why
    return None


def code_loading_names() -> str:
    """The names and families, for a message: `PYTHONPATH, ..., TRITON_*_PATH, TORCHINDUCTOR_*REMOTE_CACHE*`."""
    families = [
        f"{prefix}*{part}" + ("" if part[0] == "_" else "*") for prefix, part, _ in CODE_LOADING_FAMILIES
    ]
    return ", ".join([*CODE_LOADING, *families])


def code_loading_problem(name: str, allowed: list[str] | tuple[str, ...]) -> str | None:
    """`'LD_PRELOAD' changes which code runs (...)` for a name of CODE_LOADING the campaign did not allow."""
    why = code_loading_reason(name)
    if why is None or name in allowed:
        return None
    return (f"{name!r} changes which code runs ({why}); a campaign sets, sweeps or passes it only on purpose: "
            f"list it in {ALLOW_KEY}")  # fmt: skip
