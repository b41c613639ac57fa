"""`mbx ingest LOG...`: past Megatron-LM / Megatron-Bridge runs into the run store, to compare, gate and report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.options import DEFAULT_WORKSPACE, InconclusiveOkOpt, JsonOpt, WorkspaceOpt
from orchestrator.cli.terminal import console, emit_json, noun_app, say

if TYPE_CHECKING:
    from orchestrator.judge.outcome import Outcome
    from orchestrator.run.ingest import Ingested

app = noun_app("Bring past Megatron-LM / Megatron-Bridge logs into the run store.")


def _params(pairs: list[str]) -> dict[str, Any]:
    import yaml

    from orchestrator.errors import UsageError

    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(
                f"--param {pair!r}: expected KEY=VALUE (e.g. env.NUM_OF_TOKENS_PER_CHUNK_COMBINE_API=128)"
            )
        try:
            params[key.strip()] = yaml.safe_load(value) if value.strip() else value
        except yaml.YAMLError:
            params[key.strip()] = value
    return params


LogsArg = Annotated[
    list[Path] | None,
    typer.Argument(help="Log files of one run (one per rank, or one merged), or folders of them.", show_default=False),
]
StepsOpt = Annotated[
    int | None,
    typer.Option("--steps", "--train-iters", min=1,
                 help="Planned iterations, Megatron's --train-iters (default: M of the log's `iteration N/M`); a log "
                      "that stops before them is recorded failed (truncated)."),
]  # fmt: skip
ParamOpt = Annotated[
    list[str] | None,
    typer.Option("--param", help="KEY=VALUE knob of the run (repeatable), e.g. env.NUM_OF_TOKENS_PER_CHUNK_COMBINE_API="
                                 "128; a campaign whose cells have the same swept values compares with it through "
                                 "`baseline:`."),
]  # fmt: skip


@app.command()
def ingest(
    campaign: Annotated[
        str, typer.Argument(help="Campaign to add the run to (created if new).", show_default=False)
    ],
    logs: LogsArg = None,
    old_campaign: Annotated[
        str | None, typer.Option("--campaign", "-c", hidden=True, help="Before 2026-12-04: LOG... --campaign NAME.")
    ] = None,
    log_format: Annotated[
        str, typer.Option("--format", help="Log dialect: megatron-lm, megatron-bridge or auto.")
    ] = "auto",
    workspace: WorkspaceOpt = DEFAULT_WORKSPACE,
    seq_length: Annotated[
        int | None,
        typer.Option(min=1, help="Sequence length for tokens/s (when the log has no argument dump)."),
    ] = None,
    num_gpus: Annotated[
        int | None,
        typer.Option(min=1, help="GPUs of the run, for tokens/s/GPU (default: the log's world_size)."),
    ] = None,
    steps: StepsOpt = None,
    label: Annotated[
        str | None, typer.Option(help="Name of the run in reports (default: the log's name).")
    ] = None,
    param: ParamOpt = None,
    exit_code: Annotated[
        int | None, typer.Option(help="The run's exit code, if known (non-zero: recorded as failed).")
    ] = None,
    replace: Annotated[
        bool, typer.Option(help="Ingest logs already ingested again, as a new attempt of their cell.")
    ] = False,
    as_json: JsonOpt = False,
    inconclusive_ok: InconclusiveOkOpt = False,
) -> None:
    """Turn existing Megatron logs into a run directory and store rows (state, failure class, window summary,
    default gates), so `mbx campaign status`, `mbx report` and `baseline:` treat them like new runs.

    A log that stops before its planned iterations, or that holds impossible figures (a negative or non-finite step
    time, throughput, token rate or memory), is recorded failed with the reason, never passed.

    It ends with one closing line (PASS / FAIL / INCONCLUSIVE, the cell judged as `campaign run` judges it). Exit
    codes as for `mbx campaign run`, from the ingested cell's verdict: 0 it passed its gates, 1 it failed (a failed or
    truncated run, impossible figures, a failed gate), 3 inconclusive (`--inconclusive-ok` turns it into 0); 2
    without writing anything when a log is missing or holds no iteration lines. The campaign comes first, as
    everywhere (`LOG... --campaign NAME`, the old order, still works). --json prints the cell, its state, its
    gates' verdict, window summary, the closing line, the outcome and the exit code as JSON.

    Example: mbx ingest past-runs logs/run-0412/*.log --format megatron-lm -w mbx-workspace
    """
    from orchestrator.errors import UsageError
    from orchestrator.run.ingest import ingest_logs
    from reports.parsers import FORMATS

    campaign, logs = _campaign_and_logs(campaign, logs or [], old_campaign)

    if log_format not in FORMATS:
        raise UsageError(f"--format: must be one of {', '.join(FORMATS)} (got {log_format!r})")
    result = ingest_logs(
        workspace, logs, campaign, log_format, seq_length=seq_length, num_gpus=num_gpus, steps=steps,
        label=label, params=_params(param or []), exit_code=exit_code, replace=replace,
    )  # fmt: skip
    judged = ingested_outcome(result)
    code = judged.exit_code(inconclusive_ok)
    _note_missing_tokens(result, seq_length, num_gpus)
    if as_json:
        emit_json({"campaign": result.campaign, "cell_id": result.cell_id, "attempt": result.attempt,
                   "already": result.already, "steps": result.steps, "state": result.state,
                   "failure_class": result.failure_class, "reason": result.reason, "verdict": result.verdict,
                   "summary": result.summary, "run_dir": result.run_dir, "closing": judged.closing(inconclusive_ok),
                   "outcome": judged.verdict, "exit_code": code})  # fmt: skip
    else:
        _print_result(result, workspace)
        from orchestrator.judge.closing import closing_text

        console().print(closing_text(judged, inconclusive_ok), soft_wrap=True)
    raise typer.Exit(code)


def ingested_outcome(result: Ingested) -> Outcome:
    """The ingested cell's outcome, judged as `campaign run` judges a cell: one that did not complete fails its
    gates, else its gates' verdict decides (`FAIL cell 96b5fefc28-r0 of 'past', gates FAIL: 1 failed, 1 cell(s)
    did not complete`)."""
    from orchestrator.judge.outcome import Outcome, gates_part

    not_completed = int(result.state != "completed")
    gates = gates_part([result.verdict], not_completed)
    return Outcome(f"cell {result.cell_id} of {result.campaign!r}", (gates,))


def _campaign_and_logs(first: str, rest: list[Path], old_campaign: str | None) -> tuple[str, list[Path]]:
    """(campaign, logs) from `CAMPAIGN LOG...`, or from the old `LOG... --campaign NAME`."""
    from orchestrator.errors import UsageError

    if old_campaign is not None:
        return old_campaign, [Path(first), *rest]
    if Path(first).exists():  # a log (or its folder) where the campaign goes: the old order without --campaign
        raise UsageError(f"{first}: a path where the campaign goes; the campaign comes first: "
                         "`mbx ingest CAMPAIGN LOG...`")  # fmt: skip
    if not rest:
        raise UsageError(f"no logs to ingest into {first!r}: `mbx ingest CAMPAIGN LOG...`")
    return first, rest


def _note_missing_tokens(result: Ingested, seq_length: int | None, num_gpus: int | None) -> None:
    """A note on stderr when the log timed its steps but no tokens/s/GPU could be worked out (a Megatron-Bridge
    log prints neither an argument dump with the sequence length nor the world size)."""
    s = result.summary or {}
    if result.already or s.get("step_time_ms") is None or s.get("tokens_per_s_per_gpu") is not None:
        return
    missing = [(flag, what) for flag, what, given in (("--seq-length", "sequence length", seq_length),
                                                       ("--num-gpus", "GPU count", num_gpus)) if given is None]  # fmt: skip
    if missing:
        say(f"note: no tokens/s/GPU: the log does not say its {' and '.join(w for _, w in missing)}; give "
            f"{' and '.join(f for f, _ in missing)}", "yellow", stderr=True)  # fmt: skip


def _print_result(result: Ingested, workspace: Path) -> None:
    from rich.text import Text

    out = console()
    if result.already:
        out.print(
            Text(f"already ingested: cell {result.cell_id} (attempt {result.attempt}) of {result.campaign!r} holds "
                 "these logs; --replace ingests them again")
        )  # fmt: skip
        return
    s = result.summary or {}

    def fmt(value: Any, digits: int = 4) -> str:
        return "—" if value is None else f"{value:.{digits}g}"

    state = result.state + (f" ({result.failure_class})" if result.failure_class else "")
    out.print(
        Text.assemble(
            ("ingested ", "bold green"),
            f"{result.steps} step(s) as cell {result.cell_id} of {result.campaign!r}: {state}, "
            f"{fmt(s.get('tflops_per_gpu'))} TFLOP/s/GPU, {fmt(s.get('step_time_ms'))} ms/step, "
            f"verdict {result.verdict}",
        )
    )
    if result.reason:
        out.print(Text(f"  {result.reason}", style="yellow" if result.state == "completed" else "red"))
    out.print(Text(f"  run dir {result.run_dir}\n  next: mbx report {result.campaign} --workspace {workspace}"))
