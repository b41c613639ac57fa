"""Issue 33 #4: the TFLOP/s/GPU a trainer printed against mbx's own Megatron-LM FLOPs count over the same window.

The rule (reports/flops_check.py) alone, then a Megatron-Bridge command campaign whose trainer is
tests/fixtures_cmd/fake_bridge.py replaying a real Bridge 0.6.2 log from an H100 and writing the resolved config
Bridge wrote there: the real log agrees (status, the cell's page and summary.md say so), the same log with the
printed `MODEL_TFLOP/s/GPU` figures scaled by 1.1 does not (status, the index and the cell's page in real headless
Chromium, and summary.md say so). Gates keep judging the printed figure."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_mbx

from orchestrator.run.baseline import summary_from_dict
from reports.flops_check import FlopsCheck, check
from reports.site import CELLS_DIR
from reports.site_data import cell_file
from reports.window import summarize

FAKE = ROOT / "tests" / "fixtures_cmd" / "fake_bridge.py"
BRIDGE = ROOT / "tests" / "data" / "bridge-0.6.2"
LOG = BRIDGE / "h100_sweep" / "d1a49eaa0e_moe-token-dispatcher-type-alltoall.log"
PRINTED = re.compile(r"(GPU utilization: )([0-9.]+)(MODEL_TFLOP/s/GPU)")
DIFFERS = "the two counts disagree (gates and comparisons use the printed figure)"


# ---------------------------------------------------------------- the rule


def test_the_rule_agrees_within_one_percent_either_way() -> None:
    assert FlopsCheck(101.0, 100.0).agrees and FlopsCheck(99.0, 100.0).agrees
    assert not FlopsCheck(101.2, 100.0).agrees and not FlopsCheck(98.8, 100.0).agrees
    assert FlopsCheck(110.0, 100.0).delta == pytest.approx(0.10)
    assert FlopsCheck(110.0, 100.0).note() == (
        f"TFLOP/s/GPU: the trainer printed 110.0, mbx's Megatron-LM count gives 100.0 (Δ +10.0%): {DIFFERS}"
    )
    agreed = FlopsCheck(100.03, 100.0).note()
    assert agreed.endswith("they agree within 1% (Δ +0.03%)") and "differently" not in agreed


def _rows(
    printed: float | None, mbx: float | None, times: tuple[float, ...] = (100.0, 300.0)
) -> list[dict[str, Any]]:
    warm_up = {
        "step": 1,
        "step_time_ms": 5000.0,
        "tflops_per_gpu": 1.0,
    }  # the first step: never in the window
    rows: list[dict[str, Any]] = [warm_up]
    for step, ms in enumerate(times, start=2):
        row: dict[str, Any] = {
            "step": step,
            "step_time_ms": ms,
            "tflops_per_gpu": printed and printed * 100 / ms,
        }
        if mbx is not None:
            row["extra"] = {"mbx_tflops_per_gpu": mbx * 100 / ms}
        rows.append(row)
    return rows


def test_the_window_carries_mbx_count_time_weighted_like_the_printed_one() -> None:
    summary = summarize(_rows(printed=90.0, mbx=80.0))
    # each figure is work / time: time-weighted, 2 × 9000 / 400 ms = 45, not the mean of 90 and 30
    assert summary.tflops_per_gpu == pytest.approx(45.0) and summary.tflops_per_gpu_mbx == pytest.approx(40.0)
    found = check(summary)
    assert found is not None and found.delta == pytest.approx(90 / 80 - 1) and not found.agrees


def test_nothing_is_said_without_both_figures() -> None:
    assert summarize(_rows(printed=90.0, mbx=None)).tflops_per_gpu_mbx is None
    assert check(summarize(_rows(printed=90.0, mbx=None))) is None  # no resolved config: no count of mbx's
    assert check(summarize(_rows(printed=None, mbx=80.0))) is None  # the trainer printed none
    assert check(None) is None
    bad = _rows(printed=90.0, mbx=80.0)
    bad[1]["extra"] = ["not", "a", "mapping"]
    # the row whose `extra` is not a mapping is left out of the weighting
    assert summarize(bad).tflops_per_gpu_mbx == pytest.approx(80.0 * 100 / 300)


def test_a_summary_stored_before_the_field_still_loads() -> None:
    stored = summarize(_rows(printed=90.0, mbx=None)).to_dict()
    del stored["tflops_per_gpu_mbx"]
    loaded = summary_from_dict(stored)
    assert loaded is not None and loaded.tflops_per_gpu_mbx is None and check(loaded) is None


# ---------------------------------------------------------------- a real Bridge log through a command campaign


def _scaled(text: str, factor: float) -> str:
    """The log with every printed `GPU utilization: X MODEL_TFLOP/s/GPU` figure times `factor`."""
    return PRINTED.sub(lambda m: f"{m.group(1)}{float(m.group(2)) * factor:.1f}{m.group(3)}", text)


@pytest.fixture(scope="module")
def bridge_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One campaign, two points: the real log (`real`) and the same log printing 1.1× the TFLOP/s (`scaled`)."""
    tmp = tmp_path_factory.mktemp("flops")
    shutil.copy(FAKE, tmp / "fake_bridge.py")
    shutil.copy(BRIDGE / "bridge-config.yaml", tmp / "bridge-config.yaml")
    text = LOG.read_text(encoding="utf-8")
    (tmp / "real.log").write_text(text, encoding="utf-8")
    scaled = _scaled(text, 1.1)
    assert scaled != text and len(PRINTED.findall(scaled)) == len(PRINTED.findall(text)) >= 30
    (tmp / "scaled.log").write_text(scaled, encoding="utf-8")
    command = ["python3", "./fake_bridge.py", "--replay", "./{params.replay}.log", "--config", "./bridge-config.yaml",
               "--sleep-s", "0", "--recipe", "qwen3_30b_a3b_pretrain_1gpu_h100_bf16_config", "--dataset", "mock",
               "logger.save_config_filepath={run_dir}/bridge-config.yaml", "{params}"]  # fmt: skip
    campaign = {"name": "flops", "trainer": {"kind": "command", "command": command, "style": "megatron-bridge",
                "log_format": "megatron-bridge", "seq_length": 4096, "params": {"replay": "real"}},
                "sweep": {"axes": {"params.replay": ["real", "scaled"]}},
                "gates": {"tflops_per_gpu_min": 95}, "wandb": {"mode": "disabled"}}  # fmt: skip
    (tmp / "flops.yaml").write_text(json.dumps(campaign))
    ws = tmp / "ws"
    done = run_mbx("campaign", "run", str(tmp / "flops.yaml"), "-w", str(ws))
    status = run_mbx("campaign", "status", "flops", "-w", str(ws), "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    cells = {c["params"]["params.replay"]: c for c in json.loads(status.stdout)["cells"]}
    table = run_mbx("campaign", "status", "flops", "-w", str(ws))
    return {"ws": ws, "done": done, "cells": cells, "table": table.stdout, "report": ws / "flops" / "report"}


def test_the_real_log_agrees(bridge_run: dict[str, Any]) -> None:
    real = bridge_run["cells"]["real"]
    assert real["state"] == "completed", real
    summary = real["summary"]
    assert summary["tflops_per_gpu"] == pytest.approx(90.26194471228675)  # what mbx recorded on the H100
    assert summary["tflops_per_gpu_mbx"] == pytest.approx(summary["tflops_per_gpu"], rel=1e-3)
    found = real["flops_check"]
    assert found["agrees"] and abs(found["delta"]) <= 0.001, found
    assert "agree within 1% in 1 cell(s) (Δ -0.01%)" in bridge_run["table"], bridge_run["table"]


def test_a_trainer_that_counts_differently_is_said(bridge_run: dict[str, Any]) -> None:
    scaled = bridge_run["cells"]["scaled"]
    found = scaled["flops_check"]
    assert not found["agrees"] and found["delta"] == pytest.approx(0.10, abs=0.002), found
    # the gates judge the printed figure: 99.3 passes tflops_per_gpu_min 95, where mbx's 90.3 would not
    assert scaled["verdict"] == "pass" and bridge_run["cells"]["real"]["verdict"] == "fail"
    line = f"warning: {scaled['cell_id']}: TFLOP/s/GPU: the trainer printed 99.3, mbx's Megatron-LM "
    assert line in bridge_run["table"] and DIFFERS in bridge_run["table"], bridge_run["table"]
    summary = (bridge_run["report"] / "summary.md").read_text()
    assert f"- `{scaled['cell_id']}`: TFLOP/s/GPU: the trainer printed 99.3, mbx" in summary, summary
    assert "(Δ +10.0%)" in summary and "agree within 1% in 1 cell(s)" in summary


@pytest.mark.skipif(
    not __import__("chromium_cdp").CHROMIUM, reason="chromium not installed (apt-get install -y chromium)"
)
def test_the_pages_say_it_in_chromium(bridge_run: dict[str, Any], tmp_path: Path) -> None:
    from chromium_cdp import Browser

    report, cells = bridge_run["report"], bridge_run["cells"]
    read_index = """(() => { const w = document.getElementById("flops-warning");
      return w && {text: w.textContent, cells: Array.from(w.querySelectorAll("li"), li => li.dataset.cell),
                   shown: w.getBoundingClientRect().height > 0, href: w.querySelector("a").getAttribute("href")}; })()"""
    read_cell = """(() => { const p = document.getElementById("flops-check"),
      rows = Array.from(document.querySelectorAll("#figures-table tr[data-figure^='tflops']"),
                        r => [r.dataset.figure, r.cells[1].textContent]);
      return {text: p.textContent, agrees: p.dataset.agrees, delta: Number(p.dataset.delta), rows: rows,
              warning: p.classList.contains("warning"), shown: p.getBoundingClientRect().height > 0}; })()"""
    with Browser(tmp_path / "profile") as browser:
        index = browser.open(report / "index.html")
        warning = browser.evaluate(index, read_index)
        assert browser.problems(index) == []
        pages = {}
        for name in ("real", "scaled"):
            session = browser.open(report / CELLS_DIR / cell_file(cells[name]["cell_id"]))
            pages[name] = browser.evaluate(session, read_cell)
            assert browser.problems(session) == []
    assert warning["shown"] and warning["cells"] == [cells["scaled"]["cell_id"]], warning
    assert warning["href"] == f"{CELLS_DIR}/{cell_file(cells['scaled']['cell_id'])}"
    assert "does not confirm" in warning["text"] and DIFFERS in " ".join(warning["text"].split())
    real, scaled = pages["real"], pages["scaled"]
    assert real["agrees"] == "true" and abs(real["delta"]) <= 0.001 and not real["warning"] and real["shown"]
    assert "they agree within 1%" in real["text"]
    assert real["rows"] == [["tflops_per_gpu", "90.3"], ["tflops_per_gpu_mbx", "90.3"]], real["rows"]
    assert scaled["agrees"] == "false" and scaled["warning"] and scaled["shown"] and DIFFERS in scaled["text"]
    assert scaled["rows"] == [["tflops_per_gpu", "99.3"], ["tflops_per_gpu_mbx", "90.3"]], scaled["rows"]
