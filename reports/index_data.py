"""What the index page's sections share (reports/sections/): the view, the orchestrator's extras, the cell pages'
links and what several sections derive from them: the best point, the point rows, the environments."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from reports.site_data import SearchScope, SiteExtras, estimate_index, search_scope
from reports.site_format import DASH, fmt_param
from reports.site_rows import point_row
from reports.views import CampaignView, CellView, PointView
from trainer import rundir

# Environment facts that must agree across cells for their numbers to compare: the run directory's one
# fingerprint key list, less the per-host and per-cell facts (hostname, GPU count), left out on purpose.
FINGERPRINT_KEYS: tuple[str, ...] = tuple(
    k for k in rundir.FINGERPRINT_KEYS if k not in ("hostname", "gpu_count")
)


@dataclass
class FingerprintGroup:
    """Cells that ran under the same environment, compared on FINGERPRINT_KEYS."""

    values: dict[str, str]  # key → value as text ('—' where the cell did not record the key)
    cells: list[str] = field(default_factory=list)


def fingerprint_groups(
    cells: list[CellView], keys: tuple[str, ...] = FINGERPRINT_KEYS
) -> tuple[list[FingerprintGroup], list[str]]:
    """Distinct environments among cells that recorded one (first-seen order), and the compared keys.

    Only keys that at least one cell recorded are compared; a cell missing a key another cell has
    counts as a different environment.
    """
    recorded = [c for c in cells if c.fingerprint]
    present = [k for k in keys if any(k in (c.fingerprint or {}) for c in recorded)]
    groups: dict[tuple[str, ...], FingerprintGroup] = {}
    for cell in recorded:
        fp = cell.fingerprint or {}
        values = {k: (DASH if fp.get(k) is None else fmt_param(fp[k])) for k in present}
        signature = tuple(values[k] for k in present)
        groups.setdefault(signature, FingerprintGroup(values)).cells.append(cell.cell_id)
    return list(groups.values()), present


def differing_keys(groups: list[FingerprintGroup], keys: list[str]) -> list[str]:
    """Keys whose value is not the same in every group."""
    return [k for k in keys if len({g.values[k] for g in groups}) > 1]


def pick_best(view: CampaignView, extras: SiteExtras) -> tuple[PointView | None, str]:
    """The best point and how it was picked: the verdicts' winner (orchestrator/judge/best.py, as mbx freeze and the
    search pick it) when given; none when the orchestrator said why there is none (a tie no figure separates,
    nothing eligible); the highest mean only for a page rendered without the orchestrator's pick."""
    if extras.winner is not None:
        chosen = next((p for p in view.points if p.point_id == extras.winner), None)
        if chosen is not None:
            return chosen, extras.how or "picked by the verdicts"
    if extras.freeze_note:
        return None, extras.freeze_note
    return view.best_point(), (
        "highest mean TFLOP/s/GPU among completed points that did not fail; not compared with confidence "
        "(mbx freeze compares)"
    )  # fmt: skip


def counts(items: list[str]) -> list[tuple[str, int]]:
    """Each distinct item with how often it occurs, sorted."""
    counted: dict[str, int] = {}
    for item in items:
        counted[item] = counted.get(item, 0) + 1
    return sorted(counted.items())


@dataclass
class IndexPage:
    """The index page being rendered: what every section's `applies` and `context` are given. Each derived figure
    is computed once, when a section first asks for it; `memo` keeps what a section computes in `applies` for its
    `context`."""

    view: CampaignView
    extras: SiteExtras
    hrefs: dict[str, str]  # cell id → its page, relative to the index
    memo: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def picked(self) -> tuple[PointView | None, str]:
        """The best point (or None) and how it was picked (pick_best)."""
        return pick_best(self.view, self.extras)

    @property
    def best(self) -> PointView | None:
        return self.picked[0]

    @cached_property
    def estimates(self) -> dict[str, dict[str, Any]]:
        """The orchestrator's memory estimates by point id."""
        return estimate_index(self.extras.estimates)

    @cached_property
    def point_rows(self) -> dict[str, dict[str, Any]]:
        """Each point's row of the points table (reports/site_rows.py), by point id."""
        view, best = self.view, self.best
        rows = [point_row(p, view.axes, best, self.extras, self.estimates, self.hrefs) for p in view.points]
        return {p.point_id: row for p, row in zip(view.points, rows, strict=True)}

    @cached_property
    def point_hrefs(self) -> dict[str, str]:
        """Each point's link: its first repeat's page."""
        return {p.point_id: self.hrefs[p.repeats[0].cell_id] for p in self.view.points
                if p.repeats[0].cell_id in self.hrefs}  # fmt: skip

    @cached_property
    def environments(self) -> tuple[list[FingerprintGroup], list[str], list[str]]:
        """The cells' distinct environments, the compared keys and the keys that differ between them."""
        groups, keys = fingerprint_groups(self.view.cells)
        return groups, keys, differing_keys(groups, keys)

    @cached_property
    def scope(self) -> SearchScope | None:
        """What a search's figures show (None: not a search)."""
        return search_scope(self.extras)
