"""A search's answer judged again with the campaign's current gates: what regate, status and the report say.

The search keeps the outcome it ended with on its trial rows (orchestrator/flow/search_run.py); gates changed
since (`mbx campaign regate --file`) may rule its best out. The answer is then the best by `mbx freeze`'s rule
(orchestrator/judge/freeze.py: only full-length trials that passed every gate and parity check can win, ties by
orchestrator/judge/best.py), and a search that has no best says why by the search's own rule
(orchestrator/judge/outcome.py's `search_part`: a budget spent with nothing failed is undecided, else a failure).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import MbxError
from orchestrator.judge import verdict_kinds
from orchestrator.judge.outcome import FAIL, SEARCH_OUTCOME, Outcome, Part, search_part, stored_search_outcome

AGAIN = "judged again with the current gates"
FAILED_KINDS = ("failed", "oom", "gate")  # a rejected point's kinds that count as a failed trial (+ verdict kinds)


def search_answer(workspace: Path, name: str, trials: list[dict[str, Any]] | None = None) -> Outcome | None:
    """The outcome of search `name` (its stored `trials`, read read-only when not given) with its answer judged
    again by freeze's rule; the stored outcome when that says the same word (its text is the run's); None for a
    campaign that is not a search."""
    if trials is None:
        trials = _trials(workspace, name)
    stored = stored_search_outcome(trials)
    kept = next((r[SEARCH_OUTCOME] for r in trials if isinstance(r.get(SEARCH_OUTCOME), Mapping)), None)
    if stored is None or kept is None:  # not a search, or one that has not ended
        return stored
    part = _judged_again(workspace, name, kept)
    if part is None or part.verdict == stored.verdict:
        return stored
    return Outcome(stored.head, (part,))


def _judged_again(workspace: Path, name: str, kept: Mapping[str, Any]) -> Part | None:
    """The search's part by freeze's pick now (None: the store cannot say, e.g. nothing registered)."""
    from orchestrator.judge.freeze import NoWinner, Tied, freeze

    try:
        frozen = freeze(workspace, name)
    except Tied as err:
        how = str(err).removeprefix(f"{name}: ").removesuffix("; freeze one of them with --point")
        part = search_part(False, True, how, None, 0)
    except NoWinner as err:
        kinds = (*FAILED_KINDS, *verdict_kinds.names())  # a point a verdict kind ruled out failed a check too
        failed = sum(r.kind in kinds and r.verdict == FAIL for r in err.rejected)
        part = search_part(False, False, "no full-length trial passed every check", kept.get("stop_reason"), failed)
    except (MbxError, KeyError, ValueError):
        return None
    else:
        part = search_part(True, False, "", None, 0)
        part = Part(part.name, part.verdict, f"{part.text}: {frozen.winner.point_id} [{frozen.winner.label}]")
    return Part(part.name, part.verdict, f"{part.text} ({AGAIN})", part.brief)


def _trials(workspace: Path, name: str) -> list[dict[str, Any]]:
    """The campaign's search trials, read-only (empty: not a search, or no store)."""
    from orchestrator.run.store import read_only

    with read_only(Path(workspace)) as store:
        return store.trials(name) if store is not None else []
