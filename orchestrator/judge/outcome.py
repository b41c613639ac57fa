"""The one owner of an outcome: gates, the verdict kinds' parts (parity pairs) and a search's answer (and the verdicts of compare, bisect, a
card check, freeze and ingest) → PASS / FAIL / INCONCLUSIVE, the closing line that says it and the exit code.

Every command that judges goes through `combine` and `exit_code` (the exit codes are orchestrator/errors.py's
one table, README's); a campaign's outcome (`campaign_outcome`) is what run, resume, regate, status, the report
page, summary.md and the W&B summary all say, in the same word. Inconclusive is never a pass: it exits 3, or 0
with `--inconclusive-ok`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_PASS
from orchestrator.judge import verdict_kinds
from orchestrator.judge.parts import FAIL, INCONCLUSIVE, PASS, Part, combine
from orchestrator.judge.parts import VERDICTS as VERDICTS  # (re-exported: the words' one home is parts.py)

ACCEPT_HINT = "exit 3; --inconclusive-ok accepts it"
ACCEPTED_HINT = "exit 0: --inconclusive-ok accepted it"


def exit_code(verdict: str, inconclusive_ok: bool = False) -> int:
    """0 pass, 1 fail, 3 anything else (inconclusive), or 0 for it with `inconclusive_ok`."""
    if verdict == PASS:
        return EXIT_PASS
    if verdict == FAIL:
        return EXIT_FAIL
    return EXIT_PASS if inconclusive_ok else EXIT_INCONCLUSIVE


@dataclass(frozen=True)
class Outcome:
    """An outcome: what ran (`head`) and the parts it rests on; its verdict is theirs combined."""

    head: str
    parts: tuple[Part, ...]

    @property
    def verdict(self) -> str:
        return combine(p.verdict for p in self.parts)

    @property
    def word(self) -> str:
        return self.verdict.upper()

    def exit_code(self, inconclusive_ok: bool = False) -> int:
        return exit_code(self.verdict, inconclusive_ok)

    @property
    def line(self) -> str:
        """The closing line of a command run without `--inconclusive-ok` (`closing`)."""
        return self.closing()

    @property
    def statement(self) -> str:
        """`WORD head, parts` without how a command exits: what files say (the report page, summary.md, the W&B
        summary), which outlive the command that wrote them. Failed parts first, then undecided, then passed
        ones; a part that passed says so briefly only when everything passed (a failed parity check is never
        beside "every gate passed")."""
        rank = {FAIL: 0, INCONCLUSIVE: 1, PASS: 2}
        parts = sorted(self.parts, key=lambda p: rank.get(p.verdict, 1))
        passed = self.verdict == PASS
        texts = [(p.brief or p.text) if passed else p.text for p in parts]
        return f"{self.word} {', '.join(filter(None, [self.head, '; '.join(texts)]))}"

    def closing(self, inconclusive_ok: bool = False) -> str:
        """A command's closing line: the statement and, when inconclusive, how the command exits (3, or 0 as
        `inconclusive_ok` accepted it)."""
        hint = ACCEPTED_HINT if inconclusive_ok else ACCEPT_HINT
        return self.statement + (f" ({hint})" if self.verdict == INCONCLUSIVE else "")

    def to_dict(self, inconclusive_ok: bool = False, exit_hint: bool = True) -> dict[str, Any]:
        """What `--json` closings and status carry (the closing line of a command given `inconclusive_ok` or
        not, its exit code); without `exit_hint`, what the report and the W&B summary carry: the statement, and
        the exit code of the command that wrote them."""
        closing = self.closing(inconclusive_ok) if exit_hint else self.statement
        return {"verdict": self.verdict, "closing": closing, "exit_code": self.exit_code(inconclusive_ok),
                "parts": {p.name: {"verdict": p.verdict, "text": p.text} for p in self.parts}}  # fmt: skip


# ---- the parts ---------------------------------------------------------------------------------------------
def _counts(verdicts: list[str]) -> str:
    """'1 failed, 2 passed, 1 inconclusive, 1 not judged yet'."""
    words = {FAIL: "failed", PASS: "passed", INCONCLUSIVE: "inconclusive"}
    counted = Counter(v if v in words else "none" for v in verdicts)
    order = [(FAIL, "failed"), (PASS, "passed"), (INCONCLUSIVE, "inconclusive"), ("none", "not judged yet")]
    return ", ".join(f"{counted[v]} {word}" for v, word in order if counted[v])


def gates_part(point_verdicts: list[str], not_completed: int = 0, infeasible: int = 0) -> Part:
    """The gates' part from every point's verdict (all its repeats); a cell that did not complete fails it, and
    so does a campaign whose every point is infeasible (`infeasible` points recorded so, at plan time or on
    their node's GPU, and no other point left): nothing ran, nothing passed."""
    if infeasible and not point_verdicts and not not_completed:
        return Part("gates", FAIL, f"gates FAIL: every point ({infeasible}) is infeasible, none ran")
    verdict = FAIL if not_completed else combine(point_verdicts)
    n = len(point_verdicts)
    if verdict == PASS:
        return Part("gates", PASS, f"gates PASS: {n} of {n} point(s) passed", "every gate passed")
    cells = f", {not_completed} cell(s) did not complete" if not_completed else ""
    if verdict == FAIL:
        return Part("gates", FAIL, f"gates FAIL: {_counts(point_verdicts) or 'no point judged'}{cells}")
    if not point_verdicts:
        return Part("gates", INCONCLUSIVE, "gates INCONCLUSIVE: no point was judged")
    undecided = sum(v != PASS for v in point_verdicts)
    return Part("gates", INCONCLUSIVE, f"gates INCONCLUSIVE: no gate failed, {undecided} point(s) undecided")


def search_part(found: bool, tie: bool, how: str, stop_reason: str | None, failed: int) -> Part:
    """A search's answer: a best point passes; a tie no figure separates is undecided, and so is a budget spent
    before a best with nothing failed (more budget may find one); no best point otherwise fails."""
    if found:
        return Part("search", PASS, "search PASS: a best point was found")
    if tie:
        return Part("search", INCONCLUSIVE, f"search INCONCLUSIVE: a tie, {how}")
    if stop_reason and not failed:
        return Part("search", INCONCLUSIVE, f"search INCONCLUSIVE: {stop_reason} before a best point ({how}); "
                                            "no trial failed")  # fmt: skip
    why = f"; {failed} trial(s) failed" if failed else ""
    return Part("search", FAIL, f"search FAIL: no best point: {how}{why}")


# ---- a campaign --------------------------------------------------------------------------------------------
def campaign_outcome(point_verdicts: list[str], verdicts: Mapping[str, list[Mapping[str, Any]]], *,
                     completed: int | None = None, total: int | None = None, not_completed: int = 0,
                     skipped: int = 0, infeasible: int = 0, trials: list[Mapping[str, Any]] | None = None,
                     searched: Outcome | None = None) -> Outcome:  # fmt: skip
    """A campaign's outcome: its gates (every point's verdict; `not_completed` cells fail them, and so does
    every point being one of the `infeasible`) and the part of each verdict kind with records in `verdicts`
    (kind name → its records: the parity pairs), after `completed` of `total` cells completed (`skipped` of them
    already before this run; not said when None: a re-judging, which runs nothing). A search is judged by its
    answer instead: `searched` (orchestrator/judge/search_answer.py: judged again with the current gates), else
    as its stored `trials` keep it (`stored_search_outcome`)."""
    searched = searched or stored_search_outcome(trials or [])
    if searched is not None:
        return searched
    head = ""
    if completed is not None and total is not None:
        head = f"{completed}/{total} completed" + (f" ({skipped} skipped: already completed)" if skipped else "")
        head += ", "
    head += f"{len(point_verdicts)} point(s)"
    kinds = [verdict_kinds.get(name).part(verdicts[name]) for name in verdict_kinds.names() if verdicts.get(name)]
    return Outcome(head, (gates_part(point_verdicts, not_completed, infeasible), *filter(None, kinds)))


def view_outcome(view: Any, trials: list[Mapping[str, Any]] | None = None, searched: Outcome | None = None
                 ) -> Outcome:  # fmt: skip
    """The outcome of a campaign as a report view holds it (reports.views.CampaignView: its points' verdicts,
    each verdict kind's records, judged in memory, and its infeasible points), or of a search (`searched`, else as
    its trial rows store it): what status, the report page and summary.md say."""
    completed = sum(c.state == "completed" for c in view.cells)
    return campaign_outcome([p.verdict for p in view.points], verdict_kinds.of_view(view), completed=completed,
                            total=len(view.cells), infeasible=view.infeasible, trials=trials,
                            searched=searched)  # fmt: skip


SEARCH_OUTCOME = "search_outcome"  # the key under which each stored trial row keeps its search's outcome


def stored_search_outcome(trials: list[Mapping[str, Any]]) -> Outcome | None:
    """A search's outcome as its trial rows keep it (orchestrator/flow/search_run.py writes it when the search
    ends); a search that has not ended is inconclusive; None for a campaign that is not a search."""
    if not trials:
        return None
    kept = next((r[SEARCH_OUTCOME] for r in trials if isinstance(r.get(SEARCH_OUTCOME), Mapping)), None)
    if kept is not None:
        return Outcome(str(kept.get("head", "")), (Part("search", str(kept.get("verdict")), str(kept.get("text"))),))
    count = len({r.get("trial") for r in trials})
    part = Part("search", INCONCLUSIVE, "search INCONCLUSIVE: the search has not ended (`mbx campaign resume` "
                                        "goes on with it)")  # fmt: skip
    return Outcome(f"search: {count} trial(s)", (part,))
