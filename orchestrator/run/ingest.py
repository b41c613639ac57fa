"""`mbx ingest`: the logs of a past Megatron run into a run directory and store rows — a pure plan, then one commit.

The plan parses the logs, classifies the run, summarizes and gates it and decides its names (campaign, cell,
attempt) without writing anything; the commit makes the run dir appear by one rename and writes its store rows
in one transaction (the run dir is removed again if that fails).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError, UsageError
from orchestrator.owned_dirs import mark_owned, remove_owned_dir
from orchestrator.rows import INGESTED
from orchestrator.run.ingest_checks import check_rows, truncated
from orchestrator.run.lock import CampaignLock
from orchestrator.run.store import INGEST_LAUNCHER, CellRow, Store, check_workspace, next_attempt_number
from orchestrator.spec.campaign import NAME_PATTERN, Campaign
from orchestrator.spec.sweep import point_digest
from reports.gates import GateResult, evaluate
from reports.parsers.follow import LogFollower, log_files, logged_last_step
from reports.parsers.rows import Row
from reports.window import Summary, summarize
from trainer import rundir


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


@dataclass(frozen=True)
class Parsed:
    """The logs of one past run, parsed."""

    files: list[Path]
    rows: list[Row]
    digests: dict[str, str]  # file → sha256 of its bytes
    planned: int | None  # the planned iterations (given, else the log's `iteration N/M`)
    impossible: str | None = None  # impossible values taken out of the rows (orchestrator/run/ingest_checks.py)

    @property
    def point_id(self) -> str:
        return point_digest({"ingested": sorted(self.digests.values())})


@dataclass(frozen=True)
class IngestPlan:
    """Everything the commit writes, decided before anything is written."""

    spec: Campaign  # the ingest campaign, with this run's params among its cells
    cell: CellRow
    attempt: int
    run_dir: Path
    files: list[Path]
    status: dict[str, Any]
    launch: dict[str, Any]
    rows: list[Row] = field(repr=False)
    summary: Summary
    gate: GateResult


# ---- the plan ------------------------------------------------------------------------------------------------
def check_name(campaign: str) -> None:
    if not re.fullmatch(NAME_PATTERN, campaign):
        raise UsageError(
            f"--campaign: {campaign!r} is not a campaign name (letters, digits, . _ -; at most 64)"
        )


def sources(paths: list[Path]) -> list[Path]:
    """The log files named (folders: every log under them), each once; ConfigError for a missing one."""
    files: list[Path] = []
    problems = []
    for path in map(Path, paths):
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


def parse(
    files: list[Path], log_format: str, seq_length: int | None, num_gpus: int | None, steps: int | None
) -> Parsed:
    """Every file parsed and hashed; ConfigError when no training iteration is found."""
    follower = LogFollower(files, log_format, seq_length=seq_length, num_gpus=num_gpus, hashing=True)
    rows = follower.finish()
    if logged_last_step(rows) is None:
        names = ", ".join(str(p) for p in files)
        raise ConfigError(
            f"{names}: no Megatron-LM/Megatron-Bridge iteration lines (`iteration N/M | ...`) found; "
            "is this a training log?"
        )
    checked = check_rows(rows)
    return Parsed(files, checked.rows, follower.digests(), steps or follower.progress.planned, checked.reason())


def judge(parsed: Parsed, exit_code: int | None) -> tuple[str, str | None, str | None]:
    """(state, failure class, reason): failed on a non-zero exit code, a failure the logs show, a log that stops
    before its planned iterations, or impossible values in it; a run is completed only without any of these."""
    state, failure_class, reason = _judge_logs(parsed, exit_code)
    if parsed.impossible:
        reason = "; ".join(r for r in (reason, parsed.impossible) if r)
        return "failed", failure_class or "unknown", reason
    return state, failure_class, reason


def _judge_logs(parsed: Parsed, exit_code: int | None) -> tuple[str, str | None, str | None]:
    from reports.failures import classify_failure

    planned, last = parsed.planned, logged_last_step(parsed.rows)
    scan = classify_failure(
        parsed.files,
        exit_codes=[exit_code] if exit_code is not None else None,
        all_steps_logged=(last >= planned) if planned and last is not None else None,
        planned_steps=planned,
    )
    if exit_code not in (None, 0) or scan.failure_class != "unknown":
        return "failed", scan.failure_class, scan.reason
    cut = truncated(last, planned)
    if cut:
        return "failed", "unknown", f"{cut} (no failure message found; --steps {last} ingests it as a run of {last})"
    return "completed", None, None


def ingest_campaign(store: Store, name: str) -> Campaign:
    """The campaign an ingested run joins (created if new); UsageError for a campaign run from a file."""
    record = store.campaign(name)
    if record is None:
        return Campaign.model_validate(
            {
                "name": name,
                "description": "Megatron logs ingested with `mbx ingest`",
                "launcher": INGEST_LAUNCHER,
            }
        )
    if record["launcher"] != INGEST_LAUNCHER:
        raise UsageError(
            f"campaign {name!r} in {store.workspace} was run from a campaign file; ingest into another "
            "name and compare the two with `baseline:`"
        )
    return Campaign.model_validate(record["spec"])


def already_ingested(store: Store, name: str, cell_id: str, steps: int) -> Ingested | None:
    """What an earlier ingest of the same logs made (None: they are new)."""
    if not any(c.cell_id == cell_id for c in store.cells(name)):
        return None
    previous = store.attempts(name, cell_id)
    if not previous:
        return None
    last = previous[-1]
    result = store.result(name, cell_id, last.attempt)
    return Ingested(
        name, cell_id, last.attempt, Path(last.run_dir), last.state, last.failure_class, last.reason, steps,
        result.summary if result else None, (result.verdict if result else None) or "—", already=True,
    )  # fmt: skip


def plan_ingest(
    store: Store, spec: Campaign, parsed: Parsed, log_format: str, *, seq_length: int | None,
    num_gpus: int | None, label: str | None, params: dict[str, Any], exit_code: int | None,
) -> IngestPlan:  # fmt: skip
    """Everything about one ingested run, decided from the logs and the store (nothing written)."""
    name = spec.name
    cell_id = f"{parsed.point_id}-r0"
    cell_dir = store.workspace / name / cell_id
    attempt = next_attempt_number(store.highest_attempt(name, cell_id), cell_dir)
    files = parsed.files
    label = label or (files[0].stem if len(files) == 1 else f"{files[0].parent.name}/{len(files)} logs")
    state, failure_class, reason = judge(parsed, exit_code)
    summary = summarize(parsed.rows, spec.collect.window)
    gate = evaluate(spec.gates, summary, state=state, reason=reason)
    sources = [
        {"path": str(p), "sha256": parsed.digests.get(str(p)), "bytes": p.stat().st_size} for p in files
    ]
    recipe = {"sources": sources, "log_format": log_format, "seq_length": seq_length, "num_gpus": num_gpus,
              "steps": parsed.planned, "label": label, "params": params}  # fmt: skip
    ordinal = len(store.cells(name))
    cell = CellRow(campaign=name, cell_id=cell_id, point_id=parsed.point_id, repeat=0, ordinal=ordinal,
                   label=label, params=params, recipe=recipe, resources={}, env={}, trainer_kind=INGESTED)  # fmt: skip
    cells = list(spec.sweep.cells)
    if params and params not in cells:
        cells.append(params)
    spec = spec.model_copy(update={"sweep": spec.sweep.model_copy(update={"cells": cells})})
    status = {"state": state, "reason": reason, "failure_class": failure_class, "exit_code": exit_code,
              "steps_completed": logged_last_step(parsed.rows), "steps_planned": parsed.planned,
              "steps_logged": len(parsed.rows)}  # fmt: skip
    launch = rundir.launch_record(launcher=INGEST_LAUNCHER, campaign=name, cell_id=cell_id, attempt=attempt,
                                  job_id=None, command=None, sources=sources)  # fmt: skip
    return IngestPlan(
        spec, cell, attempt, cell_dir / str(attempt), files, status, launch, parsed.rows, summary, gate
    )


# ---- the commit ----------------------------------------------------------------------------------------------
def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def write_run_dir(plan: IngestPlan) -> None:
    """The run dir, written in a temporary folder next to it and renamed into place."""
    plan.run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".ingest-{plan.attempt}-", dir=plan.run_dir.parent))
    try:
        mark_owned(tmp)  # the run dir keeps the marker: only a directory mbx made here is ever removed
        (tmp / rundir.LOGS).mkdir()
        used: set[str] = set()
        for index, path in enumerate(plan.files):
            name = path.name if path.name not in used else f"{index}-{path.name}"
            used.add(name)
            _link_or_copy(path, tmp / rundir.LOGS / name)
        rundir.write_recipe(tmp, plan.cell.recipe)
        rundir.write_metrics(tmp, plan.rows)
        rundir.write_status(tmp, plan.status, rundir.INGEST)
        rundir.write_launch(tmp, plan.launch)
        os.rename(tmp, plan.run_dir)
    except BaseException:
        with suppress(OSError):
            remove_owned_dir(tmp, root=plan.run_dir.parent)
        raise


def commit(store: Store, plan: IngestPlan) -> Ingested:
    """The run dir by one rename, then its store rows in one transaction (the run dir goes if that fails)."""
    write_run_dir(plan)
    try:
        store.record_ingested(
            plan.spec.model_dump(mode="json"), plan.cell, plan.attempt, str(plan.run_dir), plan.status["state"],
            plan.status["reason"], plan.status["failure_class"], plan.summary.to_dict(), plan.gate.to_dict(),
        )  # fmt: skip
    except BaseException:
        with suppress(OSError):
            remove_owned_dir(plan.run_dir, root=plan.run_dir.parent)
        raise
    return Ingested(
        plan.cell.campaign, plan.cell.cell_id, plan.attempt, plan.run_dir, plan.status["state"],
        plan.status["failure_class"], plan.status["reason"], len(plan.rows), plan.summary.to_dict(),
        plan.gate.verdict,
    )  # fmt: skip


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

    All checks and parsing happen before anything is written (bad input writes nothing, not even the store).
    """
    check_name(campaign)
    parsed = parse(sources(paths), log_format, seq_length, num_gpus, steps)
    workspace = check_workspace(workspace)
    with CampaignLock(workspace / campaign), Store(workspace) as store:  # not during a store rebuild
        spec = ingest_campaign(store, campaign)
        if not replace:
            already = already_ingested(store, campaign, f"{parsed.point_id}-r0", len(parsed.rows))
            if already is not None:
                return already
        plan = plan_ingest(
            store, spec, parsed, log_format, seq_length=seq_length, num_gpus=num_gpus, label=label,
            params=dict(params or {}), exit_code=exit_code,
        )  # fmt: skip
        return commit(store, plan)
