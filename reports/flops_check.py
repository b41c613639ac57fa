"""Whether the TFLOP/s/GPU a trainer printed agrees with mbx's own Megatron-LM FLOPs count over the same window.

One rule: they agree when |printed / mbx - 1| <= 1%. Gates, comparisons, the best point and cards keep using the
printed figure (`Summary.tflops_per_gpu`, what the trainer's own users read); a disagreement is said beside it, never
substituted, so a trainer that counts FLOPs differently (another Megatron version, a wrong config) is visible.
Where mbx has no figure (no resolved config in the run dir) or the trainer printed none, nothing is said.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reports.views import CellView
from reports.window import Summary

TOLERANCE = 0.01  # the relative difference within which the two counts agree
LABEL = "TFLOP/s/GPU"
USED = "gates and comparisons use the printed figure"


@dataclass(frozen=True)
class FlopsCheck:
    """The printed window figure beside mbx's count over the same window."""

    printed: float
    mbx: float

    @property
    def delta(self) -> float:
        """printed / mbx - 1."""
        return self.printed / self.mbx - 1.0

    @property
    def agrees(self) -> bool:
        """|printed / mbx - 1| <= TOLERANCE, as |printed - mbx| <= TOLERANCE * mbx (exact at the bound)."""
        return abs(self.printed - self.mbx) <= TOLERANCE * self.mbx

    def note(self) -> str:
        """What a reader is told: the agreement, or the disagreement and which figure is used."""
        said = (
            f"{LABEL}: the trainer printed {self.printed:.1f}, mbx's Megatron-LM count gives {self.mbx:.1f}"
        )
        if self.agrees:
            return f"{said}: they agree within {TOLERANCE:.0%} (Δ {self.delta:+.2%})"
        return f"{said} (Δ {self.delta:+.1%}): the two counts disagree ({USED})"


def check(summary: Summary | None) -> FlopsCheck | None:
    """The check of one attempt's window; None when either figure is missing (nothing to say)."""
    if summary is None:
        return None
    printed, mbx = summary.tflops_per_gpu, summary.tflops_per_gpu_mbx
    if printed is None or mbx is None or not (math.isfinite(printed) and math.isfinite(mbx)) or mbx <= 0:
        return None
    return FlopsCheck(float(printed), float(mbx))


def checked_cells(cells: list[CellView]) -> list[tuple[CellView, FlopsCheck]]:
    """The cells whose window has both figures, with their check, in the given order."""
    found = [(cell, check(cell.summary)) for cell in cells]
    return [(cell, flops) for cell, flops in found if flops is not None]


def disagreements(cells: list[CellView]) -> list[tuple[CellView, FlopsCheck]]:
    """The checked cells whose two figures do not agree."""
    return [(cell, flops) for cell, flops in checked_cells(cells) if not flops.agrees]


def agreement_line(cells: list[CellView]) -> str | None:
    """One line for the cells that agree ('... agree within 1% in N cell(s), Δ a to b'), None when none does."""
    agreeing = [flops for _, flops in checked_cells(cells) if flops.agrees]
    if not agreeing:
        return None
    low, high = min(f.delta for f in agreeing), max(f.delta for f in agreeing)
    spread = f"Δ {low:+.2%}" if low == high else f"Δ {low:+.2%} to {high:+.2%}"
    return (
        f"{LABEL}: the trainer's printed figure and mbx's Megatron-LM count agree within {TOLERANCE:.0%} in "
        f"{len(agreeing)} cell(s) ({spread})"
    )
