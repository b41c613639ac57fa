"""Collection: turn a finished attempt's run dir into state, summary and gate verdict; build report views."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.store import AttemptRow, CellRow, Store
from reports.gates import GateResult, GateSpec, evaluate
from reports.metrics import read_metrics, read_status
from reports.views import CampaignView, CellView
from reports.window import Summary, summarize


@dataclass
class Collected:
    """What one attempt amounted to."""

    state: str
    reason: str | None
    failure_class: str | None
    summary: Summary | None
    gate: GateResult


def classify_attempt(run_dir: Path, status: dict[str, Any]) -> tuple[str | None, str | None]:
    """(failure class, the classifier's one-line reason) of an attempt that did not complete, from its logs."""
    from reports.failures import classify_failure

    state = status.get("state")
    if state == "timeout":
        return "timeout", None
    if state == "preempted":
        return "preempted", None
    if state == "cancelled":
        return None, None
    exit_code = status.get("exit_code")
    try:
        exit_info = json.loads((run_dir / "exit.json").read_text())
        exit_code = exit_info.get("exit_code", exit_code)
    except (OSError, json.JSONDecodeError):
        pass
    planned = status.get("steps_planned")
    completed = status.get("steps_completed")
    logs = [run_dir / "logs"] if (run_dir / "logs").exists() else []
    try:
        result = classify_failure(
            logs,
            exit_codes=[exit_code] if exit_code is not None else None,
            all_steps_logged=(completed >= planned) if planned and completed is not None else None,
            planned_steps=planned,
        )
    except Exception:  # a classifier problem must never lose a result
        return None, None
    return result.failure_class, result.reason


def collect_attempt(
    run_dir: Path, gates: GateSpec, window: int, baseline: Summary | None = None, job_state: str | None = None
) -> Collected:
    """Read status.json and metrics.jsonl of an attempt and judge it against the gates."""
    run_dir = Path(run_dir)
    status = read_status(run_dir)
    if status is None:
        state = job_state if job_state in ("timeout", "cancelled", "preempted") else "failed"
        status = {
            "state": state,
            "reason": f"no status.json was written (scheduler state: {job_state or 'unknown'})",
        }
    state = str(status.get("state", "failed"))
    reason = status.get("reason")
    rows = read_metrics(run_dir)
    summary = summarize(rows, window) if rows else None
    failure_class = status.get("failure_class")  # command trainers' status.json carries its class
    if state != "completed" and "failure_class" not in status:
        failure_class, evidence = classify_attempt(run_dir, status)
        if evidence and failure_class != "unknown" and (not reason or "no status.json" in reason):
            reason = evidence
    gate = evaluate(gates, summary, state=state, reason=reason, baseline=baseline)
    return Collected(state, reason, failure_class, summary, gate)


def summary_from_dict(data: dict[str, Any] | None) -> Summary | None:
    return Summary(**data) if data else None


def read_fingerprint(run_dir: Path) -> dict[str, Any] | None:
    """The environment fingerprint of an attempt: launch.json's, completed by the trainer's env.json."""
    fingerprint: dict[str, Any] = {}
    for name in ("launch.json", "node.json", "env.json"):
        path = Path(run_dir) / name
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        fingerprint.update(data.get("fingerprint", data) if name == "launch.json" else data)
    keep = (
        "gpu_name",
        "gpu_count",
        "driver",
        "cuda",
        "torch",
        "te",
        "nccl",
        "container_image",
        "git_sha",
        "hostname",
    )
    picked = {k: fingerprint[k] for k in keep if fingerprint.get(k) is not None}
    return picked or None


def cell_view(
    store: Store, name: str, cell: CellRow, attempt: AttemptRow | None, with_rows: bool = True
) -> CellView:
    """One cell as the report writers see it: its latest attempt, result, step rows and fingerprint."""
    view = CellView(
        cell_id=cell.cell_id,
        point_id=cell.point_id,
        repeat=cell.repeat,
        label=cell.label,
        params=cell.params,
        state=attempt.state if attempt else "pending",
    )
    if attempt is None:
        return view
    view.attempt = attempt.attempt
    view.reason = attempt.reason
    view.failure_class = attempt.failure_class
    view.run_dir = attempt.run_dir
    result = store.result(name, cell.cell_id, attempt.attempt)
    if result is not None:
        view.summary = summary_from_dict(result.summary)
        view.gate = GateResult.from_dict(result.gate) if result.gate else None
    if with_rows:
        view.rows = read_metrics(Path(attempt.run_dir))
    view.fingerprint = read_fingerprint(Path(attempt.run_dir))
    return view


def campaign_view(store: Store, name: str, with_rows: bool = True) -> CampaignView:
    """Everything the report writers need about one campaign, from the store and run dirs."""
    from orchestrator.campaign import Campaign
    from orchestrator.sweep import swept_keys

    record = store.campaign(name)
    if record is None:
        raise KeyError(name)
    campaign = Campaign.model_validate(record["spec"])
    latest = store.latest_attempts(name)
    cells = [cell_view(store, name, cell, latest.get(cell.cell_id), with_rows) for cell in store.cells(name)]
    return CampaignView(
        name=name,
        description=campaign.description,
        axes=swept_keys(campaign),
        cells=cells,
        gates=campaign.gates.model_dump(exclude_none=True),
        window=campaign.collect.window,
        source_file=record["source_file"],
        baseline=campaign.baseline,
    )
