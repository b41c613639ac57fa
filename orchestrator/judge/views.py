"""The report views of a campaign: every cell's latest attempt, result and rows, judged by the gates and the verdict kinds."""

from __future__ import annotations

from pathlib import Path

from orchestrator.judge import verdict_kinds
from orchestrator.run.baseline import summary_from_dict
from orchestrator.run.collect import damaged_files
from orchestrator.run.regate import gates_of, judge_campaign
from orchestrator.run.store import AttemptRow, CellRow, Store
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.sweep import swept_keys
from reports import secrets
from reports.gates import GateResult
from reports.views import CampaignView, CellView, group_points
from trainer import rundir


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


def masked(views: list[CellView]) -> list[CellView]:
    """The views with every secret in a label, a swept value (under its key), a failure reason or a fingerprint
    masked (reports.secrets, all the cells' texts scanned at once): every page, summary and W&B run is made from
    these, so a secret that reached the store (a campaign stored before mbx refused it, a trainer's own words in a
    reason) is not published."""
    shown = secrets.redact_tree([[v.label, v.params, v.reason, v.fingerprint, v.damaged] for v in views])
    for view, (label, params, reason, fingerprint, damaged) in zip(views, shown, strict=True):
        view.label, view.params, view.reason = label, params, reason
        view.fingerprint, view.damaged = fingerprint, damaged
    return views


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
    masked(cells)
    point_gates = {p.point_id: p.gate for p in judged.points}
    gates = campaign.gates.model_dump(exclude_none=True)
    measured = {c.summary.gpu_memory_gib for c in cells if c.summary is not None}
    if "headroom_gib_min" in gates and len(measured) == 1 and None not in measured:
        gates["gpu_memory_gib"] = measured.pop()  # the GPU every run recorded on its node: what the gate used
    out = CampaignView(
        name=name,
        description=secrets.mask(campaign.description),
        axes=swept_keys(campaign),
        cells=cells,
        gates=gates,
        window=campaign.collect.window,
        source_file=record["source_file"],
        baseline=campaign.baseline,
        points=group_points(cells, lambda members: point_gates.get(members[0].point_id)),
        infeasible=judged.infeasible,
    )
    for kind in verdict_kinds.asked(campaign):  # its records under its name (`view.parity`: the pairs)
        setattr(out, kind.name, kind.judge(store, name, campaign))
    return out
