"""Numerics parity, the first verdict kind: a toggle (or pairs, a checkpoint reload, an evaluation) whose on/off
cells must train the same. Its campaign section is orchestrator/spec/parity.py's `Parity` (whose sides
orchestrator/trainers/ adds as sweep factors), its statistics orchestrator/judge/parity_verdicts.py and
parity_noise.py (the repeats' noise floors), its records the store's `parity` table."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.text import Text

from orchestrator import trainers
from orchestrator.judge.parity_verdicts import judge_parity
from orchestrator.judge.parts import FAIL, INCONCLUSIVE, PASS, Part, combine
from orchestrator.judge.verdict_kinds import Records, VerdictKind, register
from orchestrator.run.store import CellRow, Store
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.parity import Parity
from trainer import rundir


@register
class ParityKind(VerdictKind):
    """On/off pairs judged from their cells' metrics; a pair that did not pass rules out its side under test."""

    name = "parity"
    Section = Parity
    description = "Numerics parity: a toggle whose on/off pairs must train the same."

    def judge(self, store: Store, name: str, campaign: Campaign) -> Records:
        """The campaign's pairs judged from their cells' latest attempts."""
        latest = store.latest_attempts(name)

        def rows_of(cell: CellRow) -> tuple[list[dict[str, Any]] | None, str]:
            attempt = latest.get(cell.cell_id)
            if attempt is None:
                return None, f"(cell {cell.cell_id}) has not run"
            if attempt.state != "completed":
                return None, f"(cell {cell.cell_id}) did not complete: {attempt.state}"
            rows, problem = rundir.read_metrics_checked(Path(attempt.run_dir))
            if problem or not rows:
                why = f" ({problem})" if problem else ""
                return None, f"(cell {cell.cell_id}) has no readable metrics{why}"
            return rows, ""

        axes = trainers.for_campaign(campaign).parity_axes(campaign, with_values=False)
        return [v.to_dict() for v in judge_parity(campaign.parity, store.cells(name), rows_of, axes)]

    def record(self, store: Store, name: str, records: Records) -> None:
        store.record_parity(name, records)  # the `parity` table, replaced as a whole

    def announce(self, records: Records) -> list[Text]:
        styles = {PASS: "green", FAIL: "bold red"}
        return [Text.assemble("parity ", (pair["verdict"].upper(), styles.get(pair["verdict"], "yellow")),
                              f" {pair['title']} [{pair['label']}, repeat {pair['repeat']}]: {pair['reason']}")
                for pair in records]  # fmt: skip

    def part(self, records: Records) -> Part | None:
        return parity_part(records)

    def blame(self, records: Records) -> dict[str, tuple[str, str]]:
        return parity_blame(records)

    def closing_lines(self, records: Records) -> list[str]:
        return [f"  parity {pair['verdict']}: {pair['title']} [{pair['label']}, repeat {pair['repeat']}]: "
                f"{pair['reason']}" for pair in records if pair["verdict"] != PASS]  # fmt: skip


def parity_part(pairs: list[Mapping[str, Any]]) -> Part | None:
    """The parity pairs' part (None without pairs): fail when one failed, pass when all passed, else
    inconclusive; the text counts them ("parity FAIL: 1 of 2 pair(s) failed, 1 passed")."""
    if not pairs:
        return None
    verdicts = [str(p.get("verdict")) for p in pairs]
    failed, passed = verdicts.count(FAIL), verdicts.count(PASS)
    verdict = combine(verdicts)
    parts = [f"{failed} of {len(pairs)} pair(s) failed" if failed else f"{passed} of {len(pairs)} pair(s) passed"]  # fmt: skip
    if failed and passed:
        parts.append(f"{passed} passed")
    if len(pairs) - failed - passed:
        parts.append(f"{len(pairs) - failed - passed} inconclusive")
    return Part("parity", verdict, f"parity {verdict.upper()}: " + ", ".join(parts))


# ---- which points a parity pair rules out ------------------------------------------------------------------
# The one rule (freeze, the best that status and the report name, card export; `mbx freeze --help` says it): a
# pair that did not pass (FAIL, or INCONCLUSIVE: not shown to train the same) rules out the side it is about,
# never its reference. Seed 000 (performance features checked for convergence): the feature switched on is what
# may break training (MXFP8 param gather, MTP recompute), and so is evaluating (the grad-norm spike on the step
# after an eval); the side without it is the reference the other is held to.
PARITY_SUBJECT = {"toggle": "on", "pair": "on", "checkpoint": "on", "eval": "off"}
SUBJECT_WORDS = {"toggle": "the on side, the change under test", "pair": "the on side, the change under test",
                 "checkpoint": "the reloading side", "eval": "the evaluating side: train-eval-train"}  # fmt: skip


def parity_subject(pair: Mapping[str, Any]) -> str | None:
    """The cell id of the side a pair is about (PARITY_SUBJECT by its kind; a pair of unknown kind: its on side)."""
    side = PARITY_SUBJECT.get(str(pair.get("kind")), "on")
    cell = pair.get("on_cell" if side == "on" else "off_cell")
    return str(cell) if cell else None


def parity_blame(pairs: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """Cell id → (verdict, why) for every cell a pair that did not pass rules out (its side under test,
    PARITY_SUBJECT), by its first such pair; what freeze, the report's and status's best and card export read."""
    out: dict[str, tuple[str, str]] = {}
    for pair in pairs:
        verdict, cell = str(pair.get("verdict")), parity_subject(pair)
        if verdict == PASS or cell is None or cell in out:
            continue
        side = SUBJECT_WORDS.get(str(pair.get("kind")), "the on side")
        out[cell] = (verdict if verdict == FAIL else INCONCLUSIVE,
                     f"parity {verdict.upper()}: {pair.get('title')} [{pair.get('label')}, repeat "
                     f"{pair.get('repeat', 0)}; this point is {side}]: {pair.get('reason')}")  # fmt: skip
    return out
