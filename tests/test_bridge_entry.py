"""trainer/bridge_entry.py without Bridge: run_recipe.py's grammar, the override order, the single-rank defaults.
Bridge itself runs only where it is installed (a GPU node or a NeMo container); its real runs are recorded in
tests/data/bridge-0.6.2/ and replayed by tests/fixtures_cmd/fake_bridge.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

from trainer import bridge_entry


def test_short_options_become_overrides_and_trailing_ones_win():
    options, rest = bridge_entry.parse(["--recipe", "r", "--dataset", "mock", "-mb", "2", "-gb", "16",
                                        "train.micro_batch_size=4", "model.num_layers=4"])  # fmt: skip
    assert bridge_entry.override_list(options, rest) == [
        "train.global_batch_size=16", "train.micro_batch_size=2", "dataset.mock=true",
        "train.micro_batch_size=4", "model.num_layers=4",
    ]  # fmt: skip


def test_an_unknown_option_is_a_usage_error():
    with pytest.raises(SystemExit) as err:
        bridge_entry.parse(["--recipe", "r", "--not-an-option", "1"])
    assert err.value.code == 2


def test_one_rank_alone_gets_an_address_and_a_free_port():
    env: dict[str, str] = {}
    bridge_entry.single_rank_defaults(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("0", "1", "127.0.0.1")
    assert 0 < int(env["MASTER_PORT"]) < 65536
    srun = {"WORLD_SIZE": "16", "RANK": "3"}
    bridge_entry.single_rank_defaults(srun)
    assert srun == {"WORLD_SIZE": "16", "RANK": "3"}  # a launcher's world is left alone


def test_help_runs_without_bridge_installed():
    done = subprocess.run([sys.executable, "-m", "trainer.bridge_entry", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and "run_recipe.py" in done.stdout and "--recipe" in done.stdout
