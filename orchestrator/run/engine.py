"""Drives a campaign's cells through a launcher: plan, submit, poll, follow, collect, bounded retries, resume."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launchers.base import GpuNeed, JobState, Launcher, LaunchSpec, Rendered, Submitted
from launchers.command import jit_cache_plan
from orchestrator import trainers
from orchestrator.errors import RunError
from orchestrator.run.baseline import baseline_for
from orchestrator.run.collect import Collected, collect_attempt
from orchestrator.run.disk import DiskFull
from orchestrator.run.feasibility import limits_of, on_card
from orchestrator.run.fingerprint import login_fingerprint
from orchestrator.run.inflight import InFlight, Pending
from orchestrator.run.requeue import record_requeues
from orchestrator.run.retry import decide
from orchestrator.run.store import ACTIVE_STATES, AttemptRow, CellRow, Store, next_attempt_number
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.software import record as software_record
from reports.gates import evaluate
from reports.window import Summary
from trainer import rundir

POLL_INTERVAL_S = 0.5
FOLLOW_INTERVAL_S = 1.0  # how often a running attempt's logs are read (kinds that have something to follow)
CANCEL_WAIT_S = 30.0  # after cancelling a hung attempt, collect it even if the launcher still lists it


@dataclass
class Event:
    """Something the engine reports to its caller (progress display)."""

    # "submitted" | "finished" | "adopted" | "skipped" | "retrying" | "requeued" | "progress" | "hung" | "infeasible"
    kind: str
    cell: CellRow
    attempt: int
    collected: Collected | None = None
    progress: tuple[int | None, int | None] | None = None  # (last step logged, planned steps)
    note: str | None = None  # why a retry happens, what was done to a hung attempt, why a point is infeasible


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
    retryable: list[str] = field(default_factory=list)  # classes of failed cells a resume runs again (retry.on)
    # cells the GPU check refused on their node (the allocation's GPU too small for the point): not run, not
    # failed, not in `total` (as a point infeasible at plan time), each with the reason
    infeasible: list[tuple[CellRow, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.gate_failures


def adoptable(attempt: AttemptRow) -> bool:
    """An attempt a run adopts instead of submitting its cell again: submitted to a launcher and not ended."""
    return attempt.state in ACTIVE_STATES and bool(attempt.job_id)


class Engine:
    """Drives one campaign to completion. Safe to kill at any moment and start again (`resume`)."""

    def __init__(
        self,
        campaign: Campaign,
        launcher: Launcher,
        workspace: Path,
        store: Store | None = None,
        on_event: Callable[[Event], None] | None = None,
        baseline: dict[str, Summary] | None = None,
        max_in_flight: int | None = None,
        gpu_needs: dict[str, GpuNeed] | None = None,
    ):
        """`store` None: an engine that can only plan and render (a dry run). `max_in_flight` caps the
        attempts out at once below the launcher's own limit (the CLI's --parallel). `gpu_needs`: point id →
        what its GPU must hold (orchestrator/run/feasibility.py's gpu_needs), checked on the node before the
        point's command starts."""
        self.campaign = campaign
        self.launcher = launcher
        self.root = Path(workspace) / campaign.name
        self._store = store
        self.on_event = on_event or (lambda event: None)
        self.baseline = baseline or {}
        limits = [n for n in (launcher.max_in_flight, max_in_flight) if n is not None]
        self.max_in_flight = min(limits) if limits else None
        self.gpu_needs = gpu_needs or {}

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("this engine only plans (a dry run): it has no store")
        return self._store

    def run_dir(self, cell: CellRow, attempt: int) -> Path:
        return self.root / cell.cell_id / str(attempt)

    # the plan: what a run submits, as launch specs -------------------------------------------------------
    def spec(self, cell: CellRow, attempt: AttemptRow) -> LaunchSpec:
        """What the launcher runs for this attempt: the trainer kind's spec, with what its GPU must hold."""
        spec = trainers.get(cell.trainer_kind).launch_spec(self.campaign, cell, attempt)
        spec.gpu_need = self.gpu_needs.get(cell.point_id)
        return spec

    def plan(self, cells: list[CellRow], latest: dict[str, AttemptRow]) -> list[LaunchSpec]:
        """Launch specs of the cells not yet completed nor running, numbered as a real run would number them.

        Pure: nothing is reserved or written. A dry run renders these; a real run reserves the same numbers
        (both through store.next_attempt_number; `latest` holds each cell's highest stored attempt).
        """
        specs = []
        for cell in cells:
            last = latest.get(cell.cell_id)
            if last is not None and (last.state == "completed" or adoptable(last)):
                continue  # skipped, or adopted by `_start`: nothing is submitted for it
            number = next_attempt_number(last.attempt if last else 0, self.root / cell.cell_id)
            row = AttemptRow(campaign=self.campaign.name, cell_id=cell.cell_id, attempt=number,
                             launcher=self.launcher.name, job_id=None, job_info={},
                             run_dir=str(self.run_dir(cell, number)), state="submitted", reason=None,
                             failure_class=None, submitted_at=None, ended_at=None, try_number=1,
                             steps_before=None)  # fmt: skip
            specs.append(self.spec(cell, row))
        return specs

    def render(self, cells: list[CellRow], latest: dict[str, AttemptRow]) -> list[Rendered]:
        """What the launcher would submit for these cells now (a dry run): the plan, rendered; nothing written."""
        specs = self.plan(cells, latest)
        return self.launcher.render(specs) if specs else []

    # the loop --------------------------------------------------------------------------------------------
    def run(self, cells: list[CellRow]) -> Outcome:
        """Drive the cells to completion; a store that cannot be written (a full disk) stops the run with a
        message, leaving every attempt as last recorded for `mbx campaign resume`."""
        try:
            return self._run(cells)
        except (sqlite3.OperationalError, DiskFull) as err:
            if not isinstance(err, DiskFull) and "full" not in str(err):
                raise
            raise RunError(
                f"the run store {self.store.path} could not be written: {err} (ENOSPC: no space left on device); "
                f"attempts already started keep running: free space, then `mbx campaign resume {self.campaign.name}`"
            ) from None

    def _run(self, cells: list[CellRow]) -> Outcome:
        outcome = Outcome(self.campaign.name, total=len(cells))
        pending, in_flight = self._start(cells, outcome)
        while pending or in_flight:
            capacity = self.max_in_flight
            room = len(pending) if capacity is None else max(0, capacity - len(in_flight))
            if room:
                batch, pending = pending[:room], pending[room:]
                in_flight.update(self._submit(batch, outcome))
            if not in_flight:
                continue
            for cell, old, new in record_requeues(self.store, self.campaign.name, in_flight):
                self.on_event(Event("requeued", cell, new.attempt, note=f"attempt {old.attempt} was requeued"))
            states = self.launcher.poll([flight.job for flight in in_flight.values()])
            for job_id, state in states.items():
                flight = in_flight[job_id]
                if not state.finished and not self._ended_by_files(flight, state) and not self._watch(flight):
                    continue
                del in_flight[job_id]
                self._finish(flight, state, pending, outcome)
            if in_flight:
                time.sleep(POLL_INTERVAL_S)
        return outcome

    def _start(self, cells: list[CellRow], outcome: Outcome) -> tuple[list[Pending], dict[str, InFlight]]:
        """Skip completed cells, adopt attempts still running (their retry budget with them), queue the rest."""
        latest = self.store.latest_attempts(self.campaign.name)
        pending: list[Pending] = []
        in_flight: dict[str, InFlight] = {}
        for cell in cells:
            attempt = latest.get(cell.cell_id)
            if attempt is not None and attempt.state == "completed":
                outcome.skipped += 1
                self._count_finished(outcome, cell, attempt)
                self.on_event(Event("skipped", cell, attempt.attempt))
            elif attempt is not None and adoptable(attempt):
                in_flight[attempt.job_id] = self._adopt(cell, attempt)
                self.on_event(Event("adopted", cell, attempt.attempt))
            elif attempt is not None and attempt.state in ACTIVE_STATES:
                # reserved but never submitted (killed between the two writes): retire it, keep its budget
                self.store.set_state(self.campaign.name, cell.cell_id, attempt.attempt, "failed", "never submitted")
                pending.append(Pending(cell, attempt.try_number, attempt.steps_before))
            else:
                pending.append(Pending(cell))
        return pending, in_flight

    def _adopt(self, cell: CellRow, attempt: AttemptRow) -> InFlight:
        kind = trainers.get(cell.trainer_kind)
        job = Submitted(cell.cell_id, attempt.attempt, attempt.job_id or "", attempt.job_info)
        return InFlight(cell, attempt, job, kind, kind.follower(cell, Path(attempt.run_dir)), adopted=True)

    # submission -----------------------------------------------------------------------------------------
    def _submit(self, batch: list[Pending], outcome: Outcome) -> dict[str, InFlight]:
        """Reserve an attempt per cell, write its inputs, submit them together, record the jobs."""
        prepared = [ready for item in batch if (ready := self._prepare(item, outcome)) is not None]
        if not prepared:
            return {}
        try:
            submitted = self.launcher.submit([spec for _, _, spec in prepared])
        except Exception as err:  # a refused sbatch: fail these attempts rather than leave them "submitted"
            for item, attempt, _ in prepared:
                self.store.set_state(self.campaign.name, item.cell.cell_id, attempt.attempt, "failed",
                                     f"submission failed: {err}")  # fmt: skip
            raise RunError(f"{self.launcher.name}: submission failed: {err}") from None
        jobs = {(job.cell_id, job.attempt): job for job in submitted}
        started: dict[str, InFlight] = {}
        for item, attempt, spec in prepared:
            job = jobs[(item.cell.cell_id, attempt.attempt)]
            self.store.mark_submitted(self.campaign.name, item.cell.cell_id, attempt.attempt, job.job_id, job.info)
            self._write_launch(spec, attempt, job.job_id, job.info)
            kind = trainers.get(item.cell.trainer_kind)
            started[job.job_id] = InFlight(item.cell, attempt, job, kind, kind.follower(item.cell, spec.run_dir))
            self.on_event(Event("submitted", item.cell, attempt.attempt))
        return started

    def _prepare(self, item: Pending, outcome: Outcome) -> tuple[Pending, AttemptRow, LaunchSpec] | None:
        """Reserve the cell's next attempt and write its inputs. A file-system error here (the cell's run-dir
        path is a file, a full disk, no permission) fails this attempt with the reason; the run goes on."""
        cell = item.cell
        attempt: AttemptRow | None = None
        try:
            attempt = self.store.reserve_attempt(
                self.campaign.name, cell.cell_id, self.launcher.name, lambda n, c=cell: self.run_dir(c, n),
                item.try_number, item.steps_before,
            )  # fmt: skip
            spec = self.spec(cell, attempt)
            trainers.get(cell.trainer_kind).write_inputs(cell, spec)
            self._write_launch(spec, attempt, None)
        except OSError as err:
            reason = (f"mbx could not prepare the run directory: {rundir.one_line(err)}; fix that, then "
                      f"`mbx campaign resume {self.campaign.name}` runs this cell again")  # fmt: skip
            attempt = attempt or self._unsubmitted(cell)
            collected = self._failed(reason)
            if attempt is None:  # the store could not even reserve it: nothing to record there
                outcome.failed.append((cell, f"failed: {reason}"))
            else:
                self._record(cell, attempt, collected)
                self._count_finished(outcome, cell, self.store.attempt(self.campaign.name, cell.cell_id,
                                                                       attempt.attempt))  # fmt: skip
            self.on_event(Event("finished", cell, attempt.attempt if attempt else 0, collected))
            return None
        return item, attempt, spec

    def _unsubmitted(self, cell: CellRow) -> AttemptRow | None:
        """The cell's newest attempt when it is reserved but has no job (what a failed reservation left)."""
        latest = self.store.latest_attempts(self.campaign.name).get(cell.cell_id)
        return latest if latest is not None and latest.state in ACTIVE_STATES and not latest.job_id else None

    def _write_launch(
        self, spec: LaunchSpec, attempt: AttemptRow, job_id: str | None, job_info: dict[str, Any] | None = None
    ) -> None:
        """launch.json: the attempt as launched (its argv as `command`), with its retry budget and what the launcher
        keeps to follow and cancel it (its run dir, log files, a packed point's files): a rebuilt store keeps them."""
        from reports.secrets import redact_tree  # detect-secrets loads on the first attempt only

        info = dict(job_info or {})
        command = info.pop("argv", None)
        # masked whole: a secret in an argv, a label or the launcher's info never lands in the file
        rundir.write_launch(spec.run_dir, redact_tree(rundir.launch_record(
            launcher=self.launcher.name, campaign=spec.campaign, cell_id=spec.cell_id, attempt=spec.attempt,
            job_id=job_id, command=command, nodes=spec.resources.nodes,
            ranks_per_node=spec.resources.gpus_per_node, env_set=sorted(spec.env),
            env_passed_by_name=sorted(spec.env_pass), fingerprint=login_fingerprint(self.campaign),
            try_number=attempt.try_number, steps_before=attempt.steps_before,
            **({"software": found} if (found := software_record(spec.env)) else {}),
            **({"jit_caches": caches} if (caches := jit_cache_plan(spec)) else {}),
            **({"job_info": info} if info else {}),
        )))  # fmt: skip

    # following a running attempt -------------------------------------------------------------------------
    def _ended_by_files(self, flight: InFlight, state: JobState) -> bool:
        """Whether a job the launcher cannot place has already finished by its run dir (status file first)."""
        return state == JobState.UNKNOWN and rundir.read_status(flight.run_dir) is not None

    def _watch(self, flight: InFlight) -> bool:
        """Follow a running attempt's output; cancel it when every planned step is logged but it does not exit
        within collect.exit_grace_s. True when it should be collected now anyway."""
        if flight.follower is None:
            return False
        now = time.time()
        if flight.cancelled_at is not None:  # cancelled, but the launcher still lists it
            return now - flight.cancelled_at > CANCEL_WAIT_S
        progress = flight.follower.progress
        planned = flight.kind.planned_steps(flight.cell) or progress.planned
        if now - flight.followed_at >= FOLLOW_INTERVAL_S:
            flight.followed_at = now
            if flight.follower.update():
                planned = flight.kind.planned_steps(flight.cell) or progress.planned
                self.on_event(Event("progress", flight.cell, flight.attempt.attempt,
                                    progress=(progress.last_step, planned)))  # fmt: skip
        grace = self.campaign.collect.exit_grace_s
        last = progress.last_step
        if grace is None or not planned or last is None or last < planned:
            return False
        if flight.all_logged_since is None:
            flight.all_logged_since = now
        if now - flight.all_logged_since < grace:
            return False
        self._cancel_hung(flight, last, planned, grace, now)
        return False

    def _cancel_hung(self, flight: InFlight, last: int, planned: int, grace: float, now: float) -> None:
        rundir.write_hung(flight.run_dir, {"last_step": last, "planned": planned, "grace_s": grace,
                                           "all_logged_at": flight.all_logged_since, "cancelled_at": now})  # fmt: skip
        flight.cancelled_at = now
        self.launcher.cancel([flight.job])
        note = f"all {last}/{planned} steps logged, no exit in {grace:.0f} s"
        self.on_event(Event("hung", flight.cell, flight.attempt.attempt, note=note))

    # collection, retries, outcome -----------------------------------------------------------------------
    def _finish(self, flight: InFlight, state: JobState, pending: list[Pending], outcome: Outcome) -> None:
        """Collect an ended attempt, decide on a retry, record the outcome in one store write."""
        attempt = flight.attempt
        try:
            collected = self._collect(flight, state)
            steps = rundir.last_logged_step(flight.run_dir)
        except Exception as err:  # noqa: BLE001 - unreadable run dir files never stop the run nor leave it running
            collected, steps = self._failed(f"mbx could not collect this attempt: {rundir.one_line(err)}"), None
        if collected.failure_class == rundir.INFEASIBLE:
            self._record(flight.cell, attempt, collected)
            self._infeasible(flight, collected, pending, outcome)
            return
        decision = decide(self.campaign.retry, collected.state, collected.failure_class, attempt.try_number,
                          steps, attempt.steps_before, flight.adopted)  # fmt: skip
        if not decision.retry and decision.why:
            collected.reason = f"{collected.reason or collected.state}; {decision.why}"
        self._record(flight.cell, attempt, collected)
        if decision.retry:
            pending.append(Pending(flight.cell, attempt.try_number + 1, steps or 0))
            self.on_event(Event("retrying", flight.cell, attempt.attempt, collected, note=decision.why))
            return
        self._count_finished(outcome, flight.cell, self.store.attempt(self.campaign.name, flight.cell.cell_id,
                                                                      attempt.attempt), not decision.real_failure)  # fmt: skip
        self.on_event(Event("finished", flight.cell, attempt.attempt, collected))

    def _infeasible(self, flight: InFlight, collected: Collected, pending: list[Pending], outcome: Outcome) -> None:
        """A point the GPU check refused on its node: judged again on that GPU (feasibility.on_card), recorded
        infeasible with the reason in the store's estimates, its cells taken out of the active set (as at plan
        time) and its repeats not yet submitted dropped; counted in `outcome.infeasible`, never retried, never
        a failure."""
        name, cell = self.campaign.name, flight.cell
        cells = self.store.deactivate_point(name, cell.point_id)
        node = rundir.read_node(flight.run_dir) or {}
        refusal = collected.reason or "infeasible on this allocation's GPU"
        record = on_card(cell, cells, node, limits_of(self.campaign), refusal)
        self.store.record_estimates(name, [record])
        reason = str(record["reason"])
        dropped = [item for item in pending if item.cell.point_id == cell.point_id]
        pending[:] = [item for item in pending if item.cell.point_id != cell.point_id]
        for other, attempt in [(cell, flight.attempt.attempt), *((item.cell, 0) for item in dropped)]:
            outcome.total -= 1
            outcome.infeasible.append((other, reason))
            self.on_event(Event("infeasible", other, attempt, collected if other is cell else None, note=reason))

    def _record(self, cell: CellRow, attempt: AttemptRow, collected: Collected) -> None:
        summary = collected.summary.to_dict() if collected.summary else None
        self.store.record_outcome(self.campaign.name, cell.cell_id, attempt.attempt, collected.state,
                                  collected.reason, collected.failure_class, summary, collected.gate.to_dict())  # fmt: skip

    def _failed(self, reason: str) -> Collected:
        """An attempt mbx itself could not prepare or collect: failed, class unknown, with the reason."""
        return Collected("failed", reason, "unknown", None,
                         evaluate(self.campaign.gates, None, state="failed", reason=reason))  # fmt: skip

    def _collect(self, flight: InFlight, state: JobState) -> Collected:
        rundir.release_space(flight.run_dir)  # the attempt wrapper's reserve, left by a killed wrapper
        try:
            flight.kind.finalize(self.campaign, flight.cell, flight.run_dir, flight.follower)
        except Exception as err:  # noqa: BLE001 - a collection problem never stops the run: it is recorded
            rundir.write_status(flight.run_dir, {"state": "failed", "failure_class": "unknown",
                                                 "reason": f"mbx could not collect this attempt: {err!r}"},
                                rundir.COLLECTOR)  # fmt: skip
        baseline = baseline_for(self.baseline, flight.cell)
        return collect_attempt(flight.run_dir, self.campaign.gates, self.campaign.collect.window, baseline,
                               state.value)  # fmt: skip

    def _count_finished(self, outcome: Outcome, cell: CellRow, attempt: AttemptRow | None,
                        worth_retrying: bool = True) -> None:  # fmt: skip
        if attempt is None:
            return
        if attempt.state != "completed":
            outcome.failed.append((cell, f"{attempt.state}: {attempt.reason or 'no reason recorded'}"))
            if worth_retrying and attempt.failure_class in self.campaign.retry.on:
                outcome.retryable.append(attempt.failure_class)
            return
        outcome.completed += 1
        if attempt.failure_class:  # completed with a class: hung after its last step (results kept)
            outcome.warnings.append((cell, attempt.reason or attempt.failure_class))
        result = self.store.result(self.campaign.name, cell.cell_id, attempt.attempt)
        if result and result.gate and result.gate.get("verdict") == "fail":
            messages = [c["message"] for c in result.gate.get("checks", []) if c.get("ok") is False]
            outcome.gate_failures.append((cell, messages))
