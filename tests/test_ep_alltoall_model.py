"""benchmarks/ep_alltoall_model.py: the paper model of the all-to-all per step and what chunking hides."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import ep_alltoall_model as model  # noqa: E402


def test_ep2_over_nvlink_is_the_issues_77_ms():
    """Issue 24: 8 layers × 8 micro-batches × 4 exchanges × ~134 MB to the peer ≈ 77 ms at 450 GB/s."""
    f = model.step_figures(2, 1, 450.0, None, 520.0)
    assert f["a2a_ms"] == pytest.approx(76.4, abs=0.5) and f["exposed_ms"] == pytest.approx(f["a2a_ms"])


def test_chunks_hide_the_all_to_all_behind_the_gemms_until_the_link_is_the_bottleneck():
    assert model.pipeline_ms(2.0, 2.0, 1.0, 1) == pytest.approx(5.0)  # one chunk: d, g, c in series
    assert model.pipeline_ms(0.4, 0.4, 4.0, 4) == pytest.approx(0.1 + 4.0 + 0.1)  # only the ends stay exposed
    assert model.pipeline_ms(4.0, 4.0, 1.0, 4) >= 8.0  # communication-bound: the dispatcher stream is the floor
    nvlink = model.step_figures(8, 4, 370.0, None, 520.0)
    ib = model.step_figures(16, 4, 370.0, 42.5, 520.0)
    assert nvlink["exposed_ms"] < 0.3 * nvlink["a2a_ms"]
    assert ib["a2a_ms"] > 4 * nvlink["a2a_ms"] and ib["exposed_ms"] > 0.5 * ib["a2a_ms"]


def test_the_table_has_a_row_per_fabric():
    text = model.table([8, 16], 4, 370.0, 42.5, 520.0)
    assert text.count("\n| 16 |") == 2 and "| 8 | NVLink |" in text
