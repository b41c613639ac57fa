"""How to prepare and execute a campaign: the one typed options object, from the command line to every rung."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.run.feasibility import Card


@dataclass(frozen=True)
class Options:
    """How to prepare and execute a campaign (the command line's options); a search's rungs and a bisect's
    batches run with the same object (`dataclasses.replace` for what differs)."""

    workspace: Path = Path("mbx-workspace")
    launcher: str | None = None  # None: the campaign's own (a resumed one: the launcher it was started with)
    parallel: int | None = None  # the local backend's `parallel`
    gpu: str | Card | None = None  # the GPU of the memory estimate and the headroom gate (else resources.gpu)
    strict: bool = False  # refuse the campaign when a point is infeasible, instead of skipping it
    max_cells: int | None = None
    repeats: int | None = None  # sweep.repeats overridden (`mbx compare --run --repeats`)
    make_report: bool = True
    log_wandb: bool = True
    resume_hint: bool = True  # the closing line may name `mbx campaign resume` (not a rung's or batch's)
    inconclusive_ok: bool = False  # --inconclusive-ok: an inconclusive closing line says it exits 0
