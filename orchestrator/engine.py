"""Runs a campaign's cells through a launcher: submit, poll, collect, retry nothing twice, survive restarts."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launchers import registry
from launchers.base import JobState, Launcher, LaunchSpec, Resources, Submitted
from orchestrator.campaign import Campaign
from orchestrator.collect import Collected, collect_attempt, summary_from_dict
from orchestrator.errors import RunError, UsageError
from orchestrator.fingerprint import login_fingerprint
from orchestrator.store import ACTIVE_STATES, AttemptRow, CellRow, Store
from orchestrator.yamlio import dump_yaml
from reports.window import Summary

POLL_INTERVAL_S = 0.5


@dataclass
class Event:
    """Something the engine reports to its caller (progress display)."""

    kind: str  # "submitted" | "finished" | "adopted" | "skipped"
    cell: CellRow
    attempt: int
    collected: Collected | None = None


@dataclass
class Outcome:
    """How a campaign run ended."""

    campaign: str
    total: int
    completed: int = 0
    failed: list[tuple[CellRow, str]] = field(default_factory=list)  # (cell, why)
    gate_failures: list[tuple[CellRow, list[str]]] = field(default_factory=list)
    skipped: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed and not self.gate_failures


class CampaignLock:
    """An exclusive flock on <workspace>/<campaign>/.lock; released by the OS even on SIGKILL."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / ".lock"
        self._handle = None

    def __enter__(self) -> CampaignLock:
        self._handle = self.path.open("a+")
        try:
            fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._handle.seek(0)
            holder = self._handle.read().strip() or "another process"
            self._handle.close()
            raise RunError(f"campaign is already being run by {holder}; wait for it or cancel it") from None
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.write(f"mbx pid {os.getpid()}")
        self._handle.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()


def make_launcher(campaign: Campaign, name: str, workspace: Path) -> Launcher:
    """Instantiate backend `name` with the campaign's `launchers.<name>` settings."""
    from pydantic import ValidationError

    from orchestrator.errors import ConfigError
    from orchestrator.loader import validation_problems

    try:
        backend = registry.get(name)
    except KeyError as err:
        raise UsageError(str(err.args[0])) from None
    raw = campaign.launchers.get(name, campaign.launchers.get(name.replace("-", "_"), {}))
    try:
        settings = backend.Settings.model_validate(raw)
    except ValidationError as err:
        raise ConfigError([f"launchers.{name}.{line}" for line in validation_problems(err)]) from None
    return backend(settings, workspace, cluster=campaign)


class Engine:
    """Drives one campaign to completion. Safe to kill at any moment and start again (`resume`)."""

    def __init__(
        self,
        store: Store,
        campaign: Campaign,
        launcher: Launcher,
        on_event: Callable[[Event], None] | None = None,
        baseline: dict[str, Summary] | None = None,
    ):
        self.store = store
        self.campaign = campaign
        self.launcher = launcher
        self.on_event = on_event or (lambda event: None)
        self.baseline = baseline or {}
        self.root = store.workspace / campaign.name

    # paths and specs -----------------------------------------------------------------------------------
    def run_dir(self, cell: CellRow, attempt: int) -> Path:
        return self.root / cell.cell_id / str(attempt)

    def _spec(self, cell: CellRow, attempt: AttemptRow) -> LaunchSpec:
        run_dir = Path(attempt.run_dir)
        resources = Resources(
            nodes=int(cell.resources["nodes"]),
            gpus_per_node=int(cell.resources["gpus_per_node"]),
            time_limit_min=cell.resources.get("time_limit_min"),
        )
        return LaunchSpec(
            campaign=self.campaign.name,
            cell_id=cell.cell_id,
            attempt=attempt.attempt,
            run_dir=run_dir,
            resources=resources,
            module="trainer",
            args=["--recipe", str(run_dir / "recipe.yaml"), "--out", str(run_dir)],
            env=dict(cell.env),
            env_pass=list(self.campaign.env.pass_names),
        )

    def _write_run_dir(self, cell: CellRow, spec: LaunchSpec) -> None:
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        (spec.run_dir / "recipe.yaml").write_text(dump_yaml(cell.recipe))
        self._write_launch_json(spec, None)

    def _write_launch_json(self, spec: LaunchSpec, job: Submitted | None) -> None:
        data: dict[str, Any] = {
            "launcher": self.launcher.name,
            "campaign": spec.campaign,
            "cell_id": spec.cell_id,
            "attempt": spec.attempt,
            "job_id": job.job_id if job else None,
            "command": (job.info.get("argv") if job else None),
            "nodes": spec.resources.nodes,
            "ranks_per_node": spec.resources.gpus_per_node,
            "env_set": sorted(spec.env),
            "env_passed_by_name": sorted(spec.env_pass),
            "fingerprint": login_fingerprint(self.campaign),
            "written_at": time.time(),
        }
        tmp = spec.run_dir / "launch.json.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, spec.run_dir / "launch.json")

    # the loop ------------------------------------------------------------------------------------------
    def run(self, cells: list[CellRow]) -> Outcome:
        with CampaignLock(self.root):
            return self._run(cells)

    def _run(self, cells: list[CellRow]) -> Outcome:
        outcome = Outcome(self.campaign.name, total=len(cells))
        latest = self.store.latest_attempts(self.campaign.name)
        pending: list[CellRow] = []
        in_flight: dict[str, tuple[CellRow, AttemptRow, Submitted]] = {}
        for cell in cells:
            attempt = latest.get(cell.cell_id)
            if attempt is not None and attempt.state == "completed":
                outcome.skipped += 1
                self._count_finished(outcome, cell, attempt)
                self.on_event(Event("skipped", cell, attempt.attempt))
            elif attempt is not None and attempt.state in ACTIVE_STATES and attempt.job_id:
                job = Submitted(cell.cell_id, attempt.attempt, attempt.job_id, attempt.job_info)
                in_flight[attempt.job_id] = (cell, attempt, job)
                self.on_event(Event("adopted", cell, attempt.attempt))
            else:
                if attempt is not None and attempt.state in ACTIVE_STATES:
                    # reserved but never submitted (killed between the two writes): retire it
                    self.store.set_state(
                        self.campaign.name, cell.cell_id, attempt.attempt, "failed", "never submitted"
                    )
                pending.append(cell)

        while pending or in_flight:
            capacity = self.launcher.max_in_flight
            room = len(pending) if capacity is None else max(0, capacity - len(in_flight))
            if room:
                batch, pending = pending[:room], pending[room:]
                for cell, attempt, job in self._submit(batch):
                    in_flight[job.job_id] = (cell, attempt, job)
            if not in_flight:
                continue
            states = self.launcher.poll([job for _, _, job in in_flight.values()])
            for job_id, state in states.items():
                if not state.finished and not self._status_written(in_flight[job_id][1], state):
                    continue
                cell, attempt, job = in_flight.pop(job_id)
                collected = self._collect(cell, attempt, state)
                self._count_finished(
                    outcome, cell, self.store.attempt(cell.campaign, cell.cell_id, attempt.attempt)
                )
                self.on_event(Event("finished", cell, attempt.attempt, collected))
            if in_flight:
                time.sleep(POLL_INTERVAL_S)
        return outcome

    def _status_written(self, attempt: AttemptRow, state: JobState) -> bool:
        """Whether a job the scheduler still lists has already finished by its run dir (status file first)."""
        if state != JobState.UNKNOWN:
            return False
        return (Path(attempt.run_dir) / "status.json").exists()

    def _submit(self, batch: list[CellRow]) -> list[tuple[CellRow, AttemptRow, Submitted]]:
        specs: list[tuple[CellRow, AttemptRow, LaunchSpec]] = []
        for cell in batch:
            attempt = self.store.new_attempt(
                self.campaign.name, cell.cell_id, self.launcher.name, lambda n, c=cell: self.run_dir(c, n)
            )
            spec = self._spec(cell, attempt)
            self._write_run_dir(cell, spec)
            specs.append((cell, attempt, spec))
        submitted = self.launcher.submit([spec for _, _, spec in specs])
        by_cell = {(job.cell_id, job.attempt): job for job in submitted}
        result = []
        for cell, attempt, spec in specs:
            job = by_cell[(cell.cell_id, attempt.attempt)]
            self.store.set_job(self.campaign.name, cell.cell_id, attempt.attempt, job.job_id, job.info)
            self.store.set_state(self.campaign.name, cell.cell_id, attempt.attempt, "running")
            self._write_launch_json(spec, job)
            self.on_event(Event("submitted", cell, attempt.attempt))
            result.append((cell, attempt, job))
        return result

    def _collect(self, cell: CellRow, attempt: AttemptRow, state: JobState) -> Collected:
        baseline = self.baseline.get(cell.point_id)
        collected = collect_attempt(
            Path(attempt.run_dir), self.campaign.gates, self.campaign.collect.window, baseline, state.value
        )
        summary = collected.summary.to_dict() if collected.summary else None
        self.store.put_result(
            self.campaign.name, cell.cell_id, attempt.attempt, summary, collected.gate.to_dict()
        )
        self.store.set_state(
            self.campaign.name,
            cell.cell_id,
            attempt.attempt,
            collected.state,
            collected.reason,
            collected.failure_class,
        )
        return collected

    def _count_finished(self, outcome: Outcome, cell: CellRow, attempt: AttemptRow | None) -> None:
        if attempt is None:
            return
        if attempt.state != "completed":
            outcome.failed.append((cell, f"{attempt.state}: {attempt.reason or 'no reason recorded'}"))
            return
        outcome.completed += 1
        result = self.store.result(self.campaign.name, cell.cell_id, attempt.attempt)
        if result and result.gate and result.gate.get("verdict") == "fail":
            messages = [c["message"] for c in result.gate.get("checks", []) if c.get("ok") is False]
            outcome.gate_failures.append((cell, messages))


def baseline_summaries(store: Store, campaign: Campaign) -> dict[str, Summary]:
    """Window summaries of the baseline campaign's completed cells, by point id (first repeat wins)."""
    if not campaign.baseline:
        return {}
    summaries: dict[str, Summary] = {}
    latest = store.latest_attempts(campaign.baseline)
    for cell in store.cells(campaign.baseline):
        attempt = latest.get(cell.cell_id)
        if attempt is None or attempt.state != "completed" or cell.point_id in summaries:
            continue
        result = store.result(campaign.baseline, cell.cell_id, attempt.attempt)
        summary = summary_from_dict(result.summary) if result else None
        if summary is not None:
            summaries[cell.point_id] = summary
    return summaries
