"""Megatron logs into run directories: follow rank logs while a command trainer runs, derive status, ingest past runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reports.metrics import METRICS_FILE, STATUS_FILE, read_status
from reports.parsers import StreamParser, make_parser, merge_rows
from reports.parsers.rows import Row, derive_tokens

WRITTEN_BY = "mbx collect (command trainer)"
HUNG_FILE = "hung.json"
EXIT_FILE = "exit.json"
LOG_SUFFIXES = (".log", ".txt", ".out", ".err", "")
_READ = 8 << 20
_PROGRESS = re.compile(rb"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")


def _natural(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def log_files(folder: Path) -> list[Path]:
    """Text logs under a folder (recursively: torchrun's per-rank folders too), in natural order."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.rglob("*") if p.is_file() and p.suffix in LOG_SUFFIXES]
    return sorted(found, key=_natural)


@dataclass
class _Followed:
    path: Path
    parser: StreamParser
    offset: int = 0
    carry: bytes = b""  # the partial last line, for the progress scan
    digest: Any = None


@dataclass
class Progress:
    """How far a run is, from its `iteration N/M |` lines."""

    last_step: int | None = None
    planned: int | None = None
    changed_at: float = field(default_factory=time.time)


class LogFollower:
    """Parses a run's logs incrementally as they grow (one streaming parser per file, nothing re-read).

    `update()` reads what was appended since the last call (and picks up new files of a followed
    folder); `finish()` parses the rest and returns the rows of every file merged by step. The
    parsers hold every row (`lag=None`), so the result equals parsing the finished files at once.
    """

    def __init__(
        self,
        sources: Path | list[Path],
        log_format: str = "auto",
        *,
        seq_length: int | None = None,
        num_gpus: int | None = None,
        hashing: bool = False,
    ):
        self.folder = Path(sources) if isinstance(sources, (str, os.PathLike)) else None
        self.fixed = None if self.folder is not None else [Path(p) for p in sources]  # type: ignore[union-attr]
        self.log_format = log_format
        self.seq_length = seq_length
        self.num_gpus = num_gpus
        self.hashing = hashing
        self.files: dict[Path, _Followed] = {}
        self.progress = Progress()
        self._finished: list[Row] | None = None

    def _paths(self) -> list[Path]:
        return log_files(self.folder) if self.folder is not None else list(self.fixed or [])

    def update(self) -> bool:
        """Read what the logs gained; True when a new iteration line was seen."""
        before = self.progress.last_step
        for path in self._paths():
            followed = self.files.get(path)
            if followed is None:
                parser = make_parser(
                    self.log_format,  # type: ignore[arg-type]
                    lag=None,
                    seq_length=self.seq_length,
                    num_gpus=self.num_gpus,
                )
                followed = self.files[path] = _Followed(
                    path, parser, digest=hashlib.sha256() if self.hashing else None
                )
            self._read(followed)
        if self.progress.last_step != before:
            self.progress.changed_at = time.time()
            return True
        return False

    def _read(self, followed: _Followed) -> None:
        try:
            handle = open(followed.path, "rb")  # noqa: SIM115 - closed below
        except OSError:
            return
        with handle:
            handle.seek(followed.offset)
            while chunk := handle.read(_READ):
                followed.offset += len(chunk)
                if followed.digest is not None:
                    followed.digest.update(chunk)
                followed.parser.feed(chunk)
                self._scan_progress(followed, chunk)

    def _scan_progress(self, followed: _Followed, chunk: bytes) -> None:
        data = followed.carry + chunk
        cut = data.rfind(b"\n") + 1
        followed.carry = data[cut:][-4096:]
        last = None
        for m in _PROGRESS.finditer(data, 0, cut):
            last = m
        if last is not None:
            step, total = int(last.group(1)), int(last.group(2))
            p = self.progress
            p.last_step = step if p.last_step is None else max(p.last_step, step)
            p.planned = total if p.planned is None else max(p.planned, total)

    def digests(self) -> dict[str, str]:
        return {str(f.path): f.digest.hexdigest() for f in self.files.values() if f.digest is not None}

    def finish(self, world_size: int | None = None) -> list[Row]:
        """Every file parsed to its end; rows merged by step, tokens/s derived where the inputs are known."""
        if self._finished is not None:
            return self._finished
        self.update()
        row_lists: list[list[Row]] = []
        args: dict[str, str] = {}
        for followed in self.files.values():
            row_lists.append(followed.parser.close())
            args.update(followed.parser.args)
            if followed.carry:
                self._scan_progress(followed, b"\n")
        rows = merge_rows(row_lists)
        seq = self.seq_length or _int(args.get("seq_length"))
        gpus = self.num_gpus or _int(args.get("world_size")) or world_size
        for row in rows:
            derive_tokens(row, seq, gpus)
        self._finished = rows
        return rows


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def write_metrics(run_dir: Path, rows: list[Row]) -> None:
    """metrics.jsonl with one row per step, replaced atomically (a reader sees the old or the new file)."""
    tmp = Path(run_dir) / (METRICS_FILE + ".tmp")
    with tmp.open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row, allow_nan=True) + "\n")
    os.replace(tmp, Path(run_dir) / METRICS_FILE)


def _last_step(rows: list[Row]) -> int | None:
    steps = [r["step"] for r in rows if r.get("step_time_ms") is not None or r.get("loss") is not None]
    return max(steps) if steps else None


def _exit_code(run_dir: Path, launcher_status: dict[str, Any] | None) -> int | None:
    try:
        return json.loads((Path(run_dir) / EXIT_FILE).read_text()).get("exit_code")
    except (OSError, json.JSONDecodeError):
        return (launcher_status or {}).get("exit_code")


def finalize_command_attempt(
    run_dir: Path,
    recipe: dict[str, Any],
    world_size: int | None,
    retry_on: list[str] | tuple[str, ...] = ("infra", "preempted"),
    follower: LogFollower | None = None,
) -> dict[str, Any]:
    """Parse an ended command attempt's logs into metrics.jsonl and derive its status.json.

    completed: the process exited 0 and iterations were logged; completed with class
    hung_after_finish: every planned step was logged but the engine had to cancel the process;
    timeout/cancelled/preempted: as the launcher saw it; else failed with the class of
    reports.failures.classify_failure over every log in logs/.
    """
    from reports.failures import classify_failure

    run_dir = Path(run_dir)
    existing = read_status(run_dir)
    if existing and existing.get("written_by") == WRITTEN_BY:
        launcher_status = existing.get("launcher_status")
    else:
        launcher_status = existing
    if follower is None:
        follower = LogFollower(
            run_dir / "logs",
            recipe.get("log_format") or "auto",
            seq_length=recipe.get("seq_length"),
            num_gpus=recipe.get("num_gpus"),
        )
    rows = follower.finish(world_size)
    write_metrics(run_dir, rows)
    planned = recipe.get("steps") or follower.progress.planned
    last = _last_step(rows)
    exit_code = _exit_code(run_dir, launcher_status)
    launcher_state = (launcher_status or {}).get("state")
    # rank 0's exit code decides unless the scheduler knows better (e.g. Slurm FAILED: another rank crashed);
    # the per-attempt wrapper's own fallback status ("exited 0 without writing status.json") is not news
    trust_exit = launcher_state != "failed" or (launcher_status or {}).get("written_by") == "launcher"
    try:
        hung = json.loads((run_dir / HUNG_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        hung = None
    failure_class: str | None = None
    retryable = False
    if hung is not None:
        state = "completed"
        failure_class = "hung_after_finish"
        reason = (
            f"hung_after_finish: all {last}/{planned} steps logged but the process did not exit within "
            f"{hung.get('grace_s', 0):.0f} s; it was cancelled (its results are kept)"
        )
    elif launcher_state in ("timeout", "cancelled", "preempted"):
        state = launcher_state
        reason = (launcher_status or {}).get("reason")
        failure_class = {"timeout": "timeout", "preempted": "preempted"}.get(launcher_state)
        retryable = failure_class in retry_on
    elif (
        exit_code == 0 and last is not None and launcher_state in (None, "completed", "failed") and trust_exit
    ):
        state, reason = "completed", None
    else:
        state = "failed"
        logs = [run_dir / "logs"] if (run_dir / "logs").is_dir() else []
        result = classify_failure(
            logs,
            exit_codes=[exit_code] if exit_code is not None else None,
            all_steps_logged=(last >= planned) if planned and last is not None else None,
            planned_steps=planned,
            retryable_classes=retry_on,
        )
        failure_class, retryable = result.failure_class, result.retryable
        reason = result.reason
        if not trust_exit:  # the launcher saw a failure rank 0's exit code does not show
            said = (launcher_status or {}).get("reason") or "the launcher reported a failure"
            reason = said if result.failure_class == "unknown" else f"{said}; {reason}"
        elif exit_code == 0:
            reason = f"the command exited 0 but logged no training iteration; {reason}"
        elif exit_code is None and launcher_status is None and last is None:
            program = (recipe.get("argv") or ["?"])[0]
            reason = (
                f"the command left no exit code and no output: did it start at all (is {program!r} installed "
                f"and on PATH where it runs)? {reason}"
            )
    status = {
        "state": state,
        "reason": reason,
        "failure_class": failure_class,
        "retryable": retryable,
        "exit_code": exit_code,
        "steps_completed": last,
        "steps_planned": planned,
        "steps_logged": len(rows),
        "log_files": [str(p) for p in follower.files],
        "written_by": WRITTEN_BY,
        "launcher_status": launcher_status,
    }
    write_json(run_dir / STATUS_FILE, status)
    return status


# ---- mbx ingest -----------------------------------------------------------------------------------------------
@dataclass
class Ingested:
    """What `mbx ingest` did."""

    campaign: str
    cell_id: str
    attempt: int
    run_dir: Path
    state: str
    failure_class: str | None
    reason: str | None
    steps: int
    summary: Any
    verdict: str
    already: bool = False


def _sources(paths: list[Path]) -> list[Path]:
    from orchestrator.errors import ConfigError

    files: list[Path] = []
    problems = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            found = log_files(path)
            if not found:
                problems.append(f"{path}: a folder with no log files (*.log, *.txt, *.out, *.err)")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            problems.append(f"{path}: no such file or folder")
    if problems:
        raise ConfigError(problems)
    unique = list(dict.fromkeys(p.resolve() for p in files))
    if not unique:
        raise ConfigError("no log files given")
    return unique


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def ingest_logs(
    workspace: Path,
    paths: list[Path],
    campaign: str,
    log_format: str = "auto",
    *,
    seq_length: int | None = None,
    num_gpus: int | None = None,
    steps: int | None = None,
    label: str | None = None,
    params: dict[str, Any] | None = None,
    exit_code: int | None = None,
    replace: bool = False,
) -> Ingested:
    """Turn the logs of one past run (one per rank, or one merged) into a run directory and store rows.

    All checks and parsing happen before anything is written; the run dir appears by one rename and
    its store rows in one transaction.
    """
    from orchestrator.campaign import NAME_PATTERN, Campaign
    from orchestrator.errors import ConfigError, UsageError
    from orchestrator.store import CellRow, Store
    from orchestrator.sweep import point_digest
    from orchestrator.yamlio import dump_yaml
    from reports.failures import classify_failure
    from reports.gates import evaluate
    from reports.window import summarize

    if not re.fullmatch(NAME_PATTERN, campaign):
        raise UsageError(
            f"--campaign: {campaign!r} is not a campaign name (letters, digits, . _ -; at most 64)"
        )
    files = _sources(paths)
    follower = LogFollower(files, log_format, seq_length=seq_length, num_gpus=num_gpus, hashing=True)
    rows = follower.finish()
    if not any(r.get("step_time_ms") is not None or r.get("loss") is not None for r in rows):
        names = ", ".join(str(p) for p in files)
        raise ConfigError(
            f"{names}: no Megatron-LM/Megatron-Bridge iteration lines (`iteration N/M | ...`) found; "
            "is this a training log?"
        )
    digests = follower.digests()
    point_id = point_digest({"ingested": sorted(digests.values())})
    cell_id = f"{point_id}-r0"
    label = label or (files[0].stem if len(files) == 1 else f"{files[0].parent.name}/{len(files)} logs")
    params = dict(params or {})

    store = Store(workspace)
    try:
        record = store.campaign(campaign)
        if record is not None and record["launcher"] != "ingest":
            raise UsageError(
                f"campaign {campaign!r} in {store.workspace} was run from a campaign file; ingest into another "
                "name and compare the two with `baseline:`"
            )
        spec = Campaign.model_validate(record["spec"]) if record else None
        if spec is None:
            spec = Campaign.model_validate(
                {
                    "name": campaign,
                    "description": "Megatron logs ingested with `mbx ingest`",
                    "launcher": "ingest",
                }
            )
        existing = {c.cell_id: c for c in store.cells(campaign)}
        previous = store.attempts(campaign, cell_id)
        if cell_id in existing and previous and not replace:
            last = previous[-1]
            result = store.result(campaign, cell_id, last.attempt)
            return Ingested(
                campaign, cell_id, last.attempt, Path(last.run_dir), last.state, last.failure_class,
                last.reason, len(rows), result.summary if result else None,
                (result.verdict if result else None) or "—", already=True,
            )  # fmt: skip
        attempt = (previous[-1].attempt + 1) if previous else 1

        planned = steps or follower.progress.planned
        last_step = _last_step(rows)
        scan = classify_failure(
            files,
            exit_codes=[exit_code] if exit_code is not None else None,
            all_steps_logged=(last_step >= planned) if planned and last_step is not None else None,
            planned_steps=planned,
        )
        found = scan.failure_class != "unknown"
        if (exit_code not in (None, 0)) or found:
            state, failure_class, reason = "failed", scan.failure_class, scan.reason
        else:
            state, failure_class = "completed", None
            reason = None
            if planned and last_step is not None and last_step < planned:
                reason = f"the log ends at step {last_step} of {planned} (no failure message found)"
        summary = summarize(rows, spec.collect.window)
        gate = evaluate(spec.gates, summary, state=state, reason=reason)

        cell_dir = store.workspace / campaign / cell_id
        run_dir = cell_dir / str(attempt)
        cell_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".ingest-{attempt}-", dir=cell_dir))
        try:
            (tmp / "logs").mkdir()
            used: set[str] = set()
            sources = []
            for index, path in enumerate(files):
                name = path.name if path.name not in used else f"{index}-{path.name}"
                used.add(name)
                _link_or_copy(path, tmp / "logs" / name)
                sources.append(
                    {"path": str(path), "sha256": digests.get(str(path)), "bytes": path.stat().st_size}
                )
            recipe = {
                "kind": "ingested",
                "sources": sources,
                "log_format": log_format,
                "seq_length": seq_length,
                "num_gpus": num_gpus,
                "steps": planned,
                "label": label,
                "params": params,
            }
            (tmp / "recipe.yaml").write_text(dump_yaml(recipe))
            write_metrics(tmp, rows)
            status = {
                "state": state,
                "reason": reason,
                "failure_class": failure_class,
                "exit_code": exit_code,
                "steps_completed": last_step,
                "steps_planned": planned,
                "steps_logged": len(rows),
                "written_by": "mbx ingest",
            }
            write_json(tmp / STATUS_FILE, status)
            launch = {"launcher": "ingest", "campaign": campaign, "cell_id": cell_id, "attempt": attempt,
                      "job_id": None, "command": None, "sources": sources, "written_at": time.time()}  # fmt: skip
            write_json(tmp / "launch.json", launch)
            os.rename(tmp, run_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        cells = list(spec.sweep.cells)
        if params and params not in cells:
            cells.append(params)
        spec = spec.model_copy(update={"sweep": spec.sweep.model_copy(update={"cells": cells})})
        cell = CellRow(
            campaign, cell_id, point_id, 0, len(existing), label, params, recipe, {}, {}, True,
        )  # fmt: skip
        try:
            store.record_ingested(
                spec.model_dump(mode="json"), cell, attempt, str(run_dir), state, reason, failure_class,
                summary.to_dict(), gate.to_dict(),
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        return Ingested(
            campaign, cell_id, attempt, run_dir, state, failure_class, reason, len(rows), summary.to_dict(),
            gate.verdict,
        )  # fmt: skip
    finally:
        store.close()
