"""The campaign lock: one orchestrator per campaign, re-entrant in the thread holding it, and held by a search
across all its rungs (a second orchestrator that tries without pause never gets in between two rungs)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY_MOE_RECIPE

from orchestrator.errors import RunError
from orchestrator.run.lock import CampaignLock
from orchestrator.run.store import Store

TRY_FROM_ANOTHER_PROCESS = (
    "import sys\nfrom orchestrator.run.lock import CampaignLock\nfrom orchestrator.errors import RunError\n"
    "try:\n    CampaignLock(sys.argv[1]).__enter__()\nexcept RunError as err:\n    print(err); sys.exit(7)\n"
)


def _taken_elsewhere(directory: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", TRY_FROM_ANOTHER_PROCESS, str(directory)], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_lock_is_reentrant_in_its_thread_and_refused_elsewhere(tmp_path: Path) -> None:
    where = tmp_path / "camp"
    with CampaignLock(where):
        with CampaignLock(where):  # a rung's run inside a search
            assert _taken_elsewhere(where).returncode == 7
        other = _taken_elsewhere(where)  # the inner exit released nothing
        assert other.returncode == 7 and "already being run by mbx pid" in other.stdout
        refused: list[str] = []

        def from_another_thread() -> None:
            try:
                with CampaignLock(where):
                    refused.append("")
            except RunError as err:
                refused.append(str(err))

        thread = threading.Thread(target=from_another_thread)
        thread.start()
        thread.join()
        assert refused and "already being run" in refused[0]
    assert _taken_elsewhere(where).returncode == 0  # released with the outer exit


def test_a_search_holds_its_lock_between_rungs(write_campaign, tmp_path: Path, cache_env) -> None:
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 8
    path = write_campaign({
        "name": "held", "trainer": {"recipe": recipe}, "collect": {"window": 6}, "wandb": {"mode": "disabled"},
        "sweep": {"axes": {"training.micro_batch_size": [1, 2, 4]},
                  "search": {"method": "halving", "halving": {"steps": [2, 4, 8], "keep": 0.5}}},
    }, name="held.yaml")  # fmt: skip
    workspace = tmp_path / "ws"
    env = dict(os.environ, PYTHONPATH=str(ROOT), **cache_env)
    search = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "campaign", "run", str(path), "-w", str(workspace), "--no-report"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen_held = False
    deadline = time.time() + 600
    while search.poll() is None:  # a hostile second orchestrator: takes the lock whenever it can and keeps it
        assert time.time() < deadline, "the search did not finish in 10 minutes"
        if not (workspace / "mbx.sqlite").exists():  # the search opens the store only once it holds the lock
            time.sleep(0.01)
            continue
        try:
            with CampaignLock(workspace / "held"):  # between two rungs, or after the search released it at its end
                search.wait(timeout=600)  # held until the search ends: its next rung, if any, is refused
        except RunError:
            seen_held = True
            time.sleep(0.005)
    out, err = search.communicate()
    if not seen_held:
        pytest.fail("the search never held its lock while it was watched:\n" + out + err)
    assert search.returncode == 0, out + err  # never refused between rungs
    with Store(workspace) as store:
        rungs = {row["rung"] for row in store.trials("held")}
    assert rungs == {0, 1, 2}, rungs
