"""Collection: turn a finished attempt's run dir into state, summary and gate verdict; build report views."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.baseline import summary_from_dict
from orchestrator.campaign import Campaign
from orchestrator.parity import PairVerdict, judge_parity
from orchestrator.regate import gates_of, judge_campaign, run_spikes
from orchestrator.store import AttemptRow, CellRow, Store
from orchestrator.sweep import swept_keys
from reports.gates import GateResult, GateSpec, evaluate
from reports.views import CampaignView, CellView, group_points
from reports.window import Summary, summarize
from trainer import rundir


@dataclass
class Collected:
    """What one attempt amounted to."""

    state: str
    reason: str | None
    failure_class: str | None
    summary: Summary | None
    gate: GateResult


def classify_attempt(
    run_dir: Path, status: dict[str, Any], exit_info: dict[str, Any] | None = None
) -> tuple[str | None, str | None]:
    """(failure class, the classifier's one-line reason) of an attempt that did not complete, from its logs."""
    from reports.failures import classify_failure

    state = status.get("state")
    if state in ("timeout", "preempted"):
        return state, None
    if state == "cancelled":
        return None, None
    exit_code = (exit_info or {}).get("exit_code", status.get("exit_code"))
    planned = status.get("steps_planned")
    completed = status.get("steps_completed")
    logs = run_dir / rundir.LOGS
    try:
        result = classify_failure(
            [logs] if logs.exists() else [],
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
    """Read an attempt's status, exit and metrics through trainer/rundir.py and judge it against the gates.

    The state is `rundir.resolve_state`'s (`job_state`: the launcher's word when the run dir says nothing);
    a failed attempt without a failure class is classified from its logs.
    """
    run_dir = Path(run_dir)
    status = rundir.read_status(run_dir)
    exit_info = rundir.read_exit(run_dir)
    resolution = rundir.resolve_state(status, exit_info, job_state=job_state)
    state, reason, failure_class = resolution.state, resolution.reason, resolution.failure_class
    rows, metrics_problem = rundir.read_metrics_checked(run_dir)
    summary = summarize(rows, window) if rows else None
    if state != "completed" and "failure_class" not in (status or {}):
        facts = {**(status or {}), **(resolution.write or {}), "state": state}
        failure_class, evidence = classify_attempt(run_dir, facts, exit_info)
        if evidence and failure_class != "unknown" and (not reason or f"no {rundir.STATUS}" in reason):
            reason = evidence
    spikes = run_spikes(gates, run_dir, rows) if state == "completed" and rows else None
    gate = evaluate(gates, summary, state=state, reason=reason, baseline=baseline, spikes=spikes)
    damaged = damaged_files(run_dir, metrics_problem)
    if damaged:
        reason = "; ".join([reason or state, *(f"damaged {d}" for d in damaged)])
        for check in gate.checks:
            if check.gate == "metrics" and metrics_problem:
                check.message += f" ({metrics_problem})"
    return Collected(state, reason, failure_class, summary, gate)


def damaged_files(run_dir: Path, metrics_problem: str | None = None) -> list[str]:
    """`path: what is wrong` for each damaged file of a run dir (metrics.jsonl's problem as read by the caller)."""
    damaged = rundir.file_problems(run_dir)
    if metrics_problem:
        damaged.append(metrics_problem)
    recipe = Path(run_dir) / rundir.RECIPE
    if recipe.is_file() and not any(d.startswith(f"{recipe}:") for d in damaged):
        import yaml

        try:
            yaml.load(
                recipe.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            )
        except (OSError, yaml.YAMLError, RecursionError, ValueError):
            damaged.append(f"{recipe}: not valid YAML (truncated or overwritten?)")
    return damaged


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
    run_dir = Path(attempt.run_dir)
    rows, metrics_problem = rundir.read_metrics_checked(run_dir)
    if with_rows:
        view.rows = rows
    view.fingerprint = rundir.read_fingerprint(run_dir)
    view.damaged = damaged_files(run_dir, metrics_problem)
    return view


def campaign_view(store: Store, name: str, with_rows: bool = True) -> CampaignView:
    """Everything the report writers need about one campaign, from the store and run dirs; every verdict
    (per cell and per point, from all its repeats) derived from the stored results and the campaign's gates."""
    record = store.campaign(name)
    if record is None:
        raise KeyError(name)
    campaign = Campaign.model_validate(record["spec"])
    latest = store.latest_attempts(name)
    judged = judge_campaign(store, name, gates_of(record), campaign.baseline)
    cells = []
    for cell in store.cells(name):
        view = cell_view(store, name, cell, latest.get(cell.cell_id), with_rows)
        view.gate = judged.gates.get(cell.cell_id, view.gate)
        cells.append(view)
    point_gates = {p.point_id: p.gate for p in judged.points}
    return CampaignView(
        name=name,
        description=campaign.description,
        axes=swept_keys(campaign),
        cells=cells,
        gates=campaign.gates.model_dump(exclude_none=True),
        window=campaign.collect.window,
        source_file=record["source_file"],
        baseline=campaign.baseline,
        points=group_points(cells, lambda members: point_gates.get(members[0].point_id)),
        parity=[v.to_dict() for v in parity_verdicts(store, name, campaign)],
    )


def parity_verdicts(store: Store, name: str, campaign: Campaign) -> list[PairVerdict]:
    """The campaign's parity pairs judged from their cells' latest attempts (none without a parity section)."""
    if campaign.parity is None:
        return []
    latest = store.latest_attempts(name)

    def rows_of(cell: CellRow) -> tuple[list[dict[str, Any]] | None, str]:
        attempt = latest.get(cell.cell_id)
        if attempt is None:
            return None, f"(cell {cell.cell_id}) has not run"
        if attempt.state != "completed":
            return None, f"(cell {cell.cell_id}) did not complete: {attempt.state}"
        rows, problem = rundir.read_metrics_checked(Path(attempt.run_dir))
        if problem or not rows:
            return None, f"(cell {cell.cell_id}) has no readable metrics{f' ({problem})' if problem else ''}"
        return rows, ""

    return judge_parity(campaign.parity, store.cells(name), rows_of)
