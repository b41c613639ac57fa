"""The run-to-run floor of a one-run comparison, from the workspace's own A/A repeats (else the stated default).

How far a repeat of the same point lands from the last. Every point with at least 2 completed runs in the workspace
(its repeats, and its runs in other campaigns: a point's id is its configuration) is an A/A sample: the spread of
its runs' values (log scale) is pooled over the points of one trainer kind and GPU model (`trainer.kind`, the
fingerprint's `gpu_name`; "CPU" without one), per summary figure (step time, TFLOP/s, ...). The floor is the
one-sided 95% upper confidence bound of that pooled standard deviation (chi-square on its degrees of freedom,
scipy), so a few lucky repeats cannot make one-run verdicts over-confident: on the recorded H200 samples a floor of
0.3% (an under-estimate) called 12% of one-run A/As DIFFERENT, 0.5% or more none (benchmarks/compare_stats.py). With
fewer than MIN_DF degrees of freedom reports/compare.py's DEFAULT_RUN_FLOOR (1%) stands. The repeats of one campaign
usually ran on one machine back to back: across machines the spread is larger (~1.4% for the same H200 recipe),
which is why the floor never replaces repeats and never goes below MIN_RUN_FLOOR (1%): a very quiet workspace (a
replayed log, back-to-back repeats on one node) would otherwise make a one-run CI as narrow as the step noise; the
floor then says both numbers ("1.00% (minimum; measured 0.12%: …)").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.rows import INGESTED
from orchestrator.run.store import Store
from reports import compare as stats
from trainer import rundir

MIN_DF = (
    3  # pooled degrees of freedom (repeats beyond each point's first) before the workspace's floor counts
)
CONFIDENCE = 0.95  # of the upper bound the floor is
# the least floor: the H200 samples' ~1.4% across machines, rounded down
MIN_RUN_FLOOR = stats.DEFAULT_RUN_FLOOR.rel


@dataclass
class Spread:
    """Pooled A/A spread of one figure: the sum of squared log deviations from each point's mean, its degrees of
    freedom and the points it came from."""

    squares: float = 0.0
    df: int = 0
    points: int = 0

    def add(self, values: list[float]) -> None:
        found = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        logs = np.log([v for v in found if math.isfinite(v) and v > 0])
        if len(logs) >= 2:
            self.squares += float(((logs - logs.mean()) ** 2).sum())
            self.df += len(logs) - 1
            self.points += 1


@dataclass
class FloorBook:
    """The workspace's A/A spreads by (trainer kind, GPU, summary key), and the floors they give."""

    spreads: dict[tuple[str, str, str], Spread] = field(default_factory=dict)

    def floor(self, kind: str, gpu: str, key: str) -> stats.RunFloor:
        """The floor of figure `key` for runs of trainer `kind` on `gpu` (the default without enough repeats)."""
        spread = self.spreads.get((kind, gpu, key))
        if spread is None or spread.df < MIN_DF:
            return stats.DEFAULT_RUN_FLOOR
        from scipy import stats as sps  # here, not at import: listings never need it

        upper = math.sqrt(spread.squares / float(sps.chi2.ppf(1 - CONFIDENCE, spread.df)))
        source = (f"{CONFIDENCE:.0%} upper bound of the run-to-run spread of {spread.points} point(s)' repeats in "
                  f"the workspace, {kind} on {gpu}, {spread.df} df")  # fmt: skip
        if upper < MIN_RUN_FLOOR:
            return stats.RunFloor(MIN_RUN_FLOOR, f"minimum; measured {upper:.2%}: {source}")
        return stats.RunFloor(upper, source)

    def for_sides(self, sides: list[tuple[str, str]], key: str) -> stats.RunFloor:
        """The floor of a pair: the larger of its sides' ((trainer kind, GPU) each)."""
        return max((self.floor(kind, gpu, key) for kind, gpu in sides), key=lambda f: f.rel)


def run_fingerprint(run_dir: Path, status: dict[str, Any] | None = None) -> dict[str, Any]:
    """rundir's fingerprint, with the GPU and torch that status.json (`status`: already read) names when no other
    file does."""
    found = dict(rundir.read_fingerprint(run_dir) or {})
    status = (rundir.read_status(run_dir) or {}) if status is None else status
    for key, status_key in (("gpu_name", "gpu_name"), ("torch", "torch_version")):
        if found.get(key) is None and status.get(status_key) is not None:
            found[key] = status[status_key]
    return found


def _started_at(run_dir: Path, status: dict[str, Any]) -> float | None:
    """When the run started (its status, else the attempt wrapper's exit record): a copy of a run dir stored under
    another campaign starts when its original did."""
    started = status.get("started_at")
    if started is None:
        started = (rundir.read_exit(run_dir) or {}).get("started_at")
    return float(started) if isinstance(started, int | float) and not isinstance(started, bool) else None


SAME_SOFTWARE = ("git_sha", "container_image", "torch", "transformer_engine", "driver")  # runs pooled as A/A agree


def workspace_floors(store: Store, keys: tuple[str, ...]) -> FloorBook:
    """The A/A spreads of summary figures `keys` over every point of the workspace with ≥ 2 completed runs of one
    trainer kind, GPU model and software (SAME_SOFTWARE of the fingerprint): its repeats, and its runs in other
    campaigns (a point's id is its configuration: the base point of a sweep run again by a `compare --run` is a
    repeat across sessions, the spread a one-run verdict must allow for; the same file after a code, image or
    driver change is not). Stored summaries, the GPU from each run dir's fingerprint. One run stored under several
    campaigns counts once: run dirs that started at the same time, or an ingested point (its id is its logs'
    digest)."""
    book = FloorBook()
    groups: dict[tuple, dict[object, dict]] = {}
    ingested: set[str] = set()
    for name in store.campaign_names():
        latest = store.latest_attempts(name)
        for cell in store.cells(name):
            attempt = latest.get(cell.cell_id)
            if attempt is None or attempt.state != "completed":
                continue
            result = store.result(name, cell.cell_id, attempt.attempt)
            if result is None or not result.summary or cell.point_id in ingested:
                continue
            if cell.trainer_kind == INGESTED:
                ingested.add(cell.point_id)
            run_dir = Path(attempt.run_dir)
            status = rundir.read_status(run_dir) or {}  # read once: the fingerprint's GPU and the start time
            found = run_fingerprint(run_dir, status)
            group = (cell.point_id, cell.trainer_kind, str(found.get("gpu_name") or "CPU"),
                     *(found.get(k) for k in SAME_SOFTWARE))  # fmt: skip
            run = _started_at(run_dir, status) or (name, cell.cell_id)
            groups.setdefault(group, {}).setdefault(run, result.summary)
    for (_, kind, gpu, *_), runs in groups.items():
        if len(runs) < 2:
            continue
        for key in keys:
            book.spreads.setdefault((kind, gpu, key), Spread()).add([summary.get(key) for summary in runs.values()])
    return book
