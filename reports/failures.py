"""Why a run ended badly, from all its rank logs and exit codes: infra, oom, nan, config, timeout, preempted, hung_after_finish or unknown.

    result = classify_failure(["logs/rank0.log", "logs/rank1.log"], exit_codes=[1, 0])
    result.failure_class, result.retryable, result.reason
    # "oom", False, "oom: CUDA out of memory (logs/rank1.log:57): torch.OutOfMemoryError: CUDA out of ..."

The logs are scanned in binary chunks for known signatures (literal prefilters, then a regex); of a
big log only the first 32 MiB and the last 64 MiB are searched (failures show at the start or at the
end), the middle is only read to count lines. Signatures are tried in a fixed priority order,
root causes before their echoes: a rank that runs out of memory makes the others hit NCCL watchdog
timeouts, a Slurm time limit makes every rank print connection errors, so `oom` outranks `infra`
and `timeout` outranks both. Within one signature the first file (natural order: rank2 before
rank10) and first line win.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reports import secrets
from reports.failure_classes import RETRYABLE_BY_DEFAULT, FailureClass

CHUNK = 8 << 20
# Failures show at the start of a log (configuration) or at its end (crash, kill, abort): of a big
# log only the first HEAD and last TAIL bytes are searched (the middle is read to count lines), and
# NaN counts only in the last WEAK_TAIL bytes, i.e. right before the run stopped.
HEAD = 32 << 20
TAIL = 64 << 20
WEAK_TAIL = 1 << 20
MAX_LINE = 240
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")
# A line that reads as an error when no signature knows it: a logging record at ERROR/CRITICAL/FATAL
# (`ERROR:megatron.core.datasets.utils:Failed to compile ...`, `[E ...]`) or a Python exception's last line.
ERROR_LINE = re.compile(
    rb"(?m)^[^\n]{0,80}?\b(?:ERROR|CRITICAL|FATAL)\b[:\] ][^\n]*|^(?:[\w.]+\.)?\w*(?:Error|Exception): [^\n]+"
)
ERROR_NEEDLES = (b"ERROR", b"CRITICAL", b"FATAL", b"Error: ", b"Exception: ")
# Megatron's `iteration N/M |` and the bundled trainer's `step N/M |` progress lines.
_ITERATION = re.compile(rb"(?:iteration|^step|\nstep)\s+(\d+)\s*/\s*(\d+)\s*\|")


@dataclass(frozen=True)
class Signature:
    """A log message that tells a failure class: `needles` are literals one of which every match
    contains (cheap prefilter), `pattern` the regex that decides."""

    name: str
    failure_class: str
    needles: tuple[bytes, ...]
    pattern: re.Pattern[bytes]
    startup_only: bool = False  # counts only before any iteration was logged (config errors)
    if_incomplete: bool = False  # counts only when the run did not log all its steps


def _sig(
    name: str, cls: str, needles: tuple[bytes, ...] | bytes, pattern: bytes | None = None, **kw
) -> Signature:
    needles = (needles,) if isinstance(needles, bytes) else needles
    regex = re.compile(pattern if pattern is not None else b"|".join(re.escape(n) for n in needles))
    return Signature(name, cls, needles, regex, **kw)


# Priority order (first match wins). Message formats from Slurm, the Linux OOM killer, PyTorch,
# NCCL, the NVIDIA driver and Megatron-LM (see tests/data/failures/ for one realistic log each).
SIGNATURES: tuple[Signature, ...] = (
    _sig("Slurm preempted the job", "preempted", (b"DUE TO PREEMPTION", b"DUE TO JOB REQUEUE")),
    _sig("Slurm time limit", "timeout", b"DUE TO TIME LIMIT"),
    _sig(
        "Megatron --exit-duration-in-mins reached",
        "timeout",
        b"exiting program after",
        rb"exiting program after [\d.]+ minutes",
    ),
    _sig(
        "CUDA out of memory",
        "oom",
        (b"out of memory", b"OutOfMemoryError", b"cudaErrorMemoryAllocation"),
        rb"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
        rb"|Cuda failure '?out of memory",
    ),
    _sig(
        "host out of memory (OOM killer)",
        "oom",
        (b"oom-kill", b"oom_kill", b"Out Of Memory", b"Out of memory: Killed", b"MemoryError"),
        rb"oom[-_]kill|task \d+: Out Of Memory|Out of memory: Killed process|\bMemoryError\b",
    ),
    _sig(
        "NaN/Inf in loss or gradients",
        "nan",
        (
            b"found NaN",
            b"found Inf",
            b"Unexpected result",
            b"oss is",
            b"NaN or Inf",
            b"on-finite loss",
            b"Detected",
        ),
        rb"found (?:NaN|Inf) in|Unexpected result (?:nan|inf)|[Ll]oss is (?:NaN|nan|[Ii]nf)|NaN or Inf found"
        rb"|[Nn]on-finite loss|Detected (?:NaN|nan)",
    ),
    _sig(
        "NaN iterations counted before the run stopped",
        "nan",
        (b"nan iterations:", b"lm loss:"),
        rb"number of nan iterations:\s*[1-9]|lm loss:\s*[-+]?(?:nan|inf)",
        if_incomplete=True,
    ),
    _sig(
        "bad command: its program or script was not found",
        "config",
        (b"can't open file", b"cannot start '", b"command not found"),
        rb"can't open file|cannot start '[^'\n]*': No such file|: command not found",
    ),
    _sig(
        "command-line error",
        "config",
        b": error: ",
        rb": error: (?:unrecognized arguments|argument |the following arguments are required|invalid choice)",
    ),
    _sig(
        "missing module",
        "config",
        (b"ModuleNotFoundError", b"ImportError"),
        rb"\b(?:ModuleNotFoundError|ImportError): ",
    ),
    _sig("invalid configuration", "config", b"validation error", rb"\d+ validation errors? for "),
    _sig(  # Megatron's start-up runs `make` in megatron/core/datasets (a wheel install has no Makefile there)
        "Megatron could not build its dataset helpers",
        "config",
        b"Failed to compile the C++ dataset helper functions",
        startup_only=True,
    ),
    _sig(  # a pip-installed Megatron without APEX (seen with Bridge 0.6.2 on an H100): set the fusion off
        "gradient-accumulation fusion needs APEX's fused_weight_gradient_mlp_cuda (gradient_accumulation_fusion: false)",
        "config",
        b"fused_weight_gradient_mlp_cuda",
        rb"gradient_accumulation_fusion set to True but the custom CUDA extension fused_weight_gradient_mlp_cuda",
        startup_only=True,
    ),
    _sig(
        "error before the first iteration",
        "config",
        (
            b"AssertionError",
            b"ValueError",
            b"TypeError",
            b"KeyError",
            b"FileNotFoundError",
            b"NotImplementedError",
            b"NotSupportedError",
        ),
        rb"\b(?:AssertionError|ValueError|TypeError|KeyError|FileNotFoundError|NotImplementedError|NotSupportedError)\b",
        startup_only=True,
    ),
    _sig(
        "GPU hardware error",
        "infra",
        (b"Xid", b"fallen off the bus", b"ECC", b"launch failure", b"unknown error", b"LaunchFailure"),
        rb"\bXid\b|fallen off the bus|uncorrectable ECC|ECC error|cudaErrorECCUncorrectable"
        rb"|unspecified launch failure|cudaErrorLaunchFailure|CUDA error: unknown error",
    ),
    _sig("node failure", "infra", (b"NODE FAILURE", b"NODE_FAIL"), rb"DUE TO NODE FAILURE|\bNODE_FAIL\b"),
    _sig(
        "process crashed (segfault / bus error)",
        "infra",
        (b"Segmentation fault", b"SIGSEGV", b"Bus error", b"SIGBUS", b"core dumped"),
        rb"Segmentation fault|SIGSEGV|Bus error|SIGBUS|core dumped",
    ),
    _sig("illegal memory access", "infra", b"illegal memory access"),
    _sig("no space left on device (ENOSPC)", "infra", (b"No space left", b"Errno 28"),
         rb"No space left on device|\[Errno 28\]"),  # fmt: skip
    _sig("disk quota exceeded (EDQUOT)", "infra", (b"Disk quota exceeded", b"Errno 122"),
         rb"Disk quota exceeded|\[Errno 122\]"),  # fmt: skip
    _sig(
        "network error",
        "infra",
        (
            b"Connection reset by peer",
            b"NET/IB",
            b"retry counter",
            b"ncclSystemError",
            b"ncclRemoteError",
            b"ncclInternalError",
            b"ncclUnhandledCudaError",
            b"NCCL error",
            b"Rendezvous",
            b"DistNetworkError",
            b"Connection refused",
            b"Broken pipe",
        ),
        rb"Connection reset by peer|NET/IB ?: ?Got completion|transport retry counter exceeded"
        rb"|ncclSystemError|ncclRemoteError|ncclInternalError|ncclUnhandledCudaError|NCCL error"
        rb"|Rendezvous(?:Timeout|Connection|Closed)Error|DistNetworkError|Connection refused|Broken pipe",
    ),
    _sig(
        "NCCL watchdog timeout",
        "infra",
        (b"Watchdog", b"watchdog"),
        rb"Watchdog caught collective operation timeout|watchdog thread terminated with exception"
        rb"|watchdog got stuck|Some NCCL operations have failed or timed out",
    ),
)


@dataclass(frozen=True)
class Evidence:
    """The log line that decided a classification."""

    file: str
    line_no: int  # 1-based
    line: str
    signature: str

    def where(self) -> str:
        return f"{self.file}:{self.line_no}"


@dataclass(frozen=True)
class Classification:
    """A failed or ended run's failure class, a one-line reason and whether to retry it."""

    failure_class: FailureClass
    reason: str
    retryable: bool
    evidence: Evidence | None = None
    last_step: int | None = None
    planned_steps: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LogScan:
    """What the scan of a run's logs found."""

    evidence: dict[str, list[Evidence]] = field(default_factory=dict)  # signature → first match per file
    first_iteration: dict[str, int] = field(default_factory=dict)  # file → line of its first iteration line
    last_step: int | None = None
    planned_steps: int | None = None
    files: list[str] = field(default_factory=list)
    error_line: Evidence | None = None  # the first line that reads as an error, for a failure no signature names


def classify_failure(
    logs: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
    exit_codes: Sequence[int | None] | Mapping[Any, int | None] | int | None = None,
    *,
    exited: bool = True,
    all_steps_logged: bool | None = None,
    planned_steps: int | None = None,
    retryable_classes: Iterable[str] = RETRYABLE_BY_DEFAULT,
) -> Classification:
    """Classify a run that failed or ended.

    Parameters
    ----------
    logs
        The run's log files (stdout/stderr of every rank, the Slurm output file, ...), or folders of them.
    exit_codes
        One per rank/process (None where unknown); 124 is the `timeout` command, 128+N or -N a signal.
    exited
        False when the process never exited on its own and the caller killed it after a grace period.
    all_steps_logged
        Whether every planned step was logged; None lets the logs tell (last `iteration N/M` line
        against `planned_steps`, else against M).
    retryable_classes
        Classes worth retrying; by default `infra` and `preempted`.
    """
    scan = scan_logs(logs)
    codes = _codes(exit_codes)
    planned = planned_steps or scan.planned_steps
    if all_steps_logged is None:
        all_steps_logged = scan.last_step is not None and planned is not None and scan.last_step >= planned
    retryable = frozenset(retryable_classes)

    def result(cls: FailureClass, why: str, evidence: Evidence | None = None) -> Classification:
        reason = f"{cls}: {why}"
        if evidence is not None:
            reason += f" ({evidence.where()}): {evidence.line}"
        return Classification(cls, reason, cls in retryable, evidence, scan.last_step, planned)

    progress = _progress(scan.last_step, planned)
    if all_steps_logged and not exited:
        return result(
            "hung_after_finish",
            f"all {progress} steps logged but the process never exited; killed after the grace period",
        )
    if all_steps_logged and exited and codes and all(c == 0 for c in codes):
        return result("unknown", f"no failure: all {progress} steps logged and every process exited 0")
    for sig in SIGNATURES:
        found = scan.evidence.get(sig.name, [])
        if sig.if_incomplete and all_steps_logged:
            continue
        if sig.startup_only:
            found = [ev for ev in found if _at_startup(ev, scan)]
        if found:
            return result(sig.failure_class, sig.name, found[0])  # type: ignore[arg-type]
    if 124 in codes:
        return result("timeout", "exit code 124 (killed by `timeout`)")
    for code in codes:
        if code in (139, -11, 135, -7):
            return result(
                "infra",
                f"exit code {code} ({'SIGSEGV' if code in (139, -11) else 'SIGBUS'}) with no log message",
            )
    if not exited:
        return result(
            "unknown", f"the process made no progress after step {progress} and was killed by the caller"
        )
    bad = [c for c in codes if c not in (0, None)]
    said = "; its first error line" if scan.error_line is not None else ""
    if bad:
        why = f"exit code {_describe_code(bad[0])} with no known failure message in {len(scan.files)} log(s)"
        return result("unknown", why + said, scan.error_line)
    why = f"ended at step {progress} with no known failure message in {len(scan.files)} log(s)"
    return result("unknown", why + said, scan.error_line)


def scan_logs(logs: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]) -> LogScan:
    """First occurrence of every signature in the logs, and the training progress they show."""
    scan = LogScan()
    for path in _log_files(logs):
        name = str(path)
        scan.files.append(name)
        _scan_file(path, name, scan)
    return scan


def _scan_file(path: Path, name: str, scan: LogScan) -> None:
    size = path.stat().st_size
    base_line = 0
    offset = 0  # of `chunk` in the file
    carry = b""
    last: tuple[int, int] | None = None
    with open(path, "rb") as fh:
        while True:
            block = fh.read(CHUNK)
            data = carry + block
            if not block:
                chunk, carry = data, b""
            else:
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    carry = data
                    continue
                chunk, carry = data[:cut], data[cut:]
            if chunk:
                end = offset + len(chunk)
                searched = offset < HEAD or end > size - TAIL
                weak_from = max(0, size - WEAK_TAIL - offset) if end > size - WEAK_TAIL else None
                if name not in scan.first_iteration:
                    m = _ITERATION.search(chunk)
                    if m is not None:
                        scan.first_iteration[name] = base_line + chunk.count(b"\n", 0, m.start()) + 1
                if searched:
                    _scan_chunk(chunk, name, base_line, scan, weak_from)
                found = _last_iteration(chunk)
                if found is not None:
                    last = found
                base_line += chunk.count(b"\n")
                offset = end
            if not block:
                break
    if last is not None:
        step, total = last
        scan.last_step = step if scan.last_step is None else max(scan.last_step, step)
        scan.planned_steps = total if scan.planned_steps is None else max(scan.planned_steps, total)


def _scan_chunk(chunk: bytes, name: str, base_line: int, scan: LogScan, weak_from: int | None) -> None:
    if scan.error_line is None and any(n in chunk for n in ERROR_NEEDLES):
        m = ERROR_LINE.search(chunk)
        if m is not None:
            scan.error_line = _evidence(chunk, m.start(), name, base_line, "error line")
    for sig in SIGNATURES:
        found = scan.evidence.setdefault(sig.name, [])
        if found and found[-1].file == name:
            continue  # only the first match of each file is kept
        start = 0
        if sig.if_incomplete:
            if weak_from is None:
                continue
            start = weak_from
        if not any(n in chunk for n in sig.needles):
            continue
        m = sig.pattern.search(chunk, start)
        if m is not None:
            found.append(_evidence(chunk, m.start(), name, base_line, sig.name))


def _evidence(chunk: bytes, pos: int, name: str, base_line: int, signature: str) -> Evidence:
    start = chunk.rfind(b"\n", 0, pos) + 1
    end = chunk.find(b"\n", pos)
    raw = chunk[start : end if end >= 0 else len(chunk)]
    text = _ANSI.sub(b"", raw).decode("utf-8", "replace").replace("\r", " ").strip()
    # the quoted line goes into status.json, the store and the terminal: masked before it is cut (a cut token no
    # longer reads as one); a secret past the first 16 lines' worth is cut off anyway
    text = secrets.mask(text[: 16 * MAX_LINE])
    if len(text) > MAX_LINE:
        text = text[: MAX_LINE - 1] + "…"
    return Evidence(name, base_line + chunk.count(b"\n", 0, pos) + 1, text, signature)


def _last_iteration(chunk: bytes) -> tuple[int, int] | None:
    """(step, planned steps) of the last `iteration N/M |` line in `chunk`."""
    end = len(chunk)
    for _ in range(10_000):
        pos = chunk.rfind(b"iteration", 0, end)
        if pos < 0:
            return None
        m = _ITERATION.match(chunk, pos)
        if m is not None:
            return int(m.group(1)), int(m.group(2))
        end = pos
    return None


def _at_startup(ev: Evidence, scan: LogScan) -> bool:
    """Whether `ev` came before training started: no log shows an iteration at all, or its own
    log shows its first iteration only after it."""
    if scan.last_step is None:
        return True
    first = scan.first_iteration.get(ev.file)
    return first is None or ev.line_no < first  # no progress line at all: it failed while starting


def _log_files(logs: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]) -> list[Path]:
    items = [logs] if isinstance(logs, (str, os.PathLike)) else list(logs)
    files: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            files.extend(sorted((p for p in path.rglob("*") if p.is_file()), key=_natural))
        else:
            files.append(path)
    return files


def _natural(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def _codes(exit_codes: Sequence[int | None] | Mapping[Any, int | None] | int | None) -> list[int | None]:
    if exit_codes is None:
        return []
    if isinstance(exit_codes, int):
        return [exit_codes]
    if isinstance(exit_codes, Mapping):
        return list(exit_codes.values())
    return list(exit_codes)


def _describe_code(code: int | None) -> str:
    if code is None:
        return "unknown"
    signal = -code if code < 0 else code - 128 if code > 128 else None
    names = {9: "SIGKILL", 15: "SIGTERM", 6: "SIGABRT", 11: "SIGSEGV", 7: "SIGBUS", 2: "SIGINT"}
    if signal in names:
        return f"{code} ({names[signal]})"
    return str(code)


def _progress(last_step: int | None, planned: int | None) -> str:
    if last_step is None:
        return "0" if planned is None else f"0/{planned}"
    return f"{last_step}" if planned is None else f"{last_step}/{planned}"
