"""`mbx freeze`: the winner of a campaign (by its verdicts) with its evidence, and why every other point lost."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.cli.options import (
    CHANGED,
    DEFAULT_WORKSPACE,
    AllowFailedOpt,
    CampaignNameArg,
    InconclusiveOkOpt,
    JsonOpt,
    MinEffectOpt,
    PointOpt,
    WorkspaceOpt,
    margin_option,
    out_option,
)
from orchestrator.cli.terminal import console, emit_json, noun_app

app = noun_app("Freeze the winner of a campaign with its evidence (recipe, campaign, FROZEN.md).")
OutOpt = out_option("DIR", "WORKSPACE/CAMPAIGN/frozen")
MarginOpt = margin_option("from the repeats' noise")
FrozenRepeatsOpt = Annotated[
    int | None,
    typer.Option(
        "--frozen-repeats",
        min=1,
        help="Repeats the frozen campaign (campaign.yaml) asks for; nothing runs now.",
        show_default="3",
    ),
]
OldRepeatsOpt = Annotated[
    int | None,
    typer.Option("--repeats", min=1, hidden=True, help=f"Before {CHANGED}: --frozen-repeats.", show_default=False),
]


@app.command()
def freeze(
    campaign: CampaignNameArg,
    point: PointOpt = None,
    best: Annotated[
        bool, typer.Option("--best", help="Freeze the best point (the default without --point).")
    ] = False,
    by: Annotated[
        str | None,
        typer.Option("--by", help="What best means: tflops | step_time [default: a search's objective, else tflops].",
                     show_default=False),
    ] = None,
    tie_break: Annotated[
        str, typer.Option(help="Among points not DIFFERENT (worse) than the leader: memory | step_time | tflops.")
    ] = "memory",
    min_effect: MinEffectOpt = None,
    frozen_repeats: FrozenRepeatsOpt = None,
    old_repeats: OldRepeatsOpt = None,
    margin: MarginOpt = None,
    allow_failed: AllowFailedOpt = None,
    out: OutOpt = None,
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    as_json: JsonOpt = False,
    inconclusive_ok: InconclusiveOkOpt = False,
) -> None:
    """Freeze the winner of a campaign, with its evidence.

    Best means best by the verdicts, not by a noisy mean. The leader is the point with the best mean TFLOP/s/GPU
    (--by); every other point is compared with it (Welch t on the repeats; a side of one run: its within-run CI
    widened by the run-to-run floor). The one tie rule: a point DIFFERENT (worse) than the leader (p ≤ 0.01 and
    at least the 1% minimum effect) lost; every other point (SAME, SAME in practice, UNKNOWN) is tied with the
    leader. A tie is settled by the tie-break (less peak memory by default) only when every tied point has that
    figure and it separates them by more than the minimum effect; otherwise there is no winner ("tie — no
    figure separates them", exit 3: pick one with --point; `--inconclusive-ok` exits 0, nothing written). The
    search, the report and status name the same point by the same rule (orchestrator/judge/best.py).

    A point that failed a check never wins: a failed or unfinished repeat, NaN/skipped steps, a gate not passed,
    a parity pair not passed, and in a search any trial shorter than full length. Which side a parity pair
    rules out (the one rule, orchestrator/judge/kinds/parity.py, that status, the report and card export read):
    a pair that did not pass (FAIL, or INCONCLUSIVE: not shown to train the same) rules out the side under
    test: the on side of a toggle or pair, the reloading side of a checkpoint check, the evaluating side of
    eval_check (train-only is its reference); the reference (off) side stays eligible. --point of a ruled-out
    point exits 1 naming the check, unless --allow-failed "REASON" says why it is frozen anyway.

    Writes recipe.yaml (the resolved recipe), campaign.yaml (the winner with --frozen-repeats repeats and
    portable gates, --margin percent from the measured values), FROZEN.md (Frozen configuration, Performance
    result, Validation, Rejected experiments: paste it into a PR) and frozen.json. Every rejected point says why,
    against the winner's verdicts; with --point, where the chosen point stands against the best and each other
    point's verdict against the chosen one.

    --point/-p freezes that point (id, label or cell id) instead of the best; --min-effect is a percent
    [default: a search's min_effect, else 1]; --out/-o is the folder the files go in [default:
    WORKSPACE/CAMPAIGN/frozen]; --json prints the winner, the rejected points and the files written as JSON.
    Before 2026-12-06 --frozen-repeats was --repeats and --margin a fraction (0.03 for 3%).

    When nothing is frozen, one closing line says why (INCONCLUSIVE or FAIL, as every judging command; with
    --json, the verdict, closing line, exit code and rejected points). Exit codes: 0 frozen; 1 every point
    failed a check (or is infeasible), or --point names a point that failed a check; 2 bad input; 3 undecided:
    a tie no figure separates, a point not decided yet (an inconclusive gate or parity pair, a repeat not
    finished, a search's short run it stopped before deciding) and none eligible, or --point names a point
    whose check is not decided yet; `--inconclusive-ok` turns 3 into 0 (nothing is written either way).

    Example: mbx freeze quickstart --out frozen/
    """
    from orchestrator.judge.freeze import NoWinner
    from orchestrator.judge.freeze import freeze as pick

    _check_choice(point, best, allow_failed, out)
    effect = None if min_effect is None else min_effect.single()  # a percent on the command line
    repeats = _frozen_repeats(frozen_repeats, old_repeats)
    try:
        frozen = pick(workspace, campaign, point=point, objective=by,
                      tie_break=tie_break, min_effect=effect, allow_failed=allow_failed)  # fmt: skip
    except NoWinner as none:  # the one closing line; 3 undecided (0 with --inconclusive-ok), 1 every point failed
        raise typer.Exit(no_winner(campaign, none, as_json, inconclusive_ok)) from None
    target = out or workspace / campaign / "frozen"
    written = _write(frozen, target, repeats, margin)
    _say_frozen(campaign, frozen, written, target, as_json)


def _write(frozen: Any, target: Path, repeats: int, margin: Any) -> list[Path]:
    """The frozen files written into `target` (checked first); one line (exit 2) for a folder that cannot be
    made or written after the check (a read-only file system...)."""
    from orchestrator.errors import UsageError
    from orchestrator.judge.freeze_out import write_frozen

    check_out_dir(target)
    try:
        return write_frozen(frozen, target, repeats=repeats, margin=margin)  # margin: a fraction
    except OSError as err:
        raise UsageError(f"--out {target}: cannot be written ({err.strerror or err})") from None


def _check_choice(point: str | None, best: bool, allow_failed: str | None, out: Path | None) -> None:
    """--point/--best/--allow-failed/--out refused before the store is read (a bad choice costs nothing)."""
    from orchestrator.errors import UsageError

    if point is not None and best:
        raise UsageError("--point and --best: give one (without either, the best point is frozen)")
    if allow_failed is not None and (point is None or not allow_failed.strip()):
        raise UsageError(
            '--allow-failed "REASON": give it with --point, and a reason (it is written in FROZEN.md)'
        )
    if out is not None:
        check_out_dir(out)


def _say_frozen(campaign: str, frozen: Any, written: list[Path], target: Path, as_json: bool) -> None:
    """What was frozen: as JSON, or the winner, the rejected points, the files and the one closing line (a point
    frozen anyway with --allow-failed has none)."""
    if as_json:
        w = frozen.winner
        emit_json({"campaign": campaign, "point_id": w.point_id, "label": w.label, "how": frozen.how,
                   "allowed_failed": frozen.allowed_failed,
                   "rejected": [{"point_id": r.point_id, "label": r.label, "kind": r.kind, "why": r.why}
                                for r in frozen.rejected], "written": [str(p) for p in written],
                   **_frozen_json(campaign, frozen, target)})  # fmt: skip
        return
    _print_frozen(campaign, frozen, written)
    if not frozen.allowed_failed:
        from orchestrator.judge.closing import closing_text

        _out().print(closing_text(_frozen_outcome(campaign, frozen, target)))


def _frozen_outcome(campaign: str, frozen: Any, target: Path) -> Any:
    """The closing line of a freeze that wrote its files by the verdicts: PASS, the point and where it went."""
    from orchestrator.judge.outcome import PASS, Outcome, Part

    w = frozen.winner
    text = f"froze {campaign} point {w.point_id} [{w.label}] into {target}, {len(frozen.rejected)} point(s) rejected"
    return Outcome("", (Part("freeze", PASS, text),))


def _frozen_json(campaign: str, frozen: Any, target: Path) -> dict[str, Any]:
    """--json's verdict, closing line and exit code of a freeze that wrote its files. A point frozen with
    --allow-failed is no pass: verdict null, exit code 0 (written as asked), the closing line names its check."""
    if frozen.allowed_failed:
        w = frozen.winner
        return {"verdict": None, "exit_code": 0, "closing": f"froze {campaign} point {w.point_id} [{w.label}] "
                f"despite a failed check ({frozen.allowed_failed}) into {target}"}  # fmt: skip
    return _frozen_outcome(campaign, frozen, target).to_dict()


def no_winner(campaign: str, none: Any, as_json: bool, inconclusive_ok: bool) -> int:
    """Print why nothing is frozen (or exported: `card export -p`) as the one closing line
    (orchestrator/judge/outcome.py), or with --json the outcome and the rejected points; the exit code."""
    from orchestrator.judge.closing import closing_text

    outcome = none.outcome()
    if as_json:
        rejected = [{"point_id": r.point_id, "label": r.label, "kind": r.kind, "verdict": r.verdict, "why": r.why}
                    for r in none.rejected]  # fmt: skip
        emit_json({"campaign": campaign, **outcome.to_dict(inconclusive_ok), "rejected": rejected, "written": []})
    else:
        _out().print(closing_text(outcome, inconclusive_ok))
    return outcome.exit_code(inconclusive_ok)


def _frozen_repeats(frozen_repeats: int | None, old_repeats: int | None) -> int:
    """--frozen-repeats [default 3]; `--repeats`, its spelling before 2026-12-06, still works with a note."""
    from orchestrator.errors import UsageError

    if old_repeats is None:
        return 3 if frozen_repeats is None else frozen_repeats
    if frozen_repeats is not None:
        raise UsageError("--repeats and --frozen-repeats: give --frozen-repeats only (--repeats is its old name)")
    typer.echo(f"note: freeze --repeats is now --frozen-repeats (the repeats campaign.yaml asks for; before "
               f"{CHANGED} the same option)", err=True)  # fmt: skip
    return old_repeats


def _print_frozen(campaign: str, frozen: Any, written: list[Path]) -> None:
    """The winner and how it was picked, each rejected point and why, the files written."""
    from rich.text import Text

    console = _out()
    w = frozen.winner
    head = ("frozen ", "bold green")
    if frozen.allowed_failed:
        head = ("frozen despite a failed check ", "bold yellow")
    console.print(Text.assemble(head, f"{campaign} point {w.point_id} [{w.label}]: {frozen.how}"))
    if frozen.allowed_failed:
        console.print(Text(f"  failed check: {frozen.allowed_failed}", style="yellow"))
    for rejected in frozen.rejected:
        console.print(Text(f"  rejected {rejected.point_id} [{rejected.label}] ({rejected.kind}): {rejected.why}"))
    for path in written:
        console.print(Text(f"  wrote {path}"))


def _out() -> Any:
    return console(soft_wrap=True)


def check_out_dir(out: Path) -> None:
    """`--out` is a directory or can be made one: the nearest existing ancestor is a writable directory;
    UsageError (one line, exit 2) otherwise."""
    import os

    from orchestrator.errors import UsageError

    if out.exists():
        if not out.is_dir():
            raise UsageError(f"--out {out}: is not a directory; give a folder for the frozen files")
        if not os.access(out, os.W_OK | os.X_OK):
            raise UsageError(f"--out {out}: the folder is not writable")
        return
    ancestor = out.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        raise UsageError(f"--out {out}: {ancestor} is not a directory, so the folder cannot be made")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: the folder cannot be made ({ancestor} is not writable)")
