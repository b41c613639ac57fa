"""reports/compare.py on synthetic samples with known answers: A/A never DIFFERENT beyond the false-alarm
budget, large effects DIFFERENT, tiny real effects below the practical threshold, one-repeat and exact rules,
SAME only by equivalence (TOST), the levels of several looks, repeat suggestions and the diagnosis
signatures."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from reports import compare as stats
from reports.compare import Samples, compare_samples


def side(rng: np.random.Generator, n: int, mean: float = 100.0, between: float = 0.005, within: float = 0.01,
         steps: int = 10) -> Samples:  # fmt: skip
    """n repeats: each run's level varies by `between` (relative), its steps by `within` around that level."""
    runs = []
    for _ in range(n):
        level = mean * (1 + rng.normal(0, between))
        runs.append(list(level * (1 + rng.normal(0, within, steps))))
    return Samples([float(np.mean(r)) for r in runs], runs)


def test_aa_false_alarms_within_budget_at_fixed_seed() -> None:
    rng = np.random.default_rng(1234)
    decisions = [compare_samples(side(rng, 4), side(rng, 4)).decision for _ in range(400)]
    assert decisions.count(stats.DIFFERENT) / len(decisions) <= 0.02
    assert decisions.count(stats.SAME) / len(decisions) > 0.1  # SAME (by equivalence) is reachable


@pytest.mark.parametrize("n", [2, 3, 5])
def test_large_effect_is_different_and_bad(n: int) -> None:
    rng = np.random.default_rng(n)
    a, b = side(rng, n), side(rng, n, mean=115.0)
    d = compare_samples(a, b)
    assert d.decision == stats.DIFFERENT and d.p_value is not None and d.p_value <= stats.ALPHA
    assert d.ci_low < d.change < d.ci_high and 0.10 < d.change < 0.20
    assert stats.is_bad(d, higher_is_worse=True) and not stats.is_bad(d, higher_is_worse=False)


def test_tiny_real_effect_is_below_practical() -> None:
    rng = np.random.default_rng(5)
    a = side(rng, 6, between=0.0002, within=0.001)
    b = side(rng, 6, mean=100.3, between=0.0002, within=0.001)
    d = compare_samples(a, b)
    assert d.decision == stats.BELOW_PRACTICAL and abs(d.change - 0.003) < 0.001
    assert not stats.is_bad(d, higher_is_worse=True)
    assert compare_samples(a, b, min_effect=0.001).decision == stats.DIFFERENT


def test_same_when_the_ci_is_inside_the_practical_band() -> None:
    rng = np.random.default_rng(9)
    d = compare_samples(side(rng, 5, between=0.001), side(rng, 5, between=0.001))
    assert d.decision == stats.SAME and -0.01 < d.ci_low and d.ci_high < 0.01


def test_noisy_small_effect_is_unknown_with_a_repeat_suggestion() -> None:
    a = Samples([100.0, 101.5, 99.0])
    b = Samples([101.5, 103.0, 101.0])
    d = compare_samples(a, b)
    assert d.decision == stats.UNKNOWN and d.p_value is not None and stats.ALPHA < d.p_value
    assert d.equivalence_p is not None and d.equivalence_p > stats.EQUIVALENCE_ALPHA
    assert d.more_repeats is not None and d.more_repeats >= 1


def test_exact_metrics_without_spread() -> None:
    assert compare_samples(Samples([40.9] * 3), Samples([40.9] * 3)).decision == stats.SAME
    worse = compare_samples(Samples([40.0] * 3), Samples([42.0] * 3))
    assert (
        worse.decision == stats.DIFFERENT
        and worse.change == pytest.approx(0.05)
        and worse.test.startswith("exact")
    )
    assert compare_samples(Samples([40.0] * 2), Samples([40.02] * 2)).decision == stats.BELOW_PRACTICAL
    # one repeat each, constant per-step samples (a peak): still exact
    flat = compare_samples(Samples([34.9], [[34.9] * 10]), Samples([40.9], [[40.9] * 10]))
    assert flat.decision == stats.DIFFERENT and flat.change == pytest.approx(40.9 / 34.9 - 1)


def test_single_repeat_never_same_and_different_only_when_large() -> None:
    rng = np.random.default_rng(3)
    big = compare_samples(side(rng, 1), side(rng, 1, mean=120.0))
    assert big.decision == stats.DIFFERENT and big.test.startswith("one repeat")
    for _ in range(50):
        d = compare_samples(side(rng, 1, between=0), side(rng, 1, mean=102.0, between=0))
        assert d.decision == stats.UNKNOWN and d.more_repeats == 2
    same = compare_samples(side(rng, 1, between=0), side(rng, 2, between=0))
    assert same.decision == stats.UNKNOWN
    no_steps = compare_samples(Samples([12.15]), Samples([12.16]))
    assert no_steps.decision == stats.UNKNOWN and no_steps.ci_low is None


def test_degenerate_inputs_are_unknown() -> None:
    assert compare_samples(Samples([]), Samples([1.0, 2.0])).decision == stats.UNKNOWN
    assert compare_samples(Samples([1.0, 2.0]), Samples([float("nan")])).decision == stats.UNKNOWN
    d = compare_samples(Samples([0.0, 1.0]), Samples([1.0, 2.0]))
    assert d.decision == stats.UNKNOWN and "non-positive" in d.reason


def test_levels_of_several_looks_are_split_bonferroni() -> None:
    one, four = stats.Levels.for_looks(1), stats.Levels.for_looks(4)
    assert (one.alpha, one.equivalence_alpha, one.confidence) == (stats.ALPHA, 0.025, pytest.approx(0.95))
    assert four.alpha == pytest.approx(0.0025) and four.equivalence_alpha == pytest.approx(0.00625)
    assert four.confidence == pytest.approx(0.9875)
    a, b = Samples([100.0, 100.4, 99.8, 100.1]), Samples([100.2, 100.3, 99.9, 100.2])
    assert compare_samples(a, b, looks=4).ci_high > compare_samples(a, b).ci_high  # a wider CI per look


def test_repeats_needed() -> None:
    assert stats.repeats_needed(0.005, 0.03, 0.01) in (2, 3)
    assert stats.repeats_needed(0.05, 0.0101, 0.01) is None
    assert stats.repeats_needed(0.002, 0.0, 0.01) == 2


def test_diagnosis_signatures() -> None:
    def d(decision: str, change: float) -> stats.Decision:
        return stats.Decision(decision, change, change, change, 0.001, 0.5, "t", 4, 4, 1.0, 1.0 + change, "")

    recompute = stats.diagnose(
        {"t": d(stats.DIFFERENT, 0.18), "m": d(stats.DIFFERENT, -0.15)}, "t", ("m",), "l"
    )
    assert len(recompute) == 1 and "recompute (or offload) newly on?" in recompute[0]
    buffer = stats.diagnose({"t": d(stats.SAME, 0.001), "m": d(stats.DIFFERENT, 0.08)}, "t", ("m",), "l")
    assert buffer == ["memory↑ +8.0% with time flat: an extra buffer?"]
    assert (
        stats.diagnose({"t": d(stats.UNKNOWN, 0.02), "m": d(stats.DIFFERENT, 0.08)}, "t", ("m",), "l") == []
    )
    loss = stats.diagnose({"l": d(stats.DIFFERENT, 0.03)}, "t", ("m",), "l")
    assert loss and "numerics changed" in loss[0]


def test_decision_json_has_no_nan() -> None:
    d = compare_samples(Samples([1.0, 1.1]), Samples([1.0, 1.1]))
    text = json.dumps(d.to_dict(), allow_nan=False)
    assert '"decision"' in text and all(v is None or not isinstance(v, float) or math.isfinite(v)
                                        for v in d.to_dict().values())  # fmt: skip


# ---- curves: loss divergence and grad-norm spikes ----------------------------------------------------------
def curve(
    steps: int, loss: callable, grad: callable, rng: np.random.Generator, noise: float = 0.002
) -> list[dict]:
    return [{"step": s, "loss": loss(s) * (1 + rng.normal(0, noise)), "grad_norm": grad(s) * (1 + rng.normal(0, 0.02))}
            for s in range(1, steps + 1)]  # fmt: skip


def test_loss_divergence_names_the_step_the_curves_part() -> None:
    rng = np.random.default_rng(7)
    base = lambda s: 10.0 * 0.99**s  # noqa: E731
    worse = lambda s: base(s) * (1 + 0.004 * max(0, s - 30))  # noqa: E731 - parts from step 30, growing
    flat = lambda s: 1.0  # noqa: E731
    a = [curve(60, base, flat, rng) for _ in range(3)]
    b = [curve(60, worse, flat, rng) for _ in range(3)]
    line = stats.loss_divergence(a, b, 0.01)
    assert line is not None and line.startswith("loss diverges from step ")
    step = int(line.split("from step ")[1].split(":")[0])
    assert 31 <= step <= 36  # 1% above the repeats' spread a few steps after 30
    assert "growing" in line
    same = [curve(60, base, flat, rng) for _ in range(3)]
    assert stats.loss_divergence(a, same, 0.01) is None  # A/A: inside the repeats' own spread


def test_grad_norm_spikes_only_one_side_has() -> None:
    rng = np.random.default_rng(3)
    loss = lambda s: 5.0  # noqa: E731
    shared = lambda s: 8.0 if s == 20 else 1.0  # noqa: E731 - a spike of the data: on both sides
    new = lambda s: 9.0 if s in (20, 41) else 1.0  # noqa: E731
    a = [curve(60, loss, shared, rng) for _ in range(2)]
    b = [curve(60, loss, new, rng) for _ in range(2)]
    b[1][39]["skipped"] = True  # step 40 skipped just before the spike at 41
    lines = stats.grad_norm_spikes(a, b)
    assert len(lines) == 1 and lines[0].startswith(
        "grad-norm spikes in B, none in A at those steps: step 41 (2/2"
    )
    assert "after skipped step at step 40" in lines[0] and "step 20" not in lines[0]
    assert stats.grad_norm_spikes(a, a) == []


def test_time_down_memory_up_signature() -> None:
    def d(change: float) -> stats.Decision:
        return stats.Decision(
            stats.DIFFERENT, change, change, change, 0.001, None, "t", 4, 4, 1.0, 1 + change, ""
        )

    lines = stats.diagnose({"t": d(-0.15), "m": d(0.17), "l": d(0.0)}, "t", ("m",), "l")
    assert lines[0].startswith("time↓ -15.0% with memory↑ +17.0%: recompute (or offload) newly off")
    assert not any("newly on" in line for line in lines)
