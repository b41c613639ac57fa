"""Runs a campaign's cells through a launcher: submit, poll, follow logs, collect, bounded retries, survive restarts."""

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
from orchestrator.ingest import HUNG_FILE, LogFollower, finalize_command_attempt, write_json
from orchestrator.requeue import record_requeues
from orchestrator.retry import decide, last_step
from orchestrator.store import ACTIVE_STATES, AttemptRow, CellRow, Store
from orchestrator.yamlio import dump_yaml
from reports.window import Summary

POLL_INTERVAL_S = 0.5
RETRY_KEY = "mbx_retry"  # in an attempt's job info: which try of its cell this is, and the steps the one before made
FOLLOW_INTERVAL_S = 1.0  # how often a running command attempt's logs are read
CANCEL_WAIT_S = 30.0  # after cancelling a hung attempt, collect it even if the launcher still lists it


@dataclass
class Event:
    """Something the engine reports to its caller (progress display)."""

    kind: str  # "submitted" | "finished" | "adopted" | "skipped" | "retrying" | "requeued" | "progress" | "hung"
    cell: CellRow
    attempt: int
    collected: Collected | None = None
    progress: tuple[int | None, int | None] | None = None  # (last step logged, planned steps)
    note: str | None = None  # why a retry happens, or what was done to a hung attempt


@dataclass
class Outcome:
    """How a campaign run ended."""

    campaign: str
    total: int
    completed: int = 0
    failed: list[tuple[CellRow, str]] = field(default_factory=list)  # (cell, why)
    gate_failures: list[tuple[CellRow, list[str]]] = field(default_factory=list)
    skipped: int = 0
    # completed, but with a note (e.g. hung after its last step: results kept, process cancelled)
    warnings: list[tuple[CellRow, str]] = field(default_factory=list)

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
    try:
        return backend(settings, workspace, cluster=campaign)
    except (ValueError, RuntimeError) as err:  # e.g. a newline in cluster.partition, NeMo-Run not installed
        raise ConfigError([f"launchers.{name}: {err}"]) from None


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
        self._followers: dict[tuple[str, int], LogFollower] = {}
        self._followed_at: dict[tuple[str, int], float] = {}
        self._done_since: dict[tuple[str, int], float] = {}
        self._cancelled_at: dict[tuple[str, int], float] = {}
        self._tries: dict[str, int] = {}  # attempts of each cell made by this run
        self._requeues_seen: dict[str, int] = {}  # job id → requeue archives already recorded
        self._steps: dict[str, int | None] = {}  # last step of each cell's previous attempt in this run

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
        if _is_command(cell):
            from orchestrator.command import attempt_argv

            return LaunchSpec(
                campaign=self.campaign.name,
                cell_id=cell.cell_id,
                attempt=attempt.attempt,
                run_dir=run_dir,
                resources=resources,
                module=None,  # the argv runs as given, as a list: no shell ever sees a value
                args=attempt_argv(cell.recipe["argv"], run_dir, cell.cell_id, attempt.attempt),
                env=dict(cell.env),
                env_pass=list(self.campaign.env.pass_names),
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
        recipe = (
            {**cell.recipe, "argv": spec.args, "env": dict(cell.env)} if _is_command(cell) else cell.recipe
        )
        (spec.run_dir / "recipe.yaml").write_text(dump_yaml(recipe))
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

    def dry_run(self, cells: list[CellRow]) -> Outcome:
        """Render and show what would be submitted for the cells not yet completed; record nothing.

        The run dirs and scripts are written where the next real run will put them (same attempt numbers),
        so the dry-run script is byte-identical to what a real submit then sends.
        """
        latest = self.store.latest_attempts(self.campaign.name)
        outcome = Outcome(self.campaign.name, total=len(cells))
        specs: list[LaunchSpec] = []
        for cell in cells:
            attempt = latest.get(cell.cell_id)
            if attempt is not None and attempt.state == "completed":
                outcome.skipped += 1
                continue
            number = (attempt.attempt if attempt else 0) + 1
            row = AttemptRow(self.campaign.name, cell.cell_id, number, self.launcher.name, None, {},
                             str(self.run_dir(cell, number)), "submitted", None, None, None, None)  # fmt: skip
            spec = self._spec(cell, row)
            self._write_run_dir(cell, spec)
            specs.append(spec)
        for rendered in self.launcher.render(specs) if specs else []:
            self.launcher.show(rendered)  # type: ignore[attr-defined]
        return outcome

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
                # the retry budget goes on where the killed orchestrator left it (recorded at submission)
                budget = attempt.job_info.get(RETRY_KEY, {})
                self._tries[cell.cell_id] = int(budget.get("try", 1))
                self._steps[cell.cell_id] = budget.get("steps_before")
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
            for cell, old, new in record_requeues(self.store, self.campaign.name, in_flight, self._requeues_seen):
                self.on_event(Event("requeued", cell, new.attempt, note=f"attempt {old.attempt} was requeued"))
            states = self.launcher.poll([job for _, _, job in in_flight.values()])
            for job_id, state in states.items():
                cell, attempt, job = in_flight[job_id]
                if not state.finished and not self._status_written(attempt, state):
                    if not self._watch(cell, attempt, job):
                        continue
                in_flight.pop(job_id)
                collected = self._collect(cell, attempt, state)
                if self._retry(cell, attempt, collected):
                    pending.append(cell)
                    continue
                record = self.store.attempt(cell.campaign, cell.cell_id, attempt.attempt)
                self._count_finished(outcome, cell, record)
                self.on_event(Event("finished", cell, attempt.attempt, collected))
            if in_flight:
                time.sleep(POLL_INTERVAL_S)
        return outcome

    # command trainers: follow logs, hang detection, retries --------------------------------------------
    def _watch(self, cell: CellRow, attempt: AttemptRow, job: Submitted) -> bool:
        """Follow a running command attempt's logs; cancel it when every planned step is logged but it
        does not exit within collect.exit_grace_s. True when it should be collected now anyway."""
        if not _is_command(cell):
            return False
        key = (cell.cell_id, attempt.attempt)
        now = time.time()
        if key in self._cancelled_at:
            return now - self._cancelled_at[key] > CANCEL_WAIT_S  # cancelled, but the launcher still lists it
        follower = self._follower(cell, attempt)
        if now - self._followed_at.get(key, 0.0) >= FOLLOW_INTERVAL_S:
            self._followed_at[key] = now
            if follower.update():
                progress = (
                    follower.progress.last_step,
                    cell.recipe.get("steps") or follower.progress.planned,
                )
                self.on_event(Event("progress", cell, attempt.attempt, progress=progress))
        grace = self.campaign.collect.exit_grace_s
        planned = cell.recipe.get("steps") or follower.progress.planned
        last = follower.progress.last_step
        if grace is None or not planned or last is None or last < planned:
            return False
        since = self._done_since.setdefault(key, now)
        if now - since < grace:
            return False
        write_json(
            Path(attempt.run_dir) / HUNG_FILE,
            {
                "last_step": last,
                "planned": planned,
                "grace_s": grace,
                "all_logged_at": since,
                "cancelled_at": now,
            },
        )
        self._cancelled_at[key] = now
        self.launcher.cancel([job])
        self.on_event(
            Event(
                "hung",
                cell,
                attempt.attempt,
                note=f"all {last}/{planned} steps logged, no exit in {grace:.0f} s",
            )
        )
        return False

    def _follower(self, cell: CellRow, attempt: AttemptRow) -> LogFollower:
        key = (cell.cell_id, attempt.attempt)
        if key not in self._followers:
            recipe = cell.recipe
            self._followers[key] = LogFollower(
                Path(attempt.run_dir) / "logs",
                recipe.get("log_format") or "auto",
                seq_length=recipe.get("seq_length"),
                num_gpus=recipe.get("num_gpus"),
            )
        return self._followers[key]

    def _retry(self, cell: CellRow, attempt: AttemptRow, collected: Collected) -> bool:
        """Whether the cell gets another attempt; a stop for a retryable class is noted in the reason."""
        tries = self._tries.get(cell.cell_id, 1)
        steps = last_step(Path(attempt.run_dir))
        before = self._steps.get(cell.cell_id)
        decision = decide(self.campaign.retry, collected.state, collected.failure_class, tries, steps, before)
        if not decision.retry:
            if decision.why:
                reason = f"{collected.reason or collected.state}; {decision.why}"
                collected.reason = reason
                self.store.set_state(
                    self.campaign.name, cell.cell_id, attempt.attempt, collected.state, reason,
                    collected.failure_class,
                )  # fmt: skip
            return False
        self._tries[cell.cell_id] = tries + 1
        self._steps[cell.cell_id] = steps or 0
        self.on_event(Event("retrying", cell, attempt.attempt, collected, note=decision.why))
        return True

    def _status_written(self, attempt: AttemptRow, state: JobState) -> bool:
        """Whether a job the scheduler still lists has already finished by its run dir (status file first)."""
        if state != JobState.UNKNOWN:
            return False
        return (Path(attempt.run_dir) / "status.json").exists()

    def _submit(self, batch: list[CellRow]) -> list[tuple[CellRow, AttemptRow, Submitted]]:
        specs: list[tuple[CellRow, AttemptRow, LaunchSpec]] = []
        for cell in batch:
            self._tries.setdefault(cell.cell_id, 1)
            attempt = self.store.new_attempt(
                self.campaign.name, cell.cell_id, self.launcher.name, lambda n, c=cell: self.run_dir(c, n)
            )
            spec = self._spec(cell, attempt)
            self._write_run_dir(cell, spec)
            specs.append((cell, attempt, spec))
        try:
            submitted = self.launcher.submit([spec for _, _, spec in specs])
        except Exception as err:  # a refused sbatch: fail these attempts rather than leave them "submitted"
            for cell, attempt, _ in specs:
                self.store.set_state(
                    self.campaign.name, cell.cell_id, attempt.attempt, "failed", f"submission failed: {err}"
                )
            raise RunError(f"{self.launcher.name}: submission failed: {err}") from None
        by_cell = {(job.cell_id, job.attempt): job for job in submitted}
        result = []
        for cell, attempt, spec in specs:
            job = by_cell[(cell.cell_id, attempt.attempt)]
            retry = {"try": self._tries.get(cell.cell_id, 1), "steps_before": self._steps.get(cell.cell_id)}
            self.store.set_job(self.campaign.name, cell.cell_id, attempt.attempt, job.job_id,
                               {**job.info, RETRY_KEY: retry})
            self.store.set_state(self.campaign.name, cell.cell_id, attempt.attempt, "running")
            self._write_launch_json(spec, job)
            self.on_event(Event("submitted", cell, attempt.attempt))
            result.append((cell, attempt, job))
        return result

    def _collect(self, cell: CellRow, attempt: AttemptRow, state: JobState) -> Collected:
        baseline = baseline_for(self.baseline, cell)
        if _is_command(cell):
            self._finalize_command(cell, attempt)
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

    def _finalize_command(self, cell: CellRow, attempt: AttemptRow) -> None:
        """A command attempt's logs → metrics.jsonl and status.json (a collection problem never stops the run)."""
        key = (cell.cell_id, attempt.attempt)
        run_dir = Path(attempt.run_dir)
        world = int(cell.resources.get("nodes", 1)) * int(cell.resources.get("gpus_per_node", 1))
        try:
            finalize_command_attempt(
                run_dir, cell.recipe, world, self.campaign.retry.on, self._followers.pop(key, None)
            )
        except Exception as err:  # noqa: BLE001 - recorded in the run dir instead
            run_dir.mkdir(parents=True, exist_ok=True)
            write_json(
                run_dir / "status.json",
                {"state": "failed", "reason": f"mbx could not collect the logs: {err!r}", "failure_class": "unknown",
                 "written_by": "mbx collect (command trainer)"},
            )  # fmt: skip

    def _count_finished(self, outcome: Outcome, cell: CellRow, attempt: AttemptRow | None) -> None:
        if attempt is None:
            return
        if attempt.state != "completed":
            outcome.failed.append((cell, f"{attempt.state}: {attempt.reason or 'no reason recorded'}"))
            return
        outcome.completed += 1
        if attempt.failure_class:  # completed with a class: hung after its last step (results kept)
            outcome.warnings.append((cell, attempt.reason or attempt.failure_class))
        result = self.store.result(self.campaign.name, cell.cell_id, attempt.attempt)
        if result and result.gate and result.gate.get("verdict") == "fail":
            messages = [c["message"] for c in result.gate.get("checks", []) if c.get("ok") is False]
            outcome.gate_failures.append((cell, messages))


def _is_command(cell: CellRow) -> bool:
    return cell.recipe.get("kind") == "command"


SOLE_BASELINE = "*"  # key of the baseline summary that serves every cell (a baseline with a single point)


def params_key(params: dict[str, Any]) -> str:
    return "params:" + json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


def baseline_for(baselines: dict[str, Summary], cell: CellRow) -> Summary | None:
    """A cell's baseline: the same point, else the baseline cell with equal swept values, else the
    baseline campaign's only point (e.g. one ingested past run)."""
    return (
        baselines.get(cell.point_id)
        or (baselines.get(params_key(cell.params)) if cell.params else None)
        or baselines.get(SOLE_BASELINE)
    )


def baseline_summaries(store: Store, campaign: Campaign) -> dict[str, Summary]:
    """Window summaries of the baseline campaign's completed cells by point id (first repeat wins),
    by swept values (`params:...`), and under `*` when the baseline has a single point."""
    if not campaign.baseline:
        return {}
    summaries: dict[str, Summary] = {}
    latest = store.latest_attempts(campaign.baseline)
    points: set[str] = set()
    for cell in store.cells(campaign.baseline):
        points.add(cell.point_id)
        attempt = latest.get(cell.cell_id)
        if attempt is None or attempt.state != "completed" or cell.point_id in summaries:
            continue
        result = store.result(campaign.baseline, cell.cell_id, attempt.attempt)
        summary = summary_from_dict(result.summary) if result else None
        if summary is not None:
            summaries[cell.point_id] = summary
            if cell.params:
                summaries.setdefault(params_key(cell.params), summary)
    if len(points) == 1 and summaries:
        summaries[SOLE_BASELINE] = next(iter(summaries.values()))
    return summaries
