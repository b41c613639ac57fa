"""The run directory contract: file names, records, atomic writes, tolerant reads and `resolve_state`.

One attempt of one cell runs in one directory (`<workspace>/<campaign>/<cell>/<attempt>/`). Every program
that touches it — the bundled trainer on a compute node, the per-rank entry and attempt wrapper of the
launchers, the engine, command-trainer collection, `mbx ingest`, the report — reads and writes its files
through this module, so the format has one owner. Standard library only: it is imported by the trainer
before torch, by node-side launcher code inside containers where only the mbx checkout is mounted, and by
login-node code.

Files (who writes each: see ARCHITECTURE.md)::

    recipe.yaml     the resolved recipe (login side; the trainer only when absent)
    launch.json     launcher, job id, command, fingerprint of the submitting side (login side only)
    node.json       the node's fingerprint and job context (rank 0 on the node only)
    env.json        the trainer's view of its environment (bundled trainer, rank 0)
    metrics.jsonl   one JSON object per training step, append-only (trainer) or replaced whole (collection)
    status.json     the final state, written last (see WRITERS)
    exit.json       the attempt wrapper's facts about the process: exit code, signal, time limit
    hung.json       the engine's note that it cancelled a command that logged every step but did not exit
    logs/           stdout/stderr per rank
    requeued/<n>/   what a run interrupted by a Slurm requeue left (node side moves it there)
    checkpoint/step-<N>/   the bundled trainer's saved state after step N (trainer/checkpoint.py: the format)
    profile.txt     the bundled trainer's torch.profiler tables (profile-trace.json beside it: torch's own format)
    logs/jit-cache-rank<r>.json   the JIT cache folders rank r used (trainer/jit_cache.py decides them)
    .disk-reserve   space the attempt wrapper holds while the command runs, freed to record its end on a full disk

The format version: every record mbx writes here carries the run-dir format it was written in (FORMAT_VERSION
under FORMAT_KEY: in each JSON record, in each metrics.jsonl row, in profile.txt's first line). A record without
one is v1 (mbx before 2026-12-06). Readers take v1 up to FORMAT_VERSION and bring an older record to the current
format in one place (`upgrade`, one step per version); a newer record is refused with NewerFormat ("<file>:
written by a newer mbx (vN); ..."), which the CLI says and exits 2 on (the engine records the attempt failed with
it), and no writer here writes over one. recipe.yaml is the recipe (trainer/recipe.py's schema), checkpoint.json
carries checkpoint.py's own format, logs/ are the programs' own output: none of them is a run-dir record.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from trainer import atomic

RECIPE = "recipe.yaml"
LAUNCH = "launch.json"
NODE = "node.json"
ENV = "env.json"
METRICS = "metrics.jsonl"
# A step row's `extra` key: mbx's own Megatron-LM FLOPs count over the row's step time, per GPU, in TFLOP/s, beside
# the trainer's printed `tflops_per_gpu` (a command trainer with BRIDGE_CONFIG; reports/flops_check.py compares them)
MBX_TFLOPS = "mbx_tflops_per_gpu"
STATUS = "status.json"
EXIT = "exit.json"
HUNG = "hung.json"
PROFILE_TEXT = "profile.txt"  # the bundled trainer's torch.profiler tables (write_profile_text)
PROFILE_TRACE = "profile-trace.json"  # its Chrome trace: torch's own format (reports/profile_view.py)
JIT_CACHE_RECORD = "jit-cache-rank{rank}.json"  # under logs/: the JIT cache folders of one rank
# A Megatron-Bridge run's resolved ConfigContainer (Bridge writes it: the campaign sets
# logger.save_config_filepath={run_dir}/bridge-config.yaml); the command kind reads it to count FLOPs.
BRIDGE_CONFIG = "bridge-config.yaml"
JIT_CACHE = "jit-cache"  # an external command's rank-local JIT caches (launchers/node/jit_env.py)
LOGS = "logs"
REQUEUED = "requeued"
CHECKPOINTS = "checkpoint"  # checkpoint/step-<N>/, each with CHECKPOINT_META (written last: a complete one)
CHECKPOINT_META = "checkpoint.json"
DISK_RESERVE = ".disk-reserve"  # the attempt wrapper's (launchers/node/attempt.py): deleted when the attempt ends
DISK_RESERVE_BYTES = 256 << 10  # exit.json, status.json with a log tail, a line in the log: a few pages
# What a rerun of the same job (Slurm requeue) must not mix with the interrupted run's outputs.
RUN_OUTPUTS = (STATUS, EXIT, METRICS, ENV, NODE, LOGS)

# The run-dir format (module docstring): the version this mbx writes, and the key that carries it.
FORMAT_VERSION = 2
FORMAT_KEY = "mbx_format"
FIRST_FORMAT = 1  # a record without FORMAT_KEY: written before the format was versioned
NEWER = "written by a newer mbx"  # how a refused record is named (problem texts start with the path)

# Limits on what a reader takes from a run dir (README "Reliability"): far above what the trainer writes
# (a JSON record is a few KB; a metrics row ~0.5 KB, so 100,000 steps ≈ 50 MB), so only a damaged or
# hostile file meets them, and then it is named as such instead of filling the login node's memory.
MAX_RECORD_BYTES = 16 << 20  # launch/node/env/status/exit/hung.json
MAX_METRICS_BYTES = 512 << 20  # metrics.jsonl
MAX_METRICS_LINE_BYTES = 1 << 20  # one step row

# Final states of an attempt (status.json `state`).
STATES = ("completed", "failed", "timeout", "cancelled", "preempted")

# status.json `written_by`: who decided the state. Readers compare with these names, never with literals.
TRAINER = "trainer"  # the bundled trainer, about itself
WRAPPER = "launcher"  # the attempt wrapper on the node, from the process's exit (the trainer wrote nothing)
SCHEDULER = "mbx slurm poll"  # the login side, from what Slurm said about a job that ended
COLLECTOR = "mbx collect (command trainer)"  # the login side, from a command trainer's logs and exit
INGEST = "mbx ingest"  # `mbx ingest`, from the logs of a past run
WRITERS = (TRAINER, WRAPPER, SCHEDULER, COLLECTOR, INGEST)

# Every key a status.json may hold (one schema for every writer; `status_problems` checks a record).
STATUS_KEYS = frozenset({
    "state", "reason", "written_by", "failure_class", "retryable", "exit_code",
    "steps_completed", "steps_planned", "steps_logged", "skipped_iterations", "nan_iterations",
    "flops_per_step", "world_size", "device", "gpu_name", "torch_version", "params", "started_at", "ended_at",
    "log_tail", "log_files", "launcher_status", "slurm_state", "job_id", "attempt_wrapper", "signal", FORMAT_KEY,
})  # fmt: skip

# status.json `failure_class` of an attempt the attempt wrapper refused before starting its command: the
# allocation's GPU has less memory than the point needs by its memory estimate (launchers/node/attempt.py).
INFEASIBLE = "infeasible"

# The environment fingerprint: the keys a report compares across cells, merged from launch.json (login side),
# node.json (node) and env.json (trainer), later files winning.
FINGERPRINT_KEYS = (
    "gpu_name", "gpu_memory_gib", "gpu_count", "driver", "cuda", "torch", "transformer_engine", "nccl", "python",
    "container_image", "git_sha", "hostname",
)  # fmt: skip


# ---- JSON files ------------------------------------------------------------------------------------------
def _finite_or_none(value: Any) -> Any:
    """NaN/inf are not JSON: spell them null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: Path, data: dict[str, Any]) -> None:
    """`data` as indented JSON, whole or not at all (trainer.atomic: readers see the old or the new file)."""
    atomic.write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing, unreadable, not UTF-8, not JSON or not an object."""
    try:
        if Path(path).stat().st_size > MAX_RECORD_BYTES:
            return None  # json_problem names the limit
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


# ---- the format version ----------------------------------------------------------------------------------
class NewerFormat(Exception):
    """A run-dir file written by a newer mbx: `<path>: written by a newer mbx (vN); ...`. Not a ValueError, so
    no reader takes it for a damaged file; the CLI says it and exits 2, the engine records the attempt failed."""


def format_problem(version: Any) -> str | None:
    """Why a record of format `version` cannot be read by this mbx (None: a version it knows)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < FIRST_FORMAT:
        return f"{FORMAT_KEY} {version!r} is not a format version (a whole number from {FIRST_FORMAT})"
    if version > FORMAT_VERSION:
        return (f"{NEWER} (v{version}); this mbx reads run-dir formats v{FIRST_FORMAT} to v{FORMAT_VERSION}: "
                "read it with that mbx or a newer one")  # fmt: skip
    return None


def checked_version(where: str, version: Any) -> str | None:
    """None for a version this mbx reads; why not for one that is not a version (the file is damaged); raises
    NewerFormat (naming `where`) for a newer one."""
    problem = format_problem(version)
    if problem is not None and problem.startswith(NEWER):
        raise NewerFormat(f"{where}: {problem}")
    return problem


def _node_v1(record: dict[str, Any]) -> dict[str, Any]:
    """node.json v1 written before 2026-12-03 named Transformer Engine's version `te`."""
    if record.get("transformer_engine") is None and record.get("te") is not None:
        record["transformer_engine"] = record.pop("te")
    return record


def _env_v1(record: dict[str, Any]) -> dict[str, Any]:
    """env.json v1: a null transformer_engine says nothing node.json does not (the same package metadata, or a
    failed import before 2026-12-03), so it no longer hides node.json's version in the fingerprint."""
    if "transformer_engine" in record and record["transformer_engine"] is None:
        del record["transformer_engine"]
    return record


def _status_v1(record: dict[str, Any]) -> dict[str, Any]:
    """status.json v1 written before 2026-12-03: the bundled trainer named the signal that stopped it only in its
    reason (also in a collector's copy of the launcher's status)."""
    reason = str(record.get("reason") or "")
    if record.get("written_by") == TRAINER and not record.get("signal"):
        for name in ("SIGTERM", "SIGINT", "SIGKILL"):
            if reason.endswith(f"terminated by signal {name}"):
                record["signal"] = name
    if isinstance(record.get("launcher_status"), dict):
        record["launcher_status"] = _status_v1(dict(record["launcher_status"]))
    return record


# What changed in a file from one version to the next: (file name, from version) → the change. A file with no
# entry for a version did not change in it (v1 → v2 only added the version itself to the others).
_UPGRADES: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    (NODE, 1): _node_v1, (ENV, 1): _env_v1, (STATUS, 1): _status_v1,
}  # fmt: skip


def upgrade(name: str, record: dict[str, Any], version: int) -> dict[str, Any]:
    """A record of file `name` written in format `version`, as this mbx writes it (each version's change in turn):
    the one place where older run-dir formats are brought to this one."""
    for step in range(version, FORMAT_VERSION):
        change = _UPGRADES.get((name, step))
        if change is not None:
            record = change(record)
    return record


def _stamped(record: dict[str, Any]) -> dict[str, Any]:
    """The record with this mbx's format version first."""
    return {FORMAT_KEY: FORMAT_VERSION, **{key: value for key, value in record.items() if key != FORMAT_KEY}}


def _record(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the record in the current format, None); (None, why) when its version is not one; (None, None) when it
    is missing or damaged (`json_problem` says which). NewerFormat when a newer mbx wrote it."""
    data = read_json(path)
    if data is None:
        return None, None
    version = data.pop(FORMAT_KEY, FIRST_FORMAT)
    problem = checked_version(str(path), version)
    if problem is not None:
        return None, problem
    return upgrade(Path(path).name, data, version), None


def _refuse_newer(path: Path) -> None:
    """NewerFormat when a newer mbx wrote the file at `path`: this mbx never writes over it (nothing is lost)."""
    if path.is_file() and path.name == METRICS:
        with contextlib.suppress(OSError, ValueError, RecursionError), path.open("rb") as handle:
            first = json.loads(handle.readline(MAX_METRICS_LINE_BYTES))
            if isinstance(first, dict):
                checked_version(f"{path}:1", first.get(FORMAT_KEY, FIRST_FORMAT))
    elif path.is_file():
        data = read_json(path)
        if data is not None:
            checked_version(str(path), data.get(FORMAT_KEY, FIRST_FORMAT))


def write_record(run_dir: Path, name: str, record: dict[str, Any]) -> None:
    """Write the JSON record `name` of a run dir in the current format (whole or not at all); NewerFormat,
    nothing written, when a newer mbx wrote the one there."""
    path = Path(run_dir) / name
    _refuse_newer(path)
    write_json(path, _stamped(record))


def read_record(run_dir: Path, name: str) -> dict[str, Any] | None:
    """The JSON record `name` of a run dir in the current format (without FORMAT_KEY), or None when it is missing
    or damaged (`file_problems` says which); NewerFormat when a newer mbx wrote it."""
    return _record(Path(run_dir) / name)[0]


def record_problem(path: Path) -> str | None:
    """Why a run-dir JSON record that exists cannot be read (damaged, or its version is not one); None when it
    is fine; NewerFormat when a newer mbx wrote it."""
    return json_problem(path) or _record(path)[1]


# ---- checkpoint/step-<N>/ --------------------------------------------------------------------------------


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the bundled trainer saves its state after `step`."""
    return Path(run_dir) / CHECKPOINTS / f"step-{step}"


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints (their CHECKPOINT_META exists) under a run dir, ascending."""
    steps = []
    for path in (Path(run_dir) / CHECKPOINTS).glob("step-*"):
        number = path.name.removeprefix("step-")
        if number.isdigit() and (path / CHECKPOINT_META).is_file():
            steps.append(int(number))
    return sorted(steps)


# ---- status.json -----------------------------------------------------------------------------------------
def status_problems(record: dict[str, Any]) -> list[str]:
    """What makes a status record break the one schema (empty when it is fine)."""
    problems = [f"unknown key {key!r}" for key in sorted(set(record) - STATUS_KEYS)]
    if record.get("state") not in STATES:
        problems.append(f"state {record.get('state')!r} is not one of {', '.join(STATES)}")
    if record.get("written_by") not in WRITERS:
        problems.append(f"written_by {record.get('written_by')!r} is not one of {', '.join(WRITERS)}")
    return problems


def write_status(run_dir: Path, record: dict[str, Any], writer: str) -> dict[str, Any]:
    """Write status.json (atomically) as `writer`; refuses a record that breaks the schema."""
    record = {**record, "written_by": writer}
    problems = status_problems(record)
    if problems:
        raise ValueError(f"{Path(run_dir) / STATUS}: " + "; ".join(problems))
    write_record(run_dir, STATUS, record)
    return record


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The run's status.json, or None when the run has not finished (or the file is unreadable)."""
    return read_record(run_dir, STATUS)


def trainer_status(*, state: str, reason: str | None, steps_completed: int, steps_planned: int,
                   skipped_iterations: int, nan_iterations: int, flops_per_step: float, world_size: int,
                   device: str, gpu_name: str | None, torch_version: str, params: int, started_at: float,
                   ended_at: float, signal: str | None = None) -> dict[str, Any]:
    """The bundled trainer's status record (written with `write_status(..., TRAINER)`); `signal` names the
    signal that stopped it (e.g. SIGTERM), so readers need not parse the reason."""
    record = {
        "state": state, "reason": reason, "steps_completed": steps_completed, "steps_planned": steps_planned,
        "skipped_iterations": skipped_iterations, "nan_iterations": nan_iterations,
        "flops_per_step": float(flops_per_step), "world_size": world_size, "device": device,
        "gpu_name": gpu_name, "torch_version": torch_version, "params": params, "started_at": started_at,
        "ended_at": ended_at,
    }  # fmt: skip
    return {**record, "signal": signal} if signal else record


def one_line(err: BaseException) -> str:
    """`Type: message` on one line, for status.json's reason."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


# ---- exit.json, hung.json, launch.json, node.json, env.json ----------------------------------------------
def reserve_space(run_dir: Path, size: int = DISK_RESERVE_BYTES) -> None:
    """Hold `size` bytes of the run dir's file system in DISK_RESERVE (allocated, not sparse), so that once the
    command has ended its exit and status can be recorded even if the disk filled meanwhile. No file when the
    space is not there. Best effort where space freed comes back late (copy-on-write file
    systems, Lustre) or where fallocate is missing (random bytes then: a compressing file system keeps them)."""
    path = Path(run_dir) / DISK_RESERVE
    try:
        with path.open("wb") as handle:
            try:
                os.posix_fallocate(handle.fileno(), 0, size)
            except OSError as err:
                if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # file systems without fallocate: write
                    raise
                handle.write(os.urandom(size))
                handle.flush()
                os.fsync(handle.fileno())
    except OSError:
        release_space(run_dir)


def release_space(run_dir: Path) -> None:
    """Delete DISK_RESERVE, if there is one."""
    try:
        (Path(run_dir) / DISK_RESERVE).unlink(missing_ok=True)
    except OSError:
        pass


def write_exit(run_dir: Path, *, exit_code: int | None, started_at: float, ended_at: float,
               timed_out_after_s: float | None = None, stopped_by_signal: int | None = None) -> None:
    """exit.json: how the process ended, as the attempt wrapper saw it (facts, not a verdict)."""
    record: dict[str, Any] = {
        "exit_code": exit_code,
        "signal": -exit_code if exit_code is not None and exit_code < 0 else None,
        "started_at": started_at,
        "ended_at": ended_at,
    }
    if timed_out_after_s is not None:
        record["timed_out_after_s"] = timed_out_after_s
    if stopped_by_signal is not None:
        record["stopped_by_signal"] = stopped_by_signal
    write_record(run_dir, EXIT, record)


def read_exit(run_dir: Path) -> dict[str, Any] | None:
    return read_record(run_dir, EXIT)


def write_hung(run_dir: Path, record: dict[str, Any]) -> None:
    write_record(run_dir, HUNG, record)


def read_hung(run_dir: Path) -> dict[str, Any] | None:
    return read_record(run_dir, HUNG)


def launch_record(*, launcher: str, campaign: str, cell_id: str, attempt: int, job_id: str | None,
                  command: list[str] | None, nodes: int | None = None, ranks_per_node: int | None = None,
                  env_set: list[str] | None = None, env_passed_by_name: list[str] | None = None,
                  fingerprint: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """The launch.json record: who launched which attempt how (environment values never, names only)."""
    return {
        "launcher": launcher, "campaign": campaign, "cell_id": cell_id, "attempt": attempt, "job_id": job_id,
        "command": command, "nodes": nodes, "ranks_per_node": ranks_per_node, "env_set": env_set or [],
        "env_passed_by_name": env_passed_by_name or [], "fingerprint": fingerprint or {},
        "written_at": time.time(), **extra,
    }  # fmt: skip


def write_recipe(run_dir: Path, recipe: dict[str, Any], *, only_if_absent: bool = False) -> Path:
    """recipe.yaml: the resolved recipe (keys in the given order), whole or not at all. The login side writes it
    before submission; the bundled trainer (only_if_absent) when it was started by hand."""
    import yaml  # here, not above: node-side launcher code imports this module with the standard library only

    path = Path(run_dir) / RECIPE
    if not (only_if_absent and path.exists()):
        atomic.write_text(path, yaml.safe_dump(recipe, sort_keys=False, default_flow_style=False, allow_unicode=True))
    return path


def write_launch(run_dir: Path, record: dict[str, Any]) -> None:
    """launch.json: written by the login side only (the node writes node.json)."""
    write_record(run_dir, LAUNCH, record)


def read_launch(run_dir: Path) -> dict[str, Any] | None:
    return read_record(run_dir, LAUNCH)


def write_node(run_dir: Path, record: dict[str, Any]) -> None:
    """node.json: written by rank 0 on the node only (the login side writes launch.json)."""
    write_record(run_dir, NODE, record)


def read_node(run_dir: Path) -> dict[str, Any] | None:
    return read_record(run_dir, NODE)


def write_env(run_dir: Path, record: dict[str, Any]) -> None:
    write_record(run_dir, ENV, record)


def read_env(run_dir: Path) -> dict[str, Any] | None:
    return read_record(run_dir, ENV)


def host_env() -> dict[str, Any]:
    """Host facts that need no torch (the start of env.json)."""
    return {
        "hostname": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }


def read_fingerprint(run_dir: Path) -> dict[str, Any] | None:
    """The environment fingerprint of an attempt (FINGERPRINT_KEYS), merged from launch, node and env files."""
    merged: dict[str, Any] = {}
    launch = read_launch(run_dir) or {}
    fingerprint = launch.get("fingerprint")
    merged.update(fingerprint if isinstance(fingerprint, dict) else {})
    merged.update(read_node(run_dir) or {})
    merged.update(read_env(run_dir) or {})
    picked = {key: merged[key] for key in FINGERPRINT_KEYS if merged.get(key) is not None}
    return picked or None


# ---- metrics.jsonl ---------------------------------------------------------------------------------------
class MetricsWriter:
    """<run dir>/metrics.jsonl: one JSON object per training step, appended and flushed line by line (each row
    carries the format version: `{"mbx_format": 2, "step": ...}`)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / METRICS
        self._file: TextIO = open(self.path, "a", buffering=1)  # noqa: SIM115 (closed in close())

    def write(self, row: dict[str, Any]) -> None:
        clean = {FORMAT_KEY: FORMAT_VERSION}
        clean.update((k, _finite_or_none(v)) for k, v in row.items())
        clean[FORMAT_KEY] = FORMAT_VERSION
        self._file.write(json.dumps(clean, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def write_metrics(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """metrics.jsonl with one row per step, replaced atomically (a reader sees the old or the new file); NewerFormat,
    nothing written, when a newer mbx wrote the one there."""
    path = Path(run_dir) / METRICS
    _refuse_newer(path)
    with atomic.replacing(path) as handle:
        for row in rows:
            handle.write(json.dumps(_stamped(row), allow_nan=True) + "\n")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Step rows of a run dir's (or a file's) metrics.jsonl, in file order.

    A writer killed mid-line leaves a partial last line: it is ignored. A malformed line anywhere
    else is an error (ValueError), because it means the file was corrupted rather than cut short. Rows come
    in the current format without FORMAT_KEY; a row a newer mbx wrote is NewerFormat (not a ValueError).
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS
    if not path.exists():
        return []
    size = path.stat().st_size
    if size > MAX_METRICS_BYTES:
        raise ValueError(f"{path}: too large ({size >> 20} MiB; the limit for {METRICS} is "
                         f"{MAX_METRICS_BYTES >> 20} MiB)")  # fmt: skip
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    rows: list[dict[str, Any]] = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        if len(line) > MAX_METRICS_LINE_BYTES:
            raise ValueError(f"{path}:{index + 1}: a line longer than {MAX_METRICS_LINE_BYTES >> 20} MiB "
                             "(the limit for a step row)")  # fmt: skip
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            is_last = index == len(lines) - 1 or all(not rest.strip() for rest in lines[index + 1 :])
            if is_last and not raw.endswith(b"\n"):
                break  # truncated tail: the writer died mid-line
            raise ValueError(f"{path}:{index + 1}: not a JSON object: {line[:80]!r}") from None
        if isinstance(row, dict):
            version = row.pop(FORMAT_KEY, FIRST_FORMAT)
            rows.append(row if version == FORMAT_VERSION else _old_row(path, index, row, version))
    return rows


def _old_row(path: Path, index: int, row: dict[str, Any], version: Any) -> dict[str, Any]:
    """A metrics row of another format than the current one: upgraded, or refused (NewerFormat; ValueError for a
    version that is not one)."""
    problem = checked_version(f"{path}:{index + 1}", version)
    if problem is not None:
        raise ValueError(f"{path}:{index + 1}: {problem}")
    return upgrade(METRICS, row, version)


def _bytes_or_problem(path: Path, limit: int = MAX_RECORD_BYTES) -> tuple[bytes | None, str | None]:
    """A file's bytes, or why they cannot be read (None, None when it is missing)."""
    try:
        size = Path(path).stat().st_size
        if size > limit and Path(path).is_file():
            return None, f"too large ({size >> 20} MiB; the limit is {limit >> 20} MiB)"
        return Path(path).read_bytes(), None
    except FileNotFoundError:
        return None, None
    except IsADirectoryError:
        return None, "is a directory, not a file"
    except OSError as err:
        return None, f"unreadable ({err.strerror or err})"


def json_problem(path: Path) -> str | None:
    """Why a JSON object file that exists cannot be read (None when it is missing or fine)."""
    raw, problem = _bytes_or_problem(path)
    if raw is None:
        return problem
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except (ValueError, RecursionError):
        return "not valid JSON (truncated or overwritten?)"
    return None if isinstance(data, dict) else "not a JSON object"


def text_problem(path: Path) -> str | None:
    """Why a text file that exists cannot be read as UTF-8 (None when it is missing or fine)."""
    raw, problem = _bytes_or_problem(path)
    if raw is None:
        return problem
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    return None


def read_metrics_checked(run_dir: Path) -> tuple[list[dict[str, Any]], str | None]:
    """(step rows, None), or ([], "path: what is wrong") when metrics.jsonl is corrupt or not a file;
    NewerFormat when a newer mbx wrote it."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return [], None  # run_dir_problem says so
    path = run_dir / METRICS
    if path.is_dir():
        return [], f"{path}: is a directory, not a file"
    try:
        return read_metrics(path), None
    except OSError as err:
        return [], f"{path}: unreadable ({err.strerror or err})"
    except ValueError as err:  # a corrupt line before the last
        return [], f"{err} (the file is corrupt)"


def run_dir_problem(run_dir: Path) -> str | None:
    """Why an attempt's run directory cannot be read at all (None when it is a directory)."""
    run_dir = Path(run_dir)
    if run_dir.is_dir():
        return None
    if run_dir.exists() or run_dir.is_symlink():
        return f"{run_dir}: is not a directory (the run directory was overwritten)"
    return f"{run_dir}: the run directory is missing"


def file_problems(run_dir: Path) -> list[str]:
    """`path: what is wrong` for each file of a run dir that exists but cannot be read (metrics.jsonl aside:
    `read_metrics_checked` reads it once for its rows and its problem); NewerFormat when a newer mbx wrote one."""
    run_dir = Path(run_dir)
    problem = run_dir_problem(run_dir)
    if problem is not None:
        return [problem]
    records = (LAUNCH, NODE, ENV, STATUS, EXIT, HUNG)
    found = [(run_dir / name, record_problem(run_dir / name)) for name in records]
    found.append((run_dir / RECIPE, text_problem(run_dir / RECIPE)))
    profile = read_profile_header(run_dir)
    found.append((run_dir / PROFILE_TEXT, profile.problem if profile else None))
    return [f"{path}: {why}" for path, why in found if why is not None]


def last_logged_step(run_dir: Path) -> int | None:
    """The last training step an attempt logged: status.json's steps_completed, else metrics.jsonl's."""
    completed = (read_status(run_dir) or {}).get("steps_completed")
    if isinstance(completed, int) and not isinstance(completed, bool):
        return completed
    try:
        rows = read_metrics(run_dir)
    except (OSError, ValueError):
        return None
    steps = [r["step"] for r in rows if isinstance(r.get("step"), int)]
    return max(steps) if steps else None


# ---- profile.txt, logs/jit-cache-rank<r>.json ------------------------------------------------------------
_PROFILE_FORMAT = re.compile(rf"# {FORMAT_KEY}: (\S+)\n")  # profile.txt's first line (v1: none)
_PROFILE_STEPS = re.compile(r"\((\d+) steps\)")
PROFILE_HEADER_BYTES = 1024  # how much of profile.txt a reader looks at for its header


@dataclass(frozen=True)
class ProfileHeader:
    """What profile.txt's header says."""

    version: Any  # its format version as written
    steps: int | None  # how many steps its tables cover (None: the header does not say)
    problem: str | None = None  # why it cannot be read (a version that is not one)


def write_profile_text(run_dir: Path, *, first: int, last: int, sorted_by: str, tables: str) -> Path:
    """profile.txt: the format line, which steps the tables cover and how they are sorted, then torch.profiler's
    tables (whole or not at all)."""
    path = Path(run_dir) / PROFILE_TEXT
    atomic.write_text(path, f"# {FORMAT_KEY}: {FORMAT_VERSION}\n# torch.profiler over steps {first}..{last} "
                            f"({last - first + 1} steps), sorted by {sorted_by}\n{tables}")  # fmt: skip
    return path


def read_profile_header(run_dir: Path) -> ProfileHeader | None:
    """profile.txt's header (its first PROFILE_HEADER_BYTES), or None when there is no readable profile.txt;
    NewerFormat when a newer mbx wrote it."""
    path = Path(run_dir) / PROFILE_TEXT
    try:
        with path.open("rb") as handle:
            head = handle.read(PROFILE_HEADER_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    version: Any = FIRST_FORMAT
    if match := _PROFILE_FORMAT.match(head):
        version = int(match.group(1)) if match.group(1).isdigit() else match.group(1)
    problem = checked_version(str(path), version)
    if problem is not None:
        return ProfileHeader(version, None, problem)
    steps = _PROFILE_STEPS.search(head)
    return ProfileHeader(version, int(steps.group(1)) if steps else None)


def write_jit_cache_record(run_dir: Path, record: dict[str, Any]) -> Path:
    """logs/jit-cache-rank<r>.json: the JIT cache folders rank `record["rank"]` used (trainer/jit_cache.py)."""
    path = Path(run_dir) / LOGS / JIT_CACHE_RECORD.format(rank=record["rank"])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, _stamped(record))
    return path


# ---- the final state -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SchedulerWord:
    """A scheduler's final word on a job that ended: the mbx state it means and why, in its own words.

    `failed_as` prefixes the reason when the scheduler says a job failed while a rank wrote its own status
    (e.g. "Slurm job 7 FAILED").
    """

    state: str  # one of STATES
    reason: str
    word: str = ""  # the scheduler's own name for the state (Slurm: TIMEOUT, CANCELLED, ...)
    failed_as: str = ""


@dataclass(frozen=True)
class Resolution:
    """A run's final state, and the status record to write when the facts changed it (None: leave the file)."""

    state: str
    reason: str | None
    failure_class: str | None = None
    write: dict[str, Any] | None = None
    writer: str | None = None


_CLASS_OF_STATE = {"timeout": "timeout", "preempted": "preempted"}


def interrupted(status: dict[str, Any]) -> bool:
    """A status written after a signal (the wrapper's, or the trainer's own "terminated by signal"): a scheduler
    knows better why the signal came (scancel, time limit, preemption, another rank failing)."""
    if status.get("state") == "completed":
        return False
    if status.get("signal"):  # the trainer names the signal that stopped it
        return True
    return status.get("written_by") == WRAPPER and (
        status.get("state") == "cancelled"  # it forwarded a signal to the trainer
        or (status.get("state") == "failed" and isinstance(status.get("exit_code"), int)
            and status["exit_code"] < 0)  # the trainer was killed by a signal the wrapper did not send
    )


def resolve_state(
    status: dict[str, Any] | None,
    exit_info: dict[str, Any] | None = None,
    *,
    scheduler: SchedulerWord | None = None,
    job_state: str | None = None,
) -> Resolution:
    """Decide a run's final state from its facts, in this order of trust:

    1. a status that says `completed` (the program's own word, or a collector's);
    2. a scheduler's final word, when no process recorded its end (no status, or no exit.json) or the
       status only says a signal came (the scheduler knows why);
    3. the attempt wrapper's own stop (its time limit, a forwarded signal), over no status or the trainer's
       own non-completed one (a scheduler's or collector's status already took the exit into account);
    4. any other status as written;
    5. the process's exit code (the trainer wrote nothing);
    6. nothing at all: the launcher's job state (`job_state`), else failed.

    `write` is set when the facts call for a new status.json (the caller writes it with `writer`).
    """
    status_state = str(status.get("state")) if status else None
    if status_state == "completed":
        return Resolution("completed", status.get("reason"), status.get("failure_class"))  # type: ignore[union-attr]
    if scheduler is not None and (status is None or exit_info is None or interrupted(status)):
        return _by_scheduler(status, scheduler)
    stop = _wrapper_stop(exit_info)
    if stop is not None and (status is None or status.get("written_by") in (None, TRAINER)):
        state, reason = stop
        return _written(state, reason, exit_info, WRAPPER)
    if status is not None:
        state = status_state if status_state in STATES else "failed"
        failure_class = status.get("failure_class", _CLASS_OF_STATE.get(state))
        return Resolution(state, status.get("reason"), failure_class)
    if exit_info is not None and "exit_code" in exit_info:
        code = exit_info.get("exit_code")
        if code is None:
            return Resolution("failed", "the process left no exit code")
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        reason = f"trainer {how}" if code != 0 else f"trainer exited 0 without writing {STATUS}"
        return _written("failed", reason, exit_info, WRAPPER)
    state = job_state if job_state in ("timeout", "cancelled", "preempted") else "failed"
    return Resolution(state, f"no {STATUS} was written (scheduler state: {job_state or 'unknown'})",
                      _CLASS_OF_STATE.get(state))  # fmt: skip


def _wrapper_stop(exit_info: dict[str, Any] | None) -> tuple[str, str] | None:
    if not exit_info:
        return None
    if exit_info.get("timed_out_after_s") is not None:
        return "timeout", f"time limit of {float(exit_info['timed_out_after_s']):.0f} s reached"
    if exit_info.get("stopped_by_signal") is not None:
        return "cancelled", f"cancelled (signal {exit_info['stopped_by_signal']})"
    return None


def _written(state: str, reason: str, exit_info: dict[str, Any] | None, writer: str) -> Resolution:
    record = {"state": state, "reason": reason, "exit_code": (exit_info or {}).get("exit_code")}
    return Resolution(state, reason, _CLASS_OF_STATE.get(state), record, writer)


def _by_scheduler(status: dict[str, Any] | None, word: SchedulerWord) -> Resolution:
    """The scheduler's word over a missing or signal-only status (the old status is kept inside the new one)."""
    state, reason = word.state, word.reason
    if word.state == "failed" and status is not None and word.failed_as:
        if status.get("state") == "cancelled":  # rank 0 was stopped, not killed by its own failure
            reason = f"{word.failed_as}: another rank failed and srun stopped the others (see logs/rank-*.log)"
        else:
            reason = f"{word.failed_as}: {status.get('reason')} (see logs/rank-*.log)"
    record: dict[str, Any] = {**(status or {}), "state": state, "reason": reason, "slurm_state": word.word}
    if status is not None:
        record["attempt_wrapper"] = {"state": status.get("state"), "reason": status.get("reason")}
    record.pop("written_by", None)
    return Resolution(state, reason, _CLASS_OF_STATE.get(state), record, SCHEDULER)


def settle(run_dir: Path, resolution: Resolution) -> Resolution:
    """Write the status record a resolution calls for (if any); return the resolution."""
    if resolution.write is not None and resolution.writer is not None:
        write_status(run_dir, resolution.write, resolution.writer)
    return resolution
