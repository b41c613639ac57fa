"""Shared pytest fixtures: run the real `mbx` CLI in a subprocess, write campaign files, tiny recipes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
# Every trainer the tests start (their subprocesses inherit this) and torch in the test processes use one thread:
# with two test workers on two cores, a second OpenMP thread only spins at barriers while the other worker holds
# the core (a 3-point, 150-step resume test: 209 s with 2 threads beside one busy core, 22 s with 1). Tests of
# the thread defaults themselves pass their own environment (tests/test_launch_node.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# A test session started in the background of a non-interactive shell (`cmd &` in a script, as CI jobs do)
# inherits SIGINT ignored, and so would every `mbx` it starts: Python installs no KeyboardInterrupt handler then,
# and the tests that press Ctrl-C on a campaign saw it run on. Restore what a terminal gives.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# A stand-in for Megatron-LM's pretrain_gpt.py that replays a real log, and the real log it replays by default.
FAKE_MEGATRON = ROOT / "tests" / "fixtures_cmd" / "fake_megatron.py"
MEGATRON_LOG = ROOT / "tests" / "data" / "megatron" / "logs" / "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"

# A recipe small enough that one CPU step takes milliseconds.
TINY_MOE_RECIPE = {
    "model": {
        "vocab_size": 128,
        "hidden_size": 32,
        "num_layers": 2,
        "num_attention_heads": 2,
        "ffn_hidden_size": 64,
        "moe": {"num_experts": 4, "top_k": 2, "ffn_hidden_size": 32},
    },
    "training": {"seq_length": 32, "micro_batch_size": 2, "steps": 12},
    "optimizer": {"warmup_steps": 2},
}


def run_mbx(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600):
    """Run `python -m orchestrator ARGS` like a user would; returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.setdefault("WANDB_SILENT", "true")
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")])
    full_env["COLUMNS"] = "200"
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def store_rows(store: Path, query: str, params: tuple = ()) -> list[tuple]:
    """Rows of a read-only query on a store that another process may be creating: none until the file and the
    queried tables exist (an orchestrator creates the file first, its tables a moment later)."""
    if not store.exists():
        return []
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)
    try:
        return list(db.execute(query, params))
    except sqlite3.OperationalError as err:  # no such table / column yet
        if "no such" in str(err):
            return []
        raise
    finally:
        db.close()


def wait_for(predicate: Callable[[], object], what: str, proc: subprocess.Popen | None = None,
             timeout: float = 300) -> object:
    """Wait until `predicate()` is truthy and return it; fail at once if `proc` ended first. The timeout only
    bounds a hang: a test waits for a state, never for an amount of time."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process ended (exit {proc.returncode}) before {what}")
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.05)
    return value


@pytest.fixture
def mbx():
    return run_mbx


@pytest.fixture
def write_campaign(tmp_path: Path):
    """Write a campaign mapping (or raw text) to a YAML file under tmp_path and return its path."""

    def write(data: dict | str, name: str = "campaign.yaml") -> Path:
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
        return path

    return write


@pytest.fixture
def cache_env(tmp_path: Path) -> dict[str, str]:
    """Environment keeping JIT caches and W&B inside the test's tmp dir."""
    return {"MBX_CACHE_DIR": str(tmp_path / "cache"), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}



@pytest.fixture
def one_thread():
    """One intra-op torch thread for in-process trainer runs that are compared bit for bit: threads split a
    reduction where the tensor shape says, so two runs whose shapes differ (chunked vs not, single vs discrete
    experts) could differ in the last bits (2e-7 seen on AMD EPYC, torch 2.13) for that reason alone."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.hookimpl(tryfirst=True)  # required: xdist's own hook, which turns the marks into `@group` node-id suffixes,
# would otherwise run first (it registers after this conftest) and find no marks: no test would be grouped
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for pytest-xdist's `--dist loadgroup` (the README's test command): every test that uses the real
    Slurm runs on one worker (one cluster per test session), every other file's tests stay together (its
    module-scoped fixtures, e.g. a campaign run once, are built once)."""
    for item in items:
        uses_slurm = "slurm" in getattr(item, "fixturenames", ()) or item.get_closest_marker("slurm")
        item.add_marker(pytest.mark.xdist_group("slurm" if uses_slurm else item.nodeid.split("::")[0]))


def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """On the xdist controller under `--dist loadgroup`: stop, saying why, when a worker's node ids lack their
    `@group` suffix. The scheduler would then spread the Slurm tests over both workers, each starting its own
    cluster whose job ids (and so MASTER_PORTs) collide with the other's (see pyproject's pytest pin)."""
    if node.config.option.dist == "loadgroup" and any("@" not in nodeid for nodeid in ids):
        pytest.exit(f"{node.gateway.id}: pytest-xdist's groups were not applied to the node ids (a pytest/xdist "
                    "mismatch: pyproject.toml pins pytest below 9 for this)", returncode=4)  # fmt: skip
