"""Collection: turn a finished attempt's run dir into state, summary and gate verdict (the report views built
from them: orchestrator/judge/views.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.run.regate import run_spikes
from reports.gates import GateResult, GateSpec, evaluate
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
    """Read an attempt's status, exit, metrics and GPU (node.json) through trainer/rundir.py and judge it
    against the gates (the headroom gate on that GPU's memory).

    The state is `rundir.resolve_state`'s (`job_state`: the launcher's word when the run dir says nothing);
    a failed attempt without a failure class is classified from its logs.
    """
    run_dir = Path(run_dir)
    status = rundir.read_status(run_dir)
    exit_info = rundir.read_exit(run_dir)
    resolution = rundir.resolve_state(status, exit_info, job_state=job_state)
    state, reason, failure_class = resolution.state, resolution.reason, resolution.failure_class
    rows, metrics_problem = rundir.read_metrics_checked(run_dir)
    summary = with_gpu(summarize(rows, window), run_dir) if rows else None
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


def with_gpu(summary: Summary, run_dir: Path) -> Summary:
    """The summary with the attempt's GPU as its node recorded it (node.json: name and memory), if it did."""
    node = rundir.read_node(run_dir) or {}
    memory = node.get("gpu_memory_gib")
    if not isinstance(memory, (int, float)) or isinstance(memory, bool):
        return summary
    name = node.get("gpu_name")
    return replace(summary, gpu_name=str(name) if name else None, gpu_memory_gib=float(memory))


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
