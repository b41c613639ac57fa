"""Energy per step: NVML `energy_j` rows from the bundled trainer on a GPU (a clean no-op on CPU), and Megatron's
`energy per GPU (J/iter/GPU)` log field into the same row key, through the parser and a real command campaign."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from conftest import FAKE_MEGATRON, MEGATRON_LOG, ROOT, TINY_MOE_RECIPE

from reports.parsers import make_parser, parse_log
from trainer.energy import StepEnergy, nvml_handle

THROUGHPUT = re.compile(r"(throughput per GPU \(TFLOP/s/GPU\): [0-9.]+ \|)")


def energy_log(tmp_path: Path) -> tuple[Path, list[float]]:
    """The real Megatron log with `--log-energy` fields added to every iteration line (as Megatron prints them)."""
    lines, joules = [], []
    for line in MEGATRON_LOG.read_text().splitlines(keepends=True):
        if " iteration " in line and THROUGHPUT.search(line):
            joules.append(1000.0 + 10.5 * len(joules))
            extra = f" energy per GPU (J/iter/GPU): {joules[-1]:.1f} | power per GPU (W/GPU): 687.3 |"
            line = THROUGHPUT.sub(lambda m, extra=extra: m.group(1) + extra, line, count=1)
        lines.append(line)
    path = tmp_path / "energy.log"
    path.write_text("".join(lines))
    return path, joules


def test_megatron_energy_lines_parse_to_energy_j(tmp_path):
    path, joules = energy_log(tmp_path)
    assert len(joules) >= 10
    whole = parse_log(path)  # the bulk (fast) path
    assert [r["energy_j"] for r in whole] == joules
    assert all(r["extra"]["power per GPU (W/GPU)"] == 687.3 for r in whole)
    assert all("energy per GPU (J/iter/GPU)" not in r["extra"] for r in whole)
    parser = make_parser()  # line by line, as a growing log is followed
    rows = []
    for line in path.read_text().splitlines(keepends=True):
        rows += parser.feed(line)
    rows += parser.close()
    assert [r["energy_j"] for r in rows] == joules
    assert all("energy_j" not in r for r in parse_log(MEGATRON_LOG))  # no --log-energy: no figure


def test_command_campaign_records_energy_j(tmp_path, mbx, write_campaign):
    log, joules = energy_log(tmp_path)
    command = [sys.executable, str(FAKE_MEGATRON), "--replay", str(log), "--sleep-s", "0"]
    path = write_campaign({"name": "energy", "trainer": {"kind": "command", "command": command, "steps": 15},
                           "wandb": {"mode": "disabled"}})  # fmt: skip
    result = mbx("campaign", "run", str(path), "-w", str(tmp_path / "ws"), "--no-report")
    assert result.returncode == 0, result.stdout + result.stderr
    (metrics,) = (tmp_path / "ws" / "energy").glob("*/*/metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["energy_j"] for r in rows] == joules


def test_cpu_trainer_rows_have_no_energy(tmp_path):
    assert nvml_handle(torch.device("cpu")) is None
    meter = StepEnergy(torch.device("cpu"))
    meter.start()
    assert not meter.active and meter.stop() == {}
    import yaml

    recipe = {**TINY_MOE_RECIPE, "training": {**TINY_MOE_RECIPE["training"], "steps": 2}}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    import subprocess

    done = subprocess.run([sys.executable, "-m", "trainer", "--recipe", str(tmp_path / "recipe.yaml"),
                           "--out", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("energy_j" not in r for r in rows)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_energy_per_step(tmp_path):
    """On a GPU: every step has energy_j, and the implied power is between idle and the board limit."""
    import subprocess

    import yaml

    recipe = {**TINY_MOE_RECIPE, "device": "cuda",
              "training": {**TINY_MOE_RECIPE["training"], "steps": 20, "micro_batch_size": 64}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    done = subprocess.run([sys.executable, "-m", "trainer", "--recipe", str(tmp_path / "recipe.yaml"),
                           "--out", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("energy_j" in r for r in rows), rows[0]
    total_j = sum(r["energy_j"] for r in rows[1:])
    total_s = sum(r["step_time_ms"] for r in rows[1:]) / 1000.0
    assert 20.0 < total_j / total_s < 1500.0  # watts: above idle, below any board limit
