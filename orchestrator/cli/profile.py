"""`mbx profile show`: where the time of profiled steps went, per run dir or trace file, as Markdown or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.options import JsonOpt
from orchestrator.cli.terminal import emit_json, noun_app
from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from reports.profile_trace import TraceBreakdown

app = noun_app(
    "Profiler traces: where the time of profiled steps went (show): GPU time per kernel class (GEMM, "
    "attention, MoE permute, MoE dispatch/combine, communication, optimizer, norm/elementwise, memcpy, other, "
    'idle). Campaigns record them with `profile: {steps: "8:2"}` (a Megatron-Bridge run dir: its '
    "torch_profile/rank-0.json.gz); Kineto Chrome traces of other runs work too."
    "\n\nExample: mbx profile show mbx-workspace/moe-dispatch-h200/*/1"
)
PathsArg = Annotated[
    list[Path], typer.Argument(help="Run dirs (<workspace>/<campaign>/<cell>/<attempt>) or trace files.")
]


@app.callback()
def profile() -> None:
    """Profiler traces of campaigns (`profile:`) and of other runs (Kineto Chrome traces)."""


def read_one(path: Path) -> TraceBreakdown:
    """The breakdown of a run dir's trace or of a trace file; ConfigError naming the path otherwise."""
    from reports.profile_trace import breakdown_of, load_events  # numpy: not for `mbx --help`
    from reports.profile_view import trace_breakdown, trace_file

    if path.is_dir():
        if trace_file(path) is None:
            raise ConfigError(
                [
                    f"{path}: no profiler trace here (profile-trace.json, *.pt.trace.json[.gz], "
                    "torch_profile/rank-N.json.gz, profile.rank0.nsys-rep or profile.rank.nsys-rep)"
                ]
            )
        found = trace_breakdown(path)
    elif path.is_file():
        try:
            found = breakdown_of(load_events(path), source=str(path))
        except (OSError, ValueError, EOFError) as err:  # the reader's own messages (LimitError too) name the file
            said = isinstance(err, ValueError) and str(err).startswith(f"{path}: ")
            raise ConfigError([str(err) if said else f"{path}: not a readable Chrome trace ({err})"]) from None
    else:
        raise ConfigError([f"{path}: no such file or directory"])
    if found is None:
        raise ConfigError([f"{path}: the trace could not be read (torn, or not a Chrome trace)"])
    return found


@app.command()
def show(paths: PathsArg, as_json: JsonOpt = False) -> None:
    """Print ms per profiled step per kernel class of each trace as a Markdown table (paste it into a PR).

    --json prints every figure (top kernels too) as JSON.

    Example: mbx profile show mbx-workspace/moe-dispatch-h200/*/1
    """
    from reports.profile_view import markdown_table

    found = [(str(path), read_one(path)) for path in paths]
    if as_json:
        emit_json({label: b.to_dict() for label, b in found})
    else:
        typer.echo(markdown_table(found), nl=False)
