"""A p-value that underflowed to 0 is written "<1e-300", never "p=0" (seen on the real Bridge ÷ bundled compare)."""

from __future__ import annotations

from reports.compare import Samples, compare_samples
from reports.pvalue import p_claim, p_text


def test_the_figure_and_the_claim():
    assert (p_text(0.27), p_text(1.7e-19), p_text(0.0)) == ("0.27", "1.7e-19", "<1e-300")
    assert (p_claim(0.27), p_claim(0.0), p_claim(0.0, "TOST p")) == ("p=0.27", "p<1e-300", "TOST p<1e-300")
    # a p that could not be computed is no claim at all (review: NaN printed as "<1e-300", the strongest one)
    assert (p_text(float("nan")), p_claim(float("nan")), p_text(float("inf"))) == ("n/a", "p n/a", "n/a")


def test_an_underflowed_difference_says_less_than_not_zero():
    """One run a side (the real case: Bridge 807 ms a step vs the bundled trainer's 285 ms, 10 window steps each):
    the z-test's p underflows to 0.0 in scipy."""
    bridge = [807.0 * (1 + 0.01 * ((i % 5) - 2)) for i in range(10)]
    bundled = [285.0 * (1 + 0.001 * ((i % 3) - 1)) for i in range(10)]
    a = Samples(repeats=[807.0], steps=[bridge])
    b = Samples(repeats=[285.0], steps=[bundled])
    decision = compare_samples(a, b)
    assert decision.decision == "different" and decision.p_value == 0.0, decision
    assert "p<1e-300" in decision.reason and "p=0 " not in decision.reason + " "
