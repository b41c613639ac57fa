"""The ledger of a search: what it has spent against its budget, and its trial rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.judge.search_rank import BASE_KEY, Evidence, mean_of, memory_of
from orchestrator.spec.search import Search
from reports import compare as stats


@dataclass
class Ledger:
    """What the search has spent, and its trial rows (sent to `on_rows` as they change)."""

    search: Search
    on_rows: Callable[[list[dict[str, Any]]], None] = lambda rows: None
    steps: int = 0
    gpu_hours: float = 0.0
    numbers: dict[str, int] = field(default_factory=dict)  # candidate key → trial number
    ran: set[str] = field(default_factory=set)  # candidate keys that ran (what a `points` budget counts)
    rates: dict[str, float] = field(default_factory=dict)  # candidate key → GPU-hours per step of its last run
    rows: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    stop_reason: str | None = None

    def affordable(self, keys: list[str], steps: int, one_trial: int | None = None) -> bool:
        """Whether running `keys` for `steps` more training steps stays in budget; otherwise the reason is kept
        in `stop_reason`. Points count the points that ran (an infeasible point never runs and never counts).
        GPU-hours are checked before a trial starts with its predicted cost (`one_trial` steps, default
        `steps`, at the GPU-hours per step paid so far: `predict`), so the search ends at most one trial over."""
        budget = self.search.budget
        points = len(self.ran | set(keys))
        predicted = self.predict(keys, one_trial if one_trial is not None else steps)
        if budget.points is not None and points > budget.points:
            self.stop_reason = f"budget of {budget.points} point(s) reached ({len(self.ran)} ran)"
        elif budget.steps is not None and self.steps + steps > budget.steps:
            self.stop_reason = f"budget of {budget.steps} steps reached ({self.steps} spent)"
        elif budget.gpu_hours is not None and (self.gpu_hours >= budget.gpu_hours
                                               or self.gpu_hours + predicted > budget.gpu_hours):  # fmt: skip
            self.stop_reason = (f"budget of {budget.gpu_hours:g} GPU-hours reached ({self.gpu_hours:.3g} spent, "
                                f"the next trial would take {predicted:.3g})")  # fmt: skip
        else:
            self.stop_reason = None  # an earlier refusal no longer stands (a refused point cost nothing)
            return True
        return False

    def predict(self, keys: list[str], steps: int) -> float:
        """The GPU-hours of `steps` training steps of `keys`: at their own rate where they ran before (an earlier
        rung), else at the rate of every run so far (0 before the first run: it cannot be predicted)."""
        rates = [self.rates[k] for k in keys if k in self.rates]
        rate = sum(rates) / len(rates) if rates else (self.gpu_hours / self.steps if self.steps else 0.0)
        return rate * steps

    def number(self, key: str) -> int:
        return self.numbers.setdefault(key, len(self.numbers) + 1)

    def record(self, evidence: Evidence, rung: int, state: str | None = None, reason: str | None = None,
               decision: stats.Decision | None = None) -> dict[str, Any]:  # fmt: skip
        """The trial row of `evidence` at `rung` (made or updated); `state`/`reason` override the evidence's."""
        c, point = evidence.candidate, evidence.point
        row = {
            "trial": self.number(c.key), "rung": rung, "steps": evidence.steps, "method": self.search.method,
            "key": c.key, "label": c.label, "params": c.params, "state": state or evidence.state,
            "point_id": point.point_id if point else None, "cell_ids": point.cell_ids if point else [],
            "objective_metric": self.search.objective, "objective": mean_of(point, self.search.objective),
            "peak_gib": memory_of(point), "loss": mean_of(point, "last_loss"),
            "verdict": evidence.verdict, "reason": reason or evidence.reason,
            "decision": decision.to_dict() if decision else None, "cost_steps": evidence.cost_steps,
            "gpu_hours": evidence.gpu_hours, "best": False, "pareto": False,
        }  # fmt: skip
        self.rows[(row["trial"], rung)] = row
        return row

    def spend(self, evidences: list[Evidence], rung: int) -> None:
        """Count the runs' cost (and which points ran: not an infeasible one that never started) and record each
        as a trial row at `rung`."""
        for evidence in evidences:
            self.steps += evidence.cost_steps
            self.gpu_hours += evidence.gpu_hours
            key = evidence.candidate.key
            if evidence.cost_steps > 0:
                self.rates[key] = evidence.gpu_hours / evidence.cost_steps
            if key != BASE_KEY:
                if evidence.state != "infeasible" or evidence.cost_steps > 0:
                    self.ran.add(key)
                self.record(evidence, rung)
        self.flush()

    def flush(self) -> None:
        self.on_rows(list(self.rows.values()))
