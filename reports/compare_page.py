"""The comparison page of `mbx compare --html DIR`: one static HTML file (no script, no network) from the
plain data of a comparison (orchestrator/judge/compare.py's `to_json`), user text escaped by Jinja's autoescape."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reports.pvalue import p_text
from reports.site_format import atomic_write

TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATE = "compare.html.j2"
PAGE = "index.html"
BAR_WIDTH = 160  # px of the CI bar; its scale is ±max(|CI|, 2 × practical threshold), clipped at ±100%
STYLE = {"DIFFERENT (worse)": "worse", "DIFFERENT (better)": "better", "UNKNOWN": "unknown"}


def _pct(value: Any, digits: int = 2) -> str:
    return "–" if not isinstance(value, (int, float)) or not math.isfinite(value) else f"{value:+.{digits}%}"


def _value(value: Any) -> str:
    return "–" if not isinstance(value, (int, float)) or not math.isfinite(value) else f"{value:.5g}"


def ci_bar(metric: dict[str, Any], min_effect: float) -> dict[str, Any] | None:
    """Pixel positions of the practical band, the CI and the change on a symmetric scale (None: no change)."""
    change, low, high = metric.get("change"), metric.get("ci_low"), metric.get("ci_high")
    if not isinstance(change, (int, float)) or not math.isfinite(change):
        return None
    ends = [abs(x) for x in (change, low, high) if isinstance(x, (int, float)) and math.isfinite(x)]
    scale = min(max([2 * min_effect, 0.001, *ends]) * 1.1, 1.0)
    half = BAR_WIDTH / 2

    def x(value: float) -> float:
        return round(half + max(-1.0, min(1.0, value / scale)) * half, 1)

    bar = {"width": BAR_WIDTH, "mid": half, "band_x": x(-min_effect), "band_w": round(x(min_effect) - x(-min_effect), 1),
           "x": x(change), "scale": f"±{scale:.1%}"}  # fmt: skip
    if (
        isinstance(low, (int, float))
        and isinstance(high, (int, float))
        and math.isfinite(low)
        and math.isfinite(high)
    ):
        bar.update(x1=x(low), x2=x(high))
    return bar


def _ci(m: dict[str, Any]) -> str:
    """`[low, high]`, or a deterministic figure's floor (`exact, floor ±1.26%`), as the CLI shows it."""
    from reports.compare import FLOOR_TEST  # numpy/scipy: only when a page is written

    low, high = m.get("ci_low"), m.get("ci_high")
    if not isinstance(low, (int, float)) or not isinstance(high, (int, float)):
        return "–"
    if str(m.get("test", "")).startswith(FLOOR_TEST):
        return f"exact, floor ±{(high - low) / 2:.2%}"
    return f"[{_pct(low)}, {_pct(high)}]"


def _metric_rows(pair: dict[str, Any], labels: dict[str, str], min_effect: float) -> list[dict[str, Any]]:
    rows = []
    for name, m in pair["metrics"].items():
        word = pair.get("verdicts", {}).get(name, str(m.get("decision", "")).upper())
        p = m.get("p_value")
        rows.append({"name": name, "label": labels.get(name, name), "a": _value(m.get("mean_a")),
                     "b": _value(m.get("mean_b")), "change": _pct(m.get("change")), "ci": _ci(m),
                     "p": "–" if p is None else p_text(p), "decision": m.get("decision", ""), "word": word,
                     "style": STYLE.get(word, "same"), "reason": m.get("reason", ""), "n": f"{m.get('n_a')} / {m.get('n_b')}",
                     "bar": ci_bar(m, min_effect)})  # fmt: skip
    return rows


def _side(side: dict[str, Any]) -> str:
    return f"{side['campaign']}/{side['point_id']} ({side['label']}, {len(side['repeats'])} rep)"


def page_context(data: dict[str, Any], generated_at: str | None = None) -> dict[str, Any]:
    """What the template shows, from `to_json`'s data: per pair its metric rows and its lines."""
    labels = data.get("metric_labels", {})
    min_effect = float(data.get("min_effect") or 0.0)
    pairs = []
    for i, pair in enumerate(data["pairs"]):
        pairs.append({"index": i, "a": _side(pair["a"]), "b": _side(pair["b"]),
                      "rows": _metric_rows(pair, labels, min_effect),
                      "fingerprint_diff": pair.get("fingerprint_diff", []),
                      "fingerprint_line": pair.get("fingerprint_line"), "notes": pair.get("notes", []),
                      "config_lines": pair.get("config_lines", []), "config_diff": pair.get("config_diff", []),
                      "diagnosis": pair.get("diagnosis", []), "advice": pair.get("advice", []),
                      "worse": pair.get("worse", []), "unknown": pair.get("unknown", [])})  # fmt: skip
    word = {0: "SAME", 1: "WORSE", 3: "UNKNOWN"}.get(data.get("exit_code", -1), "?")
    when = generated_at or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"a": data["a"], "b": data["b"], "min_effect": f"{min_effect:.1%}", "overall": word,
            "exit_code": data.get("exit_code"), "pairs": pairs, "unmatched": data.get("unmatched", []),
            "not_compared": data.get("not_compared", []),
            "generated_at": when, "min_effects": data.get("min_effects", {}),
            "rule": data.get("rule", "DIFFERENT at p ≤ 0.01 and at least the threshold"),
            "ci_header": f"{float(data.get('confidence') or 0.95) * 100:.4g}% CI"}  # fmt: skip


def _environment() -> Any:
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)  # fmt: skip


def render_compare_page(data: dict[str, Any], generated_at: str | None = None) -> str:
    """The page as HTML text."""
    return _environment().get_template(TEMPLATE).render(**page_context(data, generated_at))


def write_compare_page(data: dict[str, Any], out_dir: Path, generated_at: str | None = None) -> Path:
    """Write DIR/index.html atomically (a temporary file renamed over it) and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / PAGE
    atomic_write(target, render_compare_page(data, generated_at))
    return target
