"""Shared CLI option types (Annotated aliases): every command spells the same thing the same way.

The grammar (tests/test_cli_grammar.py checks it on the real app):
- `mbx NOUN [ACTION] CAMPAIGN ...`: the campaign (a name in the store, or a file where one is read) is the first
  argument of every command that acts on one;
- one long name and one short flag per meaning, here, used everywhere: `--workspace/-w`, `--point/-p`,
  `--out/-o`, `--file/-f`, `--markdown/-m`, `--launcher/-l`, `--parallel/-j`; `--json` (no short flag) on every
  command that prints a result;
- one meaning per option name, one help text: what differs between commands is only the default (shown as
  `[default: (...)]`) and, for `--out`, FILE or DIR. `--workspace/-w` is only the workspace (`campaign validate`
  and `plan` check the baseline with `--check-baseline`); `--out/-o` is the path of what the command writes (a
  folder where it writes several files); `--min-effect` and `--margin` are percents; `--repeats` is the repeats
  run of each point (freeze's written campaign asks `--frozen-repeats`); `--metric` is the metric judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.errors import UsageError

DEFAULT_WORKSPACE = Path("mbx-workspace")

# --- what a command acts on -------------------------------------------------------------------------------------
CampaignFileArg = Annotated[
    Path, typer.Argument(help="Campaign YAML file (see `mbx schema campaign`).", show_default=False)
]
CampaignNameArg = Annotated[
    str, typer.Argument(help="Campaign name, as in the file's `name:` (the store's name).", show_default=False)
]

# --- where ------------------------------------------------------------------------------------------------------
WorkspaceOpt = Annotated[
    Path,
    typer.Option(
        "--workspace",
        "-w",
        envvar="MBX_WORKSPACE",
        help="Directory holding the run store (mbx.sqlite), run dirs and reports.",
        show_default=True,
    ),
]
CHANGED = "2026-12-06"  # the day --margin became a percent and freeze's --repeats became --frozen-repeats
CheckBaselineOpt = Annotated[
    bool,
    typer.Option(
        "--check-baseline",
        help="Also check that the baseline campaign (`baseline:`) is in the workspace's store (--workspace).",
    ),
]
OUT_HELP = "The path of what the command writes: a file (FILE), or a folder (DIR) where it writes several files."


def out_option(metavar: str, default: str) -> Any:
    """`--out/-o`: one help text everywhere; FILE or DIR (`metavar`) and the default (`default`) per command."""
    return Annotated[Path | None, typer.Option("--out", "-o", metavar=metavar, help=OUT_HELP, show_default=default)]


OutFileOpt = out_option("FILE", "print it on stdout")
CampaignFileOpt = Annotated[
    Path | None,
    typer.Option("--file", "-f", help="A campaign file (the same name) to take settings from.", show_default=False),
]

# --- what is printed --------------------------------------------------------------------------------------------
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the result as JSON on stdout (progress and notes go to stderr).")
]
MarkdownOpt = Annotated[
    bool, typer.Option("--markdown", "-m", help="Print the result as Markdown on stdout (paste it into a PR).")
]

# --- which point ------------------------------------------------------------------------------------------------
PointOpt = Annotated[
    str | None,
    typer.Option("--point", "-p", help="The point: its point id, label or a cell id.", show_default=False),
]
PointsOpt = Annotated[  # `card check`: any number of points
    list[str] | None,
    typer.Option("--point", "-p", help="The point: its point id, label or a cell id.",
                 show_default="every point; repeat -p for several", metavar="<str>"),  # fmt: skip
]
RequiredPointOpt = Annotated[
    str, typer.Option("--point", "-p", help="The point: its point id, label or a cell id.", show_default=False)
]
AllowFailedOpt = Annotated[
    str | None,
    typer.Option(
        "--allow-failed",
        metavar="REASON",
        help="With --point: take a point that failed a check anyway (a gate or parity pair not passed, a failed or "
        "unstable repeat); REASON is written beside the check (freeze: FROZEN.md and frozen.json; card export: "
        "the card's failed_check, status unverified).",
        show_default=False,
    ),
]

# --- how it runs ------------------------------------------------------------------------------------------------
LauncherOpt = Annotated[
    str | None,
    typer.Option(
        "--launcher",
        "-l",
        help="Backend: local, submitit, nemo-run, nemo-run-local [default: the campaign's].",
        show_default=False,
    ),
]
ParallelOpt = Annotated[
    int | None,
    typer.Option("--parallel", "-j", min=1, help="Attempts running (or queued on Slurm) at once.", show_default=False),
]
ReportOpt = Annotated[bool, typer.Option("--report/--no-report", help="Write the report page when done.")]
WandbOpt = Annotated[
    bool, typer.Option("--wandb/--no-wandb", help="Log every attempt to W&B (mode from the campaign; offline default).")
]
InconclusiveOkOpt = Annotated[
    bool,
    typer.Option("--inconclusive-ok", help="Exit 0 instead of 3 when no point failed but some are inconclusive."),
]
MaxCellsOpt = Annotated[
    int | None,
    typer.Option(
        "--max-cells",
        envvar="MBX_MAX_CELLS",
        min=1,
        help=(
            "Refuse a sweep of more cells than this, counted from axis lengths before anything is expanded "
            "[default: 10000]."
        ),
        show_default=False,
    ),
]
GpuOpt = Annotated[
    str | None,
    typer.Option(
        "--gpu",
        help="Target GPU (H200, H100-80GB, GB200, B200, A100-80GB, ... or a size like 80GiB; `auto`: this "
        "machine's GPU, read with nvidia-smi): points whose memory estimate does not fit are infeasible and "
        "skipped [default: the campaign's resources.gpu]. It replaces a valid resources.gpu; a file whose "
        "resources.gpu is unknown is refused as `campaign validate` refuses it (fix the file).",
        show_default=False,
    ),
]
StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="Refuse the whole campaign (exit 2) if any point is infeasible, instead of skipping those points.",
    ),
]
METRIC_HELP = "The metric judged: step_time, tflops, peak_alloc, peak_reserved or final_loss."
REPEATS_HELP = "Repeats of each point to run."


def metric_option(default: str, several: bool = False) -> Any:
    """`--metric`: the metric judged (the command's verdict and exit code come from it); `several`: repeatable."""
    kind = list[str] | None if several else str
    return Annotated[kind, typer.Option("--metric", metavar="METRIC", help=METRIC_HELP, show_default=default)]


def repeats_option(default: str, minimum: int = 1) -> Any:
    """`--repeats`: how many repeats of each point run (a command that runs them); its default per command."""
    return Annotated[int | None, typer.Option("--repeats", min=minimum, help=REPEATS_HELP, show_default=default)]


# --- how much matters: --min-effect, one type (a percent) everywhere --------------------------------------------
@dataclass(frozen=True)
class MinEffect:
    """`--min-effect`: the smallest relative change that matters, in percent (`1` and `1%` are both 1 %);
    `mbx compare` also takes per-metric values (`2,final_loss=0.5`)."""

    text: str
    percent: float | None = None  # the value for every metric (None: the command's default)
    per_metric: dict[str, float] = field(default_factory=dict)  # metric -> percent

    @property
    def fraction(self) -> float | None:
        """The value for every metric as a fraction (1 % -> 0.01), None when only per-metric values were given."""
        return None if self.percent is None else self.percent / 100

    def fractions(self) -> dict[str, float]:
        return {name: pct / 100 for name, pct in self.per_metric.items()}

    def fraction_text(self) -> str:
        """The same thresholds written as fractions (`0.02,final_loss=0.005`), as orchestrator/judge/compare.py reads."""
        parts = [] if self.percent is None else [f"{self.percent / 100:g}"]
        return ",".join(parts + [f"{name}={pct / 100:g}" for name, pct in self.per_metric.items()])

    def single(self) -> float | None:
        """The one value (a fraction) of a command that judges one metric; per-metric values are refused."""
        if self.per_metric:
            raise UsageError(f"--min-effect {self.text}: per-metric values apply to `mbx compare` only; give one percent")
        return self.fraction


def _percent(text: str, whole: str, option: str = "--min-effect", top: float = 100, closed: bool = False) -> float:
    """One percent of an option's value (`1`, `1.5%`) in [0, top) ([0, top] if `closed`); UsageError otherwise."""
    number = text.strip().removesuffix("%").strip()
    try:
        value = float(number)
    except ValueError:
        raise UsageError(f"{option} {whole}: {text.strip()!r} is not a number (a percent, e.g. 1 or 1.5%)") from None
    if not (0 <= value <= top if closed else 0 <= value < top):
        raise UsageError(f"{option} {whole}: {value:g} is not a percent in [0, {top:g}{']' if closed else ')'}")
    return value


def parse_min_effect(text: str | MinEffect) -> MinEffect:
    """`1`, `1.5%`, `2,final_loss=0.5%`, `step_time=1%` -> MinEffect (percent); UsageError (one line, exit 2)
    otherwise."""
    if isinstance(text, MinEffect):
        return text
    percent: float | None = None
    per_metric: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        name, sep, value = part.partition("=")
        if sep:
            per_metric[name.strip()] = _percent(value, text)
        elif percent is None:
            percent = _percent(part, text)
        else:
            raise UsageError(f"--min-effect {text}: two values for every metric; give one (and METRIC=PCT entries)")
    if percent is None and not per_metric:
        raise UsageError("--min-effect: an empty value; give a percent, e.g. 1 or 1.5%")
    if percent is not None and percent < 0.5 and "%" not in str(text).split(",")[0]:
        typer.echo(f"note: --min-effect {text} is {percent:g}% (a percent: 1 is 1%)", err=True)
    return MinEffect(str(text), percent, per_metric)


MIN_EFFECT_HELP = (
    "Smallest relative change that matters, in percent: 1 (or 1%) is 1% [before 2026-12-04 bisect and freeze "
    "took a fraction, 0.01]."
)
MinEffectOpt = Annotated[
    MinEffect | None,
    typer.Option(
        "--min-effect", parser=parse_min_effect, metavar="PERCENT", help=MIN_EFFECT_HELP, show_default=False
    ),
]


# --- how far a portable gate sits from the measured value: --margin, a percent too ------------------------------
MARGIN_MAX = 50.0  # percent: a gate at half (or 1.5×) the measured value at most


def parse_margin(text: str) -> float:
    """`--margin 3` or `3%` -> 0.03 (a fraction, as orchestrator/judge and reports/card.py take it); UsageError
    (one line, exit 2) otherwise. A bare value up to 0.5, a fraction before 2026-12-06, is read as a percent with a
    note saying so."""
    percent = _percent(str(text), str(text), "--margin", MARGIN_MAX, closed=True)
    if 0 < percent <= 0.5 and "%" not in str(text):
        typer.echo(f"note: --margin {text} is {percent:g}% (a percent: 3 is 3%; before {CHANGED} it was a "
                   f"fraction)", err=True)  # fmt: skip
    return percent / 100


MARGIN_HELP = (
    f"How far a portable gate sits from the measured value, in percent: 3 (or 3%) is 3% [before {CHANGED} a "
    "fraction, 0.03]."
)


def margin_option(default: str) -> Any:
    """`--margin`: one help text everywhere, a percent (parsed into a fraction); its default per command."""
    return Annotated[
        float | None,
        typer.Option("--margin", parser=parse_margin, metavar="PERCENT", help=MARGIN_HELP, show_default=default),
    ]
