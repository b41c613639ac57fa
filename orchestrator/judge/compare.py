"""`mbx compare A B`: match the points of two stored campaigns (or golden-values files), decide per metric,
diagnose, render.

Reads the store (cells, latest attempts, stored summaries) and each completed repeat's run dir (step rows and
fingerprint through trainer/rundir.py); the statistics are reports/compare.py's. Points are matched by their
swept values (`CellRow.params`), or the single point of each side, or explicit `A:B` pairs of point or cell
ids. A side that is a path ending in .json that exists is a Megatron-LM (or Bridge) golden-values file: one
point (`golden`) with one repeat of per-step samples and no fingerprint, so the single-repeat rule of
reports/compare.py decides (the within-run CI widened by the run-to-run floor, orchestrator/judge/run_floor.py;
never SAME; DIFFERENT only for a large effect) and hardware is not checked.
Each metric has a practical threshold (`--min-effect`, per metric too: `2%,final_loss=0.5%`); peak memory,
deterministic for a fixed configuration, is compared against a stated floor (reports/compare.py's
MEMORY_FLOOR), with one run a side too. `looks` > 1 (`--until-conclusive`) tests each look at the levels divided
by the number of looks (Bonferroni). What the two sides ran differs in first: the resolved configuration diff
(`config_diff`: the cell's recipe, resources and env, the trainer, launcher and container settings, the
measured window; argv flags one by one; every key, suspects first where a rule ranks them), then the environment
fingerprint. Besides the signature of the
decisions, the diagnosis reads the whole step curves of every repeat: the loss diverging
from a step, grad-norm spikes only one side has (reports/compare.py on reports/numerics.py).
Exit code: 0 every metric SAME (or below the practical threshold, or better), 1 a DIFFERENT in the bad
direction, 3 an UNKNOWN and nothing bad, 2 bad input. `write_page` writes the comparison page
(reports/compare_page.py); `write_baseline_page` the page of a campaign against its `baseline:`. Runs of
campaign files (`--run`) and extra repeats (`--until-conclusive`) are orchestrator/flow/interleave.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import RunError, UsageError
from orchestrator.judge.compare_config import config_diff, point_config, ranked_groups, templates_of
from orchestrator.judge.golden import load_golden
from orchestrator.judge.outcome import FAIL, INCONCLUSIVE, PASS, exit_code
from orchestrator.judge.run_floor import FloorBook, run_fingerprint, workspace_floors
from orchestrator.run.baseline import params_key, summary_from_dict
from orchestrator.run.store import CellRow, Store
from reports import compare as stats
from reports import secrets
from reports.pvalue import p_text
from reports.window import DEFAULT_WINDOW, summarize, window_rows
from trainer import rundir


@dataclass(frozen=True)
class Metric:
    """A compared figure: its per-repeat value (a Summary field) and per-step samples (a metrics row key)."""

    name: str
    label: str
    summary_key: str
    step_key: str | None
    higher_is_worse: bool
    floor: stats.Floor | None = None  # deterministic: compared against this measurement floor


METRICS = (
    Metric("step_time", "step time (ms)", "step_time_ms", "step_time_ms", True),
    Metric("tflops", "TFLOP/s/GPU", "tflops_per_gpu", "tflops_per_gpu", False),
    Metric("peak_alloc", "peak allocated (GiB)", "peak_alloc_gib", "mem_max_allocated_gib", True, stats.MEMORY_FLOOR),
    Metric("peak_reserved", "peak reserved (GiB)", "peak_reserved_gib", "mem_max_reserved_gib", True,
           stats.MEMORY_FLOOR),
    Metric("final_loss", "final loss", "last_loss", None, True),
)
METRIC_NAMES = tuple(m.name for m in METRICS)
SUSPECT_KEYS = (
    "gpu_name",
    "driver",
    "cuda",
    "torch",
    "transformer_engine",
    "nccl",
    "container_image",
    "git_sha",
)
GOLDEN_POINT = "golden"  # the point id of a golden-values file (for --pair POINT:golden)


@dataclass
class Repeat:
    """One completed repeat of a point: its window summary, window rows and environment fingerprint."""

    cell_id: str
    summary: dict[str, Any]
    window: list[dict[str, Any]]
    fingerprint: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)  # every step (curves: loss, grad norm)


@dataclass
class Point:
    campaign: str
    point_id: str
    label: str
    params: dict[str, Any]
    cell_ids: list[str]
    repeats: list[Repeat] = field(default_factory=list)
    source: str = "campaign"  # "campaign" | "golden" (a golden-values file: no fingerprint)
    config: dict[str, str] | None = None  # the resolved configuration, flattened (None: not recorded)


@dataclass
class PairResult:
    a: Point
    b: Point
    decisions: dict[str, stats.Decision]
    diagnosis: list[str]
    fingerprint_diff: list[str]
    no_fingerprint: list[str] = field(default_factory=list)  # sides without a fingerprint ("B (x.json)")
    notes: list[str] = field(default_factory=list)
    config_diff: list[dict[str, str]] = field(default_factory=list)  # {key, a, b}: what the two sides ran

    def worse(self) -> list[str]:
        return [m.name for m in METRICS if m.name in self.decisions
                and stats.is_bad(self.decisions[m.name], m.higher_is_worse)]  # fmt: skip

    def unknown(self) -> list[str]:
        return [n for n, d in self.decisions.items() if d.decision == stats.UNKNOWN]


@dataclass
class Comparison:
    a: str
    b: str
    min_effect: float
    pairs: list[PairResult]
    unmatched: list[str]
    min_effects: dict[str, float] = field(default_factory=dict)  # per-metric thresholds (others: min_effect)
    looks: int = 1  # the most looks of a sequential comparison (--until-conclusive): each at alpha / looks
    not_compared: list[str] = field(default_factory=list)  # matched points a side has no completed repeat of

    @property
    def levels(self) -> stats.Levels:
        return stats.Levels.for_looks(self.looks)

    @property
    def metrics_verdict(self) -> str:
        """The compared pairs' verdict: fail, a metric DIFFERENT in the bad direction; inconclusive, an UNKNOWN
        and nothing worse (or no pair compared); else pass."""
        if any(p.worse() for p in self.pairs):
            return FAIL
        return INCONCLUSIVE if not self.pairs or any(p.unknown() for p in self.pairs) else PASS

    @property
    def verdict(self) -> str:
        """The metrics' verdict; fail when a matched point has no completed repeat to compare (its cells did not
        complete: a failure, as in `campaign run`)."""
        return FAIL if self.not_compared else self.metrics_verdict

    @property
    def exit_code(self) -> int:
        """orchestrator/judge/outcome.py's exit code of the verdict: 0 same, 1 worse, 3 unknown."""
        return exit_code(self.verdict)


def _window_size(store: Store, name: str) -> int:
    spec = (store.campaign(name) or {}).get("spec") or {}
    window = (spec.get("collect") or {}).get("window") if isinstance(spec, dict) else None
    return window if isinstance(window, int) and window > 0 else DEFAULT_WINDOW


def _repeat(store: Store, name: str, cell: CellRow, attempt: Any, window: int) -> Repeat | None:
    """A completed cell's figures: recomputed from its step rows, else its stored summary."""
    run_dir = Path(attempt.run_dir)
    rows, _problem = rundir.read_metrics_checked(run_dir)
    if rows:
        summary = summarize(rows, window).to_dict()
    else:
        result = store.result(name, cell.cell_id, attempt.attempt)
        stored = summary_from_dict(result.summary) if result else None
        if stored is None:
            return None
        summary = stored.to_dict()
    return Repeat(cell.cell_id, summary, window_rows(rows, window), run_fingerprint(run_dir), rows)


def load_points(store: Store, name: str) -> list[Point]:
    """The campaign's points (active cells grouped by point id, in plan order) with their completed repeats."""
    if store.campaign(name) is None:
        known = ", ".join(store.campaign_names()) or "none"
        raise UsageError(f"campaign {name!r} is not in the store {store.path} (known: {known})")
    window = _window_size(store, name)
    latest = store.latest_attempts(name)
    points: dict[str, Point] = {}
    cells: dict[str, list[CellRow]] = {}
    for cell in store.cells(name):
        label = secrets.mask(cell.label)  # shown everywhere (terminal, -m, --json, page); params only match
        point = points.setdefault(cell.point_id, Point(name, cell.point_id, label, cell.params, []))
        point.cell_ids.append(cell.cell_id)
        cells.setdefault(cell.point_id, []).append(cell)
        attempt = latest.get(cell.cell_id)
        if attempt is not None and attempt.state == "completed":
            repeat = _repeat(store, name, cell, attempt, window)
            if repeat is not None:
                point.repeats.append(repeat)
    record = store.campaign(name) or {}
    spec = record.get("spec") if isinstance(record.get("spec"), dict) else {}
    for point_id, point in points.items():
        point.config = point_config(spec, record.get("launcher"), cells[point_id])
    return list(points.values())


def golden_ref(ref: str) -> Path | None:
    """The golden-values file a compare side names: a path ending in .json that exists (else a campaign)."""
    path = Path(ref).expanduser()
    return path if ref.lower().endswith(".json") and (path.exists() or path.is_symlink()) else None


def golden_point(path: Path, window: int) -> Point:
    """A golden-values file as one point with one repeat: the window of its step rows, no fingerprint."""
    golden = load_golden(path)
    summary = summarize(golden.rows, window).to_dict()
    for key, scalar in (("peak_alloc_gib", "mem_max_allocated_gib"), ("step_time_ms", "step_time_ms")):
        if summary.get(key) is None and scalar in golden.scalars:  # Bridge's max_alloc, legacy timing average
            summary[key] = golden.scalars[scalar]
    repeat = Repeat(path.name, summary, window_rows(golden.rows, window), {}, golden.rows)
    return Point(
        path.name, GOLDEN_POINT, f"golden values, {golden.schema}", {}, [path.name], [repeat], "golden"
    )


def _missing_golden(ref: str) -> UsageError:
    return UsageError(f"{ref}: no such golden-values file (and no campaign of that name in the store)")


def load_sides(workspace: Path, a: str, b: str) -> tuple[list[Point], list[Point]]:
    """Both sides' points: campaigns from the store, golden-values files read as one point (with the window of
    the campaign side, else the default)."""
    refs = (a, b)
    paths = [golden_ref(ref) for ref in refs]
    for ref, path in zip(refs, paths, strict=True):
        if path is None and ref.lower().endswith(".json") and ("/" in ref or "\\" in ref):
            raise _missing_golden(ref)  # a campaign name has no path separator
    loaded: list[list[Point]] = [[], []]
    window = DEFAULT_WINDOW
    if None in paths:
        with Store(workspace, create=False) as store:
            for i, ref in enumerate(refs):
                if paths[i] is None:
                    if ref.lower().endswith(".json") and store.campaign(ref) is None:
                        raise _missing_golden(ref)
                    loaded[i] = load_points(store, ref)
            window = _window_size(store, a if paths[0] is None else b)
    for i, path in enumerate(paths):
        if path is not None:
            loaded[i] = [golden_point(path, window)]
    return loaded[0], loaded[1]


def load_floors(workspace: Path, refs: tuple[str, str]) -> FloorBook | None:
    """The workspace's run-to-run floors (orchestrator/judge/run_floor.py); None (the stated default) when both
    sides are golden-values files."""
    if all(golden_ref(ref) for ref in refs):
        return None
    with Store(workspace, create=False) as store:
        return floors_of(store)


def floors_of(store: Store) -> FloorBook:
    """The run-to-run floors of the compared figures from the store's A/A repeats."""
    return workspace_floors(store, tuple(m.summary_key for m in METRICS))


def side_key(point: Point) -> tuple[str, str]:
    """(trainer kind, GPU model) of a point: its configuration's trainer.kind, its repeats' GPU ("CPU": none)."""
    kind = (point.config or {}).get("trainer.kind") or point.source
    gpus = sorted({str(r.fingerprint["gpu_name"]) for r in point.repeats if r.fingerprint.get("gpu_name")})
    return str(kind), ", ".join(gpus) or "CPU"


def _find(points: list[Point], ref: str, side: str) -> Point:
    for point in points:
        if ref == point.point_id or ref in point.cell_ids:
            return point
    raise UsageError(f"--pair: {side} has no point or cell {ref!r}")


def match_points(
    a: list[Point], b: list[Point], pairs: list[str]
) -> tuple[list[tuple[Point, Point]], list[str]]:
    """Explicit `A:B` pairs, else equal swept values, else the one point of each side; plus unmatched lines."""
    if pairs:
        matched = []
        for text in pairs:
            left, sep, right = text.partition(":")
            if not sep or not left or not right:
                raise UsageError(f"--pair {text!r}: expected A_POINT_OR_CELL:B_POINT_OR_CELL")
            matched.append((_find(a, left, "A"), _find(b, right, "B")))
        return matched, []
    if len(a) == 1 and len(b) == 1:
        return [(a[0], b[0])], []
    by_params = {params_key(p.params): p for p in b}
    matched = [(p, by_params[params_key(p.params)]) for p in a if params_key(p.params) in by_params]
    used = {id(q) for _, q in matched} | {id(p) for p, _ in matched}
    unmatched = [f"{p.campaign} point {p.point_id} ({p.label}): no point with equal swept values"
                 for p in a + b if id(p) not in used]  # fmt: skip
    return matched, unmatched


def _samples(point: Point, metric: Metric) -> stats.Samples:
    values = [r.summary.get(metric.summary_key) for r in point.repeats]
    steps = []
    if metric.step_key:
        steps = [[row[metric.step_key] for row in r.window if isinstance(row.get(metric.step_key), (int, float))]
                 for r in point.repeats]  # fmt: skip
    return stats.Samples([v for v in values if isinstance(v, (int, float))], steps)


def _values(point: Point, key: str) -> set[str]:
    return {str(r.fingerprint[key]) for r in point.repeats if r.fingerprint.get(key) is not None}


def fingerprint_diff(a: Point, b: Point) -> list[str]:
    """`key: A values → B values` for each environment key whose values differ between the two sides."""
    lines = []
    for key in SUSPECT_KEYS:
        left, right = _values(a, key), _values(b, key)
        if left != right and (left or right):
            lines.append(f"{key}: {', '.join(sorted(left)) or '?'} → {', '.join(sorted(right)) or '?'}")
    return lines


def check_hardware(a: Point, b: Point, allow: bool) -> None:
    left, right = _values(a, "gpu_name"), _values(b, "gpu_name")
    if left and right and left != right and not allow:
        raise UsageError(
            f"{a.point_id} ran on {', '.join(sorted(left))} and {b.point_id} on {', '.join(sorted(right))}: "
            "different GPU models are not compared (--allow-different-hardware to compare anyway)"
        )


def side_notes(
    a: Point, b: Point, floor: stats.RunFloor = stats.DEFAULT_RUN_FLOOR
) -> tuple[list[str], list[str]]:
    """(sides without a fingerprint, notes): golden-values sides, and the single-repeat rule where it applies
    (`floor`: the run-to-run floor of step time it widens the within-run CI by)."""
    sides = (("A", a), ("B", b))
    missing = [f"{name} ({p.campaign})" for name, p in sides if p.source == "golden"]
    single = [f"{name} ({p.campaign})" for name, p in sides if len(p.repeats) == 1]
    notes = []
    if single:
        widened = stats.single_run_note(len(a.repeats), len(b.repeats), floor)
        notes.append(f"one repeat on {' and '.join(single)}: the single-repeat rule decides step time and loss "
                     f"({widened}; never SAME); peak memory is deterministic and compared against its floor "
                     f"({stats.MEMORY_FLOOR.text()}); more repeats can settle an UNKNOWN")  # fmt: skip
    return missing, notes


def fingerprint_line(result: PairResult) -> str | None:
    """What to say about the environment when no difference is listed (None when differences are listed)."""
    if result.no_fingerprint:
        what = "golden-values files" if len(result.no_fingerprint) > 1 else "a golden-values file"
        return (f"no fingerprint recorded for {' and '.join(result.no_fingerprint)} ({what}): "
                "environment and GPU not compared")  # fmt: skip
    return None if result.fingerprint_diff else "no difference in the recorded environment"


def curve_diagnosis(a: Point, b: Point, loss_tolerance: float) -> list[str]:
    """Lines from the whole step curves: the loss diverging from a step, grad-norm spikes on either side."""
    runs_a, runs_b = [r.rows for r in a.repeats], [r.rows for r in b.repeats]
    divergence = stats.loss_divergence(runs_a, runs_b, loss_tolerance)
    return ([divergence] if divergence else []) + stats.grad_norm_spikes(runs_a, runs_b)


def compare_pair(a: Point, b: Point, metrics: tuple[Metric, ...], min_effect: float,
                 min_effects: dict[str, float] | None = None, looks: int = 1,
                 floors: FloorBook | None = None) -> PairResult:  # fmt: skip
    """Decide every metric of B against A (`looks`: the most looks of a sequential comparison; `floors`: the
    workspace's run-to-run floors for a side of one run, else the stated default), diagnose, and say what the
    two sides ran differently (configuration, then environment)."""
    effects = {m.name: (min_effects or {}).get(m.name, min_effect) for m in metrics}
    sides = [side_key(a), side_key(b)]
    run_floors = {m.name: floors.for_sides(sides, m.summary_key) if floors else stats.DEFAULT_RUN_FLOOR
                  for m in metrics}  # fmt: skip
    decisions = {m.name: stats.compare_samples(_samples(a, m), _samples(b, m), effects[m.name], floor=m.floor,
                                               looks=looks, run_floor=run_floors[m.name]) for m in metrics}  # fmt: skip
    diagnosis = stats.diagnose(decisions, "step_time", ("peak_alloc", "peak_reserved"), "final_loss")
    diagnosis += curve_diagnosis(a, b, (min_effects or {}).get("final_loss", min_effect))
    timed = next((m for m in metrics if m.step_key and not m.floor), None)
    missing, notes = side_notes(a, b, run_floors[timed.name] if timed else stats.DEFAULT_RUN_FLOOR)
    diff = [] if missing else fingerprint_diff(a, b)
    configured = a.config is not None and b.config is not None
    changed = config_diff(a.config or {}, b.config or {}) if configured else []
    return PairResult(a, b, decisions, diagnosis, diff, missing, notes, changed)


def config_lines(result: PairResult) -> list[str]:
    """What the two sides ran differently, first of all: every `key: A → B` line, suspects first (known
    performance keys, orchestrator/judge/compare_config.py's `ranked_groups`), or why there are none."""
    return [line for line, _rule in config_suspects(result)]


def config_suspects(result: PairResult) -> list[tuple[str, str | None]]:
    """(line, the rule that makes its key a suspect or None) for every configuration difference, suspects first,
    each change once (a swept key with the keys it set); one line saying why there is none when the
    configuration is equal or not recorded."""
    if result.a.config is None or result.b.config is None:
        sides = [f"{n} ({p.campaign})" for n, p in (("A", result.a), ("B", result.b)) if p.config is None]
        return [(f"not recorded for {' and '.join(sides)} (golden-values file): configuration not compared", None)]
    if not result.config_diff:
        return [("no difference in the resolved configuration", None)]
    return ranked_groups(result.config_diff, templates_of(result.a.config))


def parse_min_effect(text: str) -> tuple[float, dict[str, float]]:
    """`--min-effect`: a default and per-metric thresholds, e.g. `0.01`, `2%`, `step_time=1%,final_loss=0.5%`
    or `2%,final_loss=0.5%` (a fraction, or a percentage with %)."""
    default, per_metric = stats.MIN_EFFECT, {}
    for part in (p.strip() for p in str(text).split(",")):
        name, sep, value = part.rpartition("=")
        if sep and name.strip() not in METRIC_NAMES:
            raise UsageError(f"--min-effect {text}: unknown metric {name.strip()!r} "
                             f"(choose from {', '.join(METRIC_NAMES)})")  # fmt: skip
        try:
            number = float(value.strip().rstrip("%")) / (100 if value.strip().endswith("%") else 1)
        except ValueError:
            raise UsageError(f"--min-effect {text}: {value!r} is not a number (e.g. 0.01, 1%, "
                             "step_time=1%,final_loss=0.5%)") from None  # fmt: skip
        if sep and not 0 <= number < 1:  # the default is checked by compare_campaigns
            raise UsageError(
                f"--min-effect {text}: {value.strip()} must be a fraction in [0, 1), e.g. 0.01 for 1%"
            )
        if sep:
            per_metric[name.strip()] = number
        else:
            default = number
    return default, per_metric


def compare_campaigns(workspace: Path, a: str, b: str, *, metrics: list[str] | None = None,
                      min_effect: float = stats.MIN_EFFECT, pairs: list[str] | None = None,
                      allow_different_hardware: bool = False, min_effects: dict[str, float] | None = None,
                      looks: int = 1) -> Comparison:  # fmt: skip
    """Load both sides (campaigns from the workspace's store, or golden-values files), match their points and
    decide every metric (with `min_effects[metric]`, else `min_effect`, as its practical threshold; `looks`:
    the most looks of a sequential comparison, each tested at the levels divided by it)."""
    unknown = [m for m in metrics or [] if m not in METRIC_NAMES]
    if unknown:
        raise UsageError(f"--metric {', '.join(unknown)}: unknown (choose from {', '.join(METRIC_NAMES)})")
    if not 0 <= min_effect < 1:
        raise UsageError(f"--min-effect {min_effect}: must be a fraction in [0, 1), e.g. 0.01 for 1%")
    min_effects = dict(min_effects or {})
    chosen = tuple(m for m in METRICS if not metrics or m.name in metrics)
    points_a, points_b = load_sides(workspace, a, b)
    matched, unmatched = match_points(points_a, points_b, pairs or [])
    if not matched:
        hint = (
            f"; a golden-values file is the point {GOLDEN_POINT!r}" if golden_ref(a) or golden_ref(b) else ""
        )
        raise UsageError(f"no point of {a!r} matches a point of {b!r} by swept values (use --pair A:B{hint})")
    not_compared = [no_repeat(a_, b_) for a_, b_ in matched if not a_.repeats or not b_.repeats]
    matched = [(a_, b_) for a_, b_ in matched if a_.repeats and b_.repeats]
    for left, right in matched:
        if "golden" not in (left.source, right.source):  # a golden file records no GPU
            check_hardware(left, right, allow_different_hardware)
    floors = load_floors(workspace, (a, b))
    results = [
        compare_pair(left, right, chosen, min_effect, min_effects, looks, floors) for left, right in matched
    ]
    return Comparison(a, b, min_effect, results, unmatched, min_effects, looks, not_compared)


def no_repeat(left: Point, right: Point) -> str:
    """Why a matched pair is not compared: the side(s) with no completed repeat (its cells failed or never ran)."""
    empty = [f"{side} {p.campaign} point {p.point_id} [{p.label}]" for side, p in (("A", left), ("B", right))
             if not p.repeats]  # fmt: skip
    return f"{' and '.join(empty)}: no completed repeat (its cells failed or did not run)"


# ---- rendering (plain data, Markdown) ---------------------------------------------------------------------
def fmt_change(d: stats.Decision) -> str:
    if d.change is None:
        return "–"
    return f"{d.change:+.2%}"


def fmt_ci(d: stats.Decision) -> str:
    if d.ci_low is None or d.ci_high is None:
        return "–"
    if d.test.startswith(stats.FLOOR_TEST):  # a deterministic figure: its floor, not a CI
        return f"exact, floor ±{(d.ci_high - d.ci_low) / 2:.2%}"
    return f"[{d.ci_low:+.2%}, {d.ci_high:+.2%}]"


def fmt_value(value: float | None) -> str:
    return "–" if value is None else f"{value:.5g}"


def verdict_word(d: stats.Decision, metric: Metric) -> str:
    """SAME / DIFFERENT (worse|better) / SAME in practice / UNKNOWN, as shown to people."""
    if d.decision == stats.DIFFERENT:
        return "DIFFERENT (worse)" if stats.is_bad(d, metric.higher_is_worse) else "DIFFERENT (better)"
    if d.decision == stats.BELOW_PRACTICAL:
        return "SAME in practice (below threshold)"
    return d.decision.upper()


def resolvable(decision: stats.Decision) -> bool:
    """An UNKNOWN that more repeats can settle: values on both sides and a defined relative change (peak GPU
    memory on a CPU is 0: no number of repeats decides it)."""
    return (
        decision.decision == stats.UNKNOWN
        and decision.n_a > 0
        and decision.n_b > 0
        and decision.test != "none"
    )


def advice(result: PairResult) -> list[str]:
    """One line per UNKNOWN metric: how many more repeats would likely settle it, or why none would."""
    lines = []
    for name in result.unknown():
        d = result.decisions[name]
        if not resolvable(d):
            lines.append(f"{name}: not decidable ({d.reason}); more repeats will not settle it (--metric leaves "
                         "it out)")  # fmt: skip
            continue
        more = (
            f"{d.more_repeats} more repeat(s) per side suggested" if d.more_repeats else "many more repeats"
        )
        lines.append(f"{name}: needs more samples ({more}; {d.reason})")
    return lines


def pair_title(result: PairResult) -> str:
    a, b = result.a, result.b
    return f"{a.campaign}/{a.point_id} ({a.label}, {len(a.repeats)} rep) vs {b.campaign}/{b.point_id} " \
           f"({b.label}, {len(b.repeats)} rep)"  # fmt: skip


def threshold_text(comparison: Comparison) -> str:
    """`1.0%`, or `1.0%; final_loss 0.5%` with per-metric thresholds."""
    extra = "".join(f"; {name} {value:.1%}" for name, value in comparison.min_effects.items())
    return f"{comparison.min_effect:.1%}{extra}"


def ci_header(comparison: Comparison) -> str:
    """`95% CI`, or the wider interval of a sequential comparison (`98.75% CI`)."""
    return f"{comparison.levels.confidence * 100:.4g}% CI"


def rule_text(comparison: Comparison) -> str:
    """The decision rule as run: levels (per look when sequential) and the memory floor."""
    levels = comparison.levels
    rule = (f"DIFFERENT at p ≤ {levels.alpha:.2g} and |Δ| ≥ the threshold; SAME only when the whole "
            f"{ci_header(comparison)} lies inside ± the threshold (TOST at {levels.equivalence_alpha:.2g} a side); "
            f"peak memory against a floor of {stats.MEMORY_FLOOR.text()}")  # fmt: skip
    if comparison.looks > 1:
        rule += (f"; up to {comparison.looks} looks (--until-conclusive), each at α/{comparison.looks} "
                 f"(Bonferroni): at most {stats.ALPHA:g} false DIFFERENT and {stats.EQUIVALENCE_ALPHA:g} false "
                 "SAME over all looks")  # fmt: skip
    return rule


def to_json(comparison: Comparison) -> dict[str, Any]:
    by_name = {m.name: m for m in METRICS}
    pairs = []
    for r in comparison.pairs:
        pairs.append({
            "config_diff": r.config_diff, "config_lines": config_lines(r),
            "a": {"campaign": r.a.campaign, "point_id": r.a.point_id, "label": r.a.label, "params": secrets.redact_tree(r.a.params),
                  "repeats": [x.cell_id for x in r.a.repeats], "source": r.a.source},
            "b": {"campaign": r.b.campaign, "point_id": r.b.point_id, "label": r.b.label, "params": secrets.redact_tree(r.b.params),
                  "repeats": [x.cell_id for x in r.b.repeats], "source": r.b.source},
            "metrics": {name: d.to_dict() for name, d in r.decisions.items()},
            "worse": r.worse(), "unknown": r.unknown(), "diagnosis": r.diagnosis,
            "fingerprint_diff": r.fingerprint_diff, "no_fingerprint": r.no_fingerprint, "notes": r.notes,
            "verdicts": {name: verdict_word(d, by_name[name]) for name, d in r.decisions.items()},
            "fingerprint_line": fingerprint_line(r), "advice": advice(r),
        })  # fmt: skip
    levels = comparison.levels
    return {"a": comparison.a, "b": comparison.b, "min_effect": comparison.min_effect,
            "min_effects": comparison.min_effects, "looks": comparison.looks, "alpha": levels.alpha,
            "equivalence_alpha": levels.equivalence_alpha, "confidence": levels.confidence,
            "memory_floor": {"rel": stats.MEMORY_FLOOR.rel, "gib": stats.MEMORY_FLOOR.absolute},
            "rule": rule_text(comparison), "metric_labels": {m.name: m.label for m in METRICS},
            "pairs": pairs, "unmatched": comparison.unmatched, "not_compared": comparison.not_compared,
            "exit_code": comparison.exit_code}  # fmt: skip


def write_page(comparison: Comparison, out_dir: Path) -> Path:
    """The comparison page, DIR/index.html (reports/compare_page.py); a directory that cannot hold it → RunError
    naming the path."""
    from orchestrator.run.disk import DiskFull, is_full, nothing_left_on_error
    from reports.compare_page import write_compare_page

    try:
        with nothing_left_on_error(Path(out_dir).expanduser()):  # a full disk leaves no empty folder
            return write_compare_page(to_json(comparison), Path(out_dir).expanduser())
    except OSError as err:
        if is_full(err, Path(out_dir)):
            raise DiskFull(Path(out_dir), "the comparison page was not written", elsewhere="--html") from None
        raise RunError(f"the comparison page was not written: {err.filename or out_dir}: "
                       f"{err.strerror or err}") from None  # fmt: skip


def _suspect(place: int, rule: str | None) -> str:
    """` (first suspect: precision)` for the first line a rule ranks, ` (suspect: ...)` after it, else nothing."""
    return "" if rule is None else f" ({'first suspect' if place == 0 else 'suspect'}: {rule})"


def first_lines(result: PairResult, escape: Callable[[str], str] = str) -> list[str]:
    """What the sides ran differently, shown before any figure: the configuration diff, then the environment
    fingerprint (differences, or why there are none)."""
    config = "config differs" if result.config_diff else "config"
    lines = [f"{config}{_suspect(i, rule)}: {escape(x)}" for i, (x, rule) in enumerate(config_suspects(result))]
    lines += [f"fingerprint differs{' (first suspect)' * (not i and not result.config_diff)}: {escape(x)}"
              for i, x in enumerate(result.fingerprint_diff)]  # fmt: skip
    fingerprint = fingerprint_line(result)
    return lines + ([f"fingerprint: {escape(fingerprint)}"] if fingerprint else [])


def to_markdown(comparison: Comparison) -> str:
    from reports.markdown import md_text  # GFM escaping of user text (labels, ids)

    by_name = {m.name: m for m in METRICS}
    lines = [f"### mbx compare {md_text(comparison.a)} → {md_text(comparison.b)} "
             f"(practical threshold {threshold_text(comparison)})", "", f"rule: {md_text(rule_text(comparison))}", ""]  # fmt: skip
    for r in comparison.pairs:
        lines += [f"**{md_text(pair_title(r))}**", ""] + [f"- {x}" for x in first_lines(r, md_text)] + [""]
        lines += [f"| metric | A | B | Δ | {ci_header(comparison)} | p | decision |",
                  "|---|---:|---:|---:|---|---:|---|"]  # fmt: skip
        for name, d in r.decisions.items():
            p = "–" if d.p_value is None else p_text(d.p_value)
            lines.append(f"| {md_text(by_name[name].label)} | {fmt_value(d.mean_a)} | {fmt_value(d.mean_b)} | "
                         f"{fmt_change(d)} | {fmt_ci(d)} | {p} | {verdict_word(d, by_name[name])} |")  # fmt: skip
        lines.append("")
        notes = [f"note: {md_text(x)}" for x in r.notes]
        notes += [f"diagnosis: {md_text(x)}" for x in r.diagnosis] + [md_text(x) for x in advice(r)]
        lines += [f"- {x}" for x in notes] + ([""] if notes else [])
    lines += [f"- unmatched: {md_text(x)}" for x in comparison.unmatched]
    lines += [f"- not compared: {md_text(x)}" for x in comparison.not_compared]
    return "\n".join(lines).rstrip() + "\n"


def write_baseline_page(workspace: Path, name: str, out_dir: Path | None = None) -> Path | None:
    """The comparison page of campaign `name` against its `baseline:` campaign (A = the baseline), written to
    `out_dir` (default <workspace>/<name>/report/compare/index.html, for the campaign report to link). None
    when the campaign has no baseline or the two cannot be compared (no matching point, no completed repeat,
    different GPU models)."""
    with Store(workspace, create=False) as store:
        record = store.campaign(name) or {}
    spec = record.get("spec") if isinstance(record.get("spec"), dict) else {}
    baseline = spec.get("baseline")
    if not baseline:
        return None
    try:
        comparison = compare_campaigns(workspace, baseline, name)
    except UsageError:
        return None
    return write_page(comparison, out_dir or Path(workspace) / name / "report" / "compare")
