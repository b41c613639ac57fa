"""`mbx freeze`: the winner by its verdicts (a tie is said and broken by memory), why every other point lost,
and the files it writes (a reproducing campaign that validates, FROZEN.md in a PR's shape), on a real CPU campaign."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import TINY_MOE_RECIPE

from orchestrator.judge.best import choose
from orchestrator.judge.compare import METRICS, Point, Repeat

STEP_TIME = next(m for m in METRICS if m.name == "step_time")
MEMORY = next(m for m in METRICS if m.name == "peak_alloc")


def _point(name: str, times: list[float], memory: float) -> Point:
    repeats = [
        Repeat(f"{name}-r{i}", {"step_time_ms": t, "peak_alloc_gib": memory}, [], {})
        for i, t in enumerate(times)
    ]
    return Point("c", name, name, {}, [r.cell_id for r in repeats], repeats)


def test_a_clear_winner_is_named_with_its_confidence() -> None:
    fast, slow = (
        _point("fast", [100.0, 100.4, 99.8, 100.1], 30),
        _point("slow", [110.0, 110.3, 109.9, 110.2], 20),
    )
    choice = choose([slow, fast], STEP_TIME, 0.01, MEMORY)
    assert choice.winner is fast and not choice.is_tie
    assert "runner-up slow differs by +10" in choice.how and "DIFFERENT" in choice.how and "p=" in choice.how


def test_points_not_different_are_a_tie_broken_by_memory() -> None:
    a, b = _point("a", [100.0, 100.4, 99.8, 100.1], 30), _point("b", [100.2, 99.9, 100.3, 100.0], 20)
    choice = choose([a, b], STEP_TIME, 0.01, MEMORY)
    assert choice.winner is b and {p.point_id for p in choice.tied} == {"a", "b"}
    assert "TIE: 2 points are not DIFFERENT" in choice.how and "lower peak allocated" in choice.how


def test_freeze_a_real_campaign(mbx, write_campaign, tmp_path: Path, cache_env) -> None:
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 13
    path = write_campaign({
        "name": "tofreeze", "trainer": {"recipe": recipe}, "collect": {"window": 10}, "wandb": {"mode": "disabled"},
        "launchers": {"local": {"parallel": 1}},  # one cell at a time: the points must not slow each other
        # one thread: OpenMP's spinning barriers on a loaded 2-core machine made 20-ms steps take 1.3 s at random
        "env": {"values": {"OMP_NUM_THREADS": "1"}},
        "sweep": {"repeats": 3, "cells": [
            {"training.seq_length": 32, "precision": "bf16"},
            # 8× the tokens of an 8× wider model: ~7× the step time (280 vs 37 ms per step, `python -m trainer`
            # by hand with OMP_NUM_THREADS=1 on a loaded 2-core machine), far beyond its noise
            {"training.seq_length": 256, "model.hidden_size": 256, "model.ffn_hidden_size": 512,
             "model.num_attention_heads": 4, "precision": "bf16"},
            {"training.seq_length": 32, "precision": "fp8"},  # refused by the trainer on a CPU: failed
        ]},
    })  # fmt: skip
    workspace = tmp_path / "ws"
    run = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report", env=cache_env)
    assert run.returncode == 1, run.stdout + run.stderr  # the fp8 point failed

    out = tmp_path / "frozen"
    frozen = mbx("freeze", "tofreeze", "--by", "step_time", "--workspace", str(workspace), "--out", str(out))
    assert frozen.returncode == 0, frozen.stdout + frozen.stderr
    assert "seq_length=32, precision=bf16" in frozen.stdout.splitlines()[0]
    assert "(slower): slower than the winner in step time" in frozen.stdout and "DIFFERENT" in frozen.stdout
    assert "(failed)" in frozen.stdout and "fp8" in frozen.stdout

    assert yaml.safe_load((out / "recipe.yaml").read_text())["training"]["seq_length"] == 32
    reproduce = yaml.safe_load((out / "campaign.yaml").read_text())
    assert reproduce["name"] == "tofreeze-frozen" and reproduce["sweep"] == {"repeats": 3}
    assert reproduce["gates"]["step_time_ms_max"] > 0 and reproduce["gates"]["tflops_per_gpu_min"] > 0
    assert mbx("campaign", "validate", str(out / "campaign.yaml")).returncode == 0
    text = (out / "FROZEN.md").read_text()
    for section in (
        "## Frozen configuration",
        "## Performance result",
        "## Validation",
        "## Rejected experiments",
    ):
        assert section in text
    assert "3 repeat(s)" in text and "95% CI" in text and "skipped=0, NaN=0" in text
    record = json.loads((out / "frozen.json").read_text())
    assert {r["kind"] for r in record["rejected"]} == {"slower", "failed"}

    # --frozen-repeats and --margin (a percent) shape the frozen campaign; freeze's old --repeats still works
    args = ("freeze", "tofreeze", "--by", "step_time", "-w", str(workspace))
    shaped = mbx(*args, "-o", str(tmp_path / "shaped"), "--frozen-repeats", "2", "--margin", "4")
    assert shaped.returncode == 0, shaped.stderr
    wide = yaml.safe_load((tmp_path / "shaped" / "campaign.yaml").read_text())
    measured = re.search(r"step_time_ms_max = [\d.]+ \(measured ([\d.]+), margin 4%: given \(4%\)\)",
                         (tmp_path / "shaped" / "FROZEN.md").read_text())  # fmt: skip
    assert wide["sweep"] == {"repeats": 2} and measured is not None
    assert wide["gates"]["step_time_ms_max"] == pytest.approx(float(measured.group(1)) * 1.04, rel=1e-3)
    old = mbx(*args, "-o", str(tmp_path / "old"), "--repeats", "5")
    assert old.returncode == 0 and "note: freeze --repeats is now --frozen-repeats" in old.stderr, old.stderr
    assert yaml.safe_load((tmp_path / "old" / "campaign.yaml").read_text())["sweep"] == {"repeats": 5}

    refused = mbx(
        "freeze", "tofreeze", "--point", "seq_length=32, precision=fp8", "--workspace", str(workspace)
    )
    # a point that failed cannot be frozen: exit 1 naming the check; --allow-failed cannot help a point that
    # has no completed repeat
    assert refused.returncode == 1 and "cannot be frozen: it failed a check (failed)" in refused.stdout
    assert refused.stdout.startswith("FAIL tofreeze: --point ") and "no completed repeat" in refused.stdout
    assert "Traceback" not in refused.stderr
