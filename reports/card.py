"""Model verification cards (Megatron-Bridge's `*.card.yaml`): the performance item mbx writes, with structured
thresholds (a portable gate = measured × (1 ∓ margin)), the validator, and the gates a card sets for a new run."""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from reports import secrets
from reports.gates import GateSpec

STATUSES = ("verified", "unverified", "unsupported", "not_applicable")
MIN_WINDOW_STEPS = 10
DEFAULT_MARGIN_FLOOR = 0.01  # a portable gate is never tighter than 1% (node-to-node variance)
MAX_MARGIN = 0.5  # noisier repeats than this give no useful gate: the margin is capped and says so
SINGLE_RUN_MARGIN = 0.03  # the margin when one repeat gives no noise estimate and none is given
PREDICTION_CONFIDENCE = 0.99


@dataclass(frozen=True)
class CardMetric:
    """A card metric: its name in the card, the window-summary field it comes from, and its gate."""

    name: str
    summary_key: str
    gate: str | None  # GateSpec field a threshold becomes (None: reported, not gated)
    higher_is_better: bool


CARD_METRICS = (
    CardMetric("initial_loss", "first_loss", None, False),
    CardMetric("final_loss", "last_loss", None, False),
    CardMetric("last_10_steps_step_time_ms_avg", "step_time_ms", "step_time_ms_max", False),
    CardMetric("last_10_steps_model_tflops_per_gpu_avg", "tflops_per_gpu", "tflops_per_gpu_min", True),
    CardMetric(
        "last_10_steps_tokens_per_second_per_gpu_avg",
        "tokens_per_s_per_gpu",
        "tokens_per_s_per_gpu_min",
        True,
    ),  # fmt: skip
    CardMetric("peak_allocated_gib", "peak_alloc_gib", "peak_alloc_gib_max", False),
    CardMetric("peak_reserved_gib", "peak_reserved_gib", "peak_reserved_gib_max", False),
)
BY_NAME = {m.name: m for m in CARD_METRICS}


def portable_margin(values: Sequence[float], given: float | None = None) -> tuple[float, str]:
    """(margin, how it was derived): `given` if set; else the half-width of a 99% prediction interval for one
    more run's value from the repeats (Student t, scipy) relative to their mean, at least 1%; one repeat: 3%."""
    if given is not None:
        return given, f"given ({given * 100:.4g}%)"
    finite = [float(v) for v in values if math.isfinite(v)]
    if len(finite) < 2:
        return SINGLE_RUN_MARGIN, f"one repeat gives no noise estimate: default {SINGLE_RUN_MARGIN:.0%}"
    import numpy as np
    from scipy import stats

    data = np.asarray(finite)
    mean, sd = float(data.mean()), float(data.std(ddof=1))
    half = float(stats.t.ppf(PREDICTION_CONFIDENCE, len(data) - 1)) * sd * math.sqrt(1 + 1 / len(data))
    derived = half / abs(mean) if mean else 0.0
    margin = min(MAX_MARGIN, max(DEFAULT_MARGIN_FLOOR, derived))
    basis = (f"{PREDICTION_CONFIDENCE:.0%} prediction bound of one more run from {len(data)} repeats "
             f"(CV {sd / abs(mean):.2%})" if mean else "repeats averaged 0")  # fmt: skip
    if margin > derived:
        basis += f", raised to the {DEFAULT_MARGIN_FLOOR:.0%} floor"
    elif margin < derived:
        basis += f", capped at {MAX_MARGIN:.0%}: too noisy for a useful gate, more repeats tighten it"
    return margin, basis


def significant(value: float, digits: int = 6) -> float:
    """`value` rounded to `digits` significant digits (a CPU run's 0.000312 TFLOP/s stays non-zero)."""
    return float(f"{value:.{digits}g}")


def thresholds(metrics: dict[str, list[float]], margin: float | None = None) -> dict[str, dict[str, Any]]:
    """Structured thresholds for the gated metrics measured: {metric: {min|max, measured, margin, basis}}."""
    out: dict[str, dict[str, Any]] = {}
    for metric in CARD_METRICS:
        values = metrics.get(metric.name) or []
        if metric.gate is None or not values:
            continue
        measured = sum(values) / len(values)
        m, basis = portable_margin(values, margin)
        bound = measured * (1 - m) if metric.higher_is_better else measured * (1 + m)
        key = "min" if metric.higher_is_better else "max"
        out[metric.name] = {key: significant(bound), "measured": significant(measured), "margin": round(m, 4),
                            "basis": basis}  # fmt: skip
    return out


def gate_spec(item: dict[str, Any]) -> tuple[GateSpec, list[str]]:
    """The gates a card item sets for a new run (from its `thresholds`), and a note per metric not gated."""
    limits: dict[str, float] = {}
    notes: list[str] = []
    for name, threshold in (item.get("thresholds") or {}).items():
        metric = BY_NAME.get(name)
        if metric is None or metric.gate is None or not isinstance(threshold, dict):
            notes.append(f"threshold {name!r} is not one mbx can gate")
            continue
        key = "min" if metric.higher_is_better else "max"
        if isinstance(threshold.get(key), (int, float)):
            limits[metric.gate] = float(threshold[key])
    return GateSpec(**limits), notes


def add_thresholds(item: dict[str, Any], margin: float) -> dict[str, Any]:
    """A copy of a card item without structured thresholds, with thresholds derived from its metrics and
    `margin` (for Bridge's published cards, which give prose only)."""
    metrics = {k: [float(v)] for k, v in (item.get("metrics") or {}).items() if _number(v)}
    derived = thresholds(metrics, margin)
    for threshold in derived.values():
        threshold["basis"] = f"the card's measured value with a {margin * 100:.4g}% margin (--margin)"
    return {**item, "thresholds": derived}


# ---- validation --------------------------------------------------------------------------------------------

_INHERITED = ("status", "precision")
_ACCOUNT = (  # (pattern, what, texts one of which a match holds: a cheap test before the search); no pattern
    # here matches a newline, so a search over texts joined by newlines finds in each exactly what it would alone
    (re.compile(r"(?:--account[= ]|(?<!\S)-A[ \t]+)[\w.-]+"), "a Slurm account", ("--account", "-A")),
    (re.compile(r"(?:/home|/Users|/lustre|/gpfs|/scratch)/[\w.-]+"), "a personal or site directory",
     ("/home", "/Users", "/lustre", "/gpfs", "/scratch")),
    (re.compile(r"\b[\w.+-]+@[\w-]+\.[\w.-]+\b"), "an e-mail address", ("@",)),
)  # fmt: skip
# A path from the root; not a markup closing tag such as [/x], [/bold red] or [/] (a bracket, one slash, a bracket),
# nor a path under a placeholder ({campaign_dir}/train.py).
_ABSOLUTE = re.compile(r"(?<![\w:./~}-])(?!(?<=\[)/[\w .-]*\])/(?:[\w.-]+/)*[\w.-]+|\b[A-Za-z]:\\[\w\\.-]+")


def publishable(text: str) -> str:
    """`text` (a reason mbx wrote: a failure, a gate) fit for a card: secrets masked, absolute paths (personal
    and site directories too) reduced to their file name."""
    text = secrets.mask(str(text))
    return _ABSOLUTE.sub(lambda m: re.split(r"[/\\]", m.group(0))[-1], text)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def leak_problems(card: Any) -> list[str]:
    """`key.path: contains ...` for secrets (reports.secrets: named, never shown), account names and absolute
    paths anywhere in the card. The card's strings are scanned together: each pattern searched once over them all
    joined, then confirmed in the strings it marked (a 4 MB card of 72,000 strings: ~1 s, not 5)."""
    strings = secrets.strings(card)
    texts = [text for _, _, text in strings]
    joined = "\n".join(texts)
    starts = list(itertools.accumulate((len(text) + 1 for text in texts), initial=0))
    found: dict[int, list[str]] = {}
    for index, findings in enumerate(secrets.scan_many(strings)):  # one scan for all
        if findings:
            found[index] = [f.describe() for f in findings]
    for pattern, what, needs in _ACCOUNT:
        if any(n in joined for n in needs):
            for index in _marked(pattern, joined, starts):
                if pattern.search(texts[index]):
                    found.setdefault(index, []).append(what)
    for index in _marked(_ABSOLUTE, joined, starts):
        absolute = _ABSOLUTE.search(texts[index]) if "://" not in texts[index] else None
        if absolute:
            found.setdefault(index, []).append(f"an absolute path ({absolute.group(0)!r})")
    paths = dict(zip(sorted(found), secrets.mask_many([strings[i][0] for i in sorted(found)]), strict=True))
    return [f"{paths[index]}: contains {what}: cards are published, keep it out"  # a key may be a secret itself
            for index in sorted(found) for what in dict.fromkeys(found[index])]  # fmt: skip


def _marked(pattern: re.Pattern[str], joined: str, starts: list[int]) -> list[int]:
    """The indexes of the texts (joined by newlines, starting at `starts`) where `pattern`, which never matches a
    newline, matches."""
    marked: list[int] = []
    for match in pattern.finditer(joined):
        index = bisect.bisect_right(starts, match.start()) - 1
        if not marked or marked[-1] != index:
            marked.append(index)
    return marked


def measured_items(
    items: Any, path: str = "items", inherited: dict[str, Any] | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(key path, item) of every card item that carries `metrics` (items nest by GPU: items.pretrain.H100, and
    lists of points, which take status and precision from the item above them)."""
    inherited = inherited or {}
    if isinstance(items, list):
        for i, value in enumerate(items):
            yield from measured_items(value, f"{path}[{i}]", inherited)
        return
    if not isinstance(items, dict):
        return
    here = {**inherited, **{k: items[k] for k in _INHERITED if k in items}}
    if "metrics" in items:
        yield path, {**here, **items}
        return
    for key, value in items.items():
        yield from measured_items(value, f"{path}.{key}", here)


def item_problems(path: str, item: dict[str, Any]) -> list[str]:
    """Problems of one measured item: status, precision, command, finite positive metrics, window, thresholds."""
    problems = []
    if item.get("status") not in STATUSES:
        problems.append(f"{path}.status: must be one of {', '.join(STATUSES)}, got {item.get('status')!r}")
    if not isinstance(item.get("precision"), str) or not item.get("precision"):
        problems.append(f"{path}.precision: required (e.g. bf16)")
    if not item.get("command") and not item.get("commands"):
        problems.append(f"{path}.command: required (the command that produced the metrics)")
    metrics = item.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        return [*problems, f"{path}.metrics: must be a mapping of metric name → number"]
    for name, value in metrics.items():
        if not _number(value) or not math.isfinite(value) or value <= 0:
            problems.append(f"{path}.metrics.{name}: must be a finite positive number, got {value!r}")
    window = item.get("window_steps")
    if window is not None and (not isinstance(window, int) or window < MIN_WINDOW_STEPS):
        problems.append(f"{path}.window_steps: the averages need a window of at least {MIN_WINDOW_STEPS} steps, "
                        f"got {window!r}")  # fmt: skip
    return problems + threshold_problems(path, item.get("thresholds"), metrics)


def threshold_problems(path: str, found: Any, metrics: dict[str, Any]) -> list[str]:
    """Structured thresholds: known gated metrics, a bound on the right side of the measured value."""
    if found is None:
        return []
    if not isinstance(found, dict):
        return [f"{path}.thresholds: must be a mapping of metric → {{min|max, measured, margin}}"]
    problems = []
    for name, threshold in found.items():
        where = f"{path}.thresholds.{name}"
        metric = BY_NAME.get(name)
        if metric is None or metric.gate is None or not isinstance(threshold, dict):
            gated = ", ".join(m.name for m in CARD_METRICS if m.gate)
            problems.append(f"{where}: not a gated metric (allowed: {gated})")
            continue
        key = "min" if metric.higher_is_better else "max"
        bound, measured = threshold.get(key), threshold.get("measured", metrics.get(name))
        if not _number(bound) or not math.isfinite(bound) or bound <= 0:
            problems.append(f"{where}.{key}: must be a finite positive number, got {bound!r}")
        elif _number(measured) and (bound > measured if key == "min" else bound < measured):
            problems.append(f"{where}.{key}: {bound} is on the wrong side of the measured {measured}")
    return problems


def card_problems(card: Any) -> list[str]:
    """Everything wrong with a card document (empty: it validates)."""
    if not isinstance(card, dict):
        return ["the card must be a YAML mapping with `title` and `items`"]
    problems = []
    if not isinstance(card.get("title"), str) or not card.get("title"):
        problems.append("title: required (the model's name)")
    if not isinstance(card.get("items"), dict) or not card.get("items"):
        return [*problems, "items: required, a mapping of verification items"]
    measured = list(measured_items(card["items"]))
    if not measured:
        problems.append("items: no item carries `metrics` (a performance item needs them)")
    for path, item in measured:
        problems += item_problems(path, item)
    return problems + leak_problems(card)
