"""Spike detector and curve gap of reports/numerics.py on planted and smooth curves."""

from __future__ import annotations

import math

import numpy as np

from reports.numerics import curve_gap, find_spikes


def noisy_decay(n: int, seed: int = 0) -> tuple[list[int], list[float]]:
    """A loss-like curve: exponential decay with 2% multiplicative noise."""
    rng = np.random.default_rng(seed)
    steps = list(range(1, n + 1))
    values = [float(2.0 * math.exp(-s / 80) + 1.0) * (1 + 0.02 * rng.standard_normal()) for s in steps]
    return steps, values


def test_planted_spike_after_eval_is_found_and_attributed() -> None:
    steps, values = noisy_decay(120)
    values[60] *= 4.0  # step 61, right after the eval at step 60
    events = {60: "eval at step 60", 100: "checkpoint at step 100"}
    spikes = find_spikes(steps, values, events=events)
    assert [s.step for s in spikes] == [61]
    assert spikes[0].preceded_by == ("eval at step 60",)
    assert spikes[0].score > 6.0
    assert spikes[0].value == values[60]


def test_smooth_noisy_curve_raises_no_alarm() -> None:
    for seed in range(20):
        steps, values = noisy_decay(300, seed)
        assert find_spikes(steps, values, events={50: "eval at step 50"}) == []


def test_flat_history_then_jump_is_a_spike_and_nan_is_skipped() -> None:
    steps = list(range(16))
    values = [1.0] * 12 + [float("nan"), 1.0, 3.0, 1.0]
    spikes = find_spikes(steps, values, events={13: "skipped step 13"})
    assert [(s.step, s.preceded_by) for s in spikes] == [(14, ("skipped step 13",))]
    assert math.isinf(spikes[0].score)


def test_growing_gap_is_found_growing_with_first_step() -> None:
    steps = list(range(1, 101))
    base = [3.0 - 0.01 * s for s in steps]
    other = [b + 0.0005 * s for b, s in zip(base, steps, strict=True)]
    gap = curve_gap(steps, base, steps, other, tolerance_abs=0.0201)
    assert gap.growing and gap.slope_p < 1e-6
    assert gap.first_outside == 41  # 0.0005 * 40 = 0.0200 inside, 0.0205 at step 41 outside
    assert math.isclose(gap.max_abs, 0.05)
    assert gap.common_steps == 100


def test_equal_curves_have_no_gap_and_disjoint_steps_no_verdict() -> None:
    steps, values = noisy_decay(50)
    same = curve_gap(steps, values, steps, list(values))
    assert (same.max_abs, same.first_outside, same.growing) == (0.0, None, False)
    assert math.isnan(same.slope_p)
    none = curve_gap([1, 2], [1.0, 1.0], [3, 4], [1.0, 1.0])
    assert none.common_steps == 0 and math.isnan(none.max_abs)


def test_constant_offset_is_outside_but_not_growing() -> None:
    steps, values = noisy_decay(80, 3)
    shifted = [v + 0.1 for v in values]
    rng = np.random.default_rng(1)
    shifted = [v + 1e-4 * rng.standard_normal() for v in shifted]
    gap = curve_gap(steps, values, steps, shifted, tolerance_rel=0.01)
    assert gap.first_outside == 1
    assert not gap.growing
