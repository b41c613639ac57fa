"""The run store can be trusted (issue 21): `mbx store rebuild` never swaps the store under a running campaign and
no campaign starts mid-rebuild; a damaged campaign.json is rebuilt (from the old store, else from the run dirs
alone) with what is missing said; the additive tables survive a rebuild; an attempt that failed with ENOSPC while
no orchestrator watched it is run again by `mbx campaign resume`."""

from __future__ import annotations

import copy
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from conftest import MEGATRON_LOG, ROOT, TINY_MOE_RECIPE, store_rows, wait_for
from test_faults import orchestrator, output_of

from orchestrator.run.retry import decide
from orchestrator.spec.campaign import Retry


def status(mbx, workspace: Path, name: str) -> list[dict]:
    result = mbx("campaign", "status", name, "--workspace", str(workspace), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)["cells"]


def figures(cells: list[dict]) -> list[tuple]:
    return [(c["cell_id"], c["state"], c["attempt"], c["verdict"], c["summary"]) for c in cells]


def tiny(name: str, **extra: object) -> dict:
    """A quickstart-like campaign of the bundled trainer: 2 points × 8 CPU steps, the default window."""
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 8
    return {"name": name, "trainer": {"recipe": recipe}, "sweep": {"axes": {"model.moe.top_k": [1, 2]}},
            "launchers": {"local": {"parallel": 2}}, "wandb": {"mode": "disabled"}, **extra}  # fmt: skip


def test_damaged_campaign_json_is_rebuilt_from_the_old_store_then_from_run_dirs(mbx, write_campaign, cache_env,
                                                                               tmp_path):  # fmt: skip
    workspace = tmp_path / "ws"
    run = mbx("campaign", "run", str(write_campaign(tiny("quick"))), "--workspace", str(workspace), "--no-report",
              env=cache_env)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    before = status(mbx, workspace, "quick")
    estimates = store_rows(workspace / "mbx.sqlite", "SELECT point_id, feasible FROM estimates ORDER BY ordinal")
    assert len(before) == 2 and all(c["state"] == "completed" for c in before) and len(estimates) == 2
    manifest = workspace / "quick" / "campaign.json"

    manifest.write_text('{"name": "quick", "spec": {"trainer"')  # cut short
    rebuilt = mbx("store", "rebuild", "--workspace", str(workspace))
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert "campaign.json: damaged; the campaign and its 2 cell(s) are taken from the old run store" in rebuilt.stderr
    assert "carried over from the old store: 2 estimates" in rebuilt.stdout
    assert status(mbx, workspace, "quick") == before
    assert store_rows(workspace / "mbx.sqlite", "SELECT point_id, feasible FROM estimates ORDER BY ordinal") == estimates
    assert json.loads(manifest.read_text())["name"] == "quick", "campaign.json is written again"
    assert len(list(manifest.parent.glob("campaign.json.damaged-*"))) == 1, "the damaged file is kept aside"

    for path in workspace.glob("mbx.sqlite*"):  # the store lost too: the run dirs are all there is
        path.unlink()
    manifest.write_text("not json")
    alone = mbx("store", "rebuild", "--workspace", str(workspace))
    assert alone.returncode == 0, alone.stdout + alone.stderr
    said = " ".join(alone.stderr.split())
    assert "2 cell(s) rebuilt from their run directories; not recoverable from them:" in said
    assert "gates and window" in said and "mbx campaign run <its file>" in said
    after = status(mbx, workspace, "quick")
    assert figures(after) == figures(before), "same completed cells, attempts and figures (default window)"
    assert [c["label"] for c in after] == [c["label"] for c in before], "labels from the rebuilt spec's expansion"


def test_rebuild_refuses_a_running_campaign_and_no_campaign_starts_mid_rebuild(mbx, write_campaign, tmp_path):
    """A campaign runs with a damaged campaign.json (the old rebuild skipped it and swapped the store under it):
    refused, naming it, the store untouched. Then, paused inside a rebuild, a new campaign is refused until the
    rebuild ends (before, it ran into the store the rebuild was about to replace)."""
    workspace = tmp_path / "ws"
    slow = {"name": "slow", "trainer": {"kind": "command", "command": [sys.executable, str(ROOT / "tests" /
            "fixtures_cmd" / "fake_megatron.py"), "--replay", str(MEGATRON_LOG), "--sleep-s", "0.3"]},
            "wandb": {"mode": "disabled"}}  # fmt: skip
    fast = {**slow, "name": "fast", "trainer": {**slow["trainer"], "command": slow["trainer"]["command"][:-1] +
            ["0"]}}  # fmt: skip
    with orchestrator(tmp_path, "campaign", "run", str(write_campaign(slow, "slow.yaml")), "--workspace",
                      str(workspace), "--no-report") as (proc, _):  # fmt: skip
        wait_for(lambda: store_rows(workspace / "mbx.sqlite", "SELECT 1 FROM attempts WHERE state='running'"),
                 "the attempt to run", proc)  # fmt: skip
        (workspace / "slow" / "campaign.json").write_text("{")
        inode = (workspace / "mbx.sqlite").stat().st_ino
        refused = mbx("store", "rebuild", "--workspace", str(workspace))
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "campaign 'slow' is being run by mbx pid" in refused.stderr and "Traceback" not in refused.stderr
        assert (workspace / "mbx.sqlite").stat().st_ino == inode and not list(workspace.glob("mbx.sqlite.*-*"))
        proc.wait(timeout=120)
    assert proc.returncode == 0

    with orchestrator(tmp_path, "store", "rebuild", "--workspace", str(workspace),
                      pause=["orchestrator.run.store:Store.restore_campaign"]) as (proc, folder):  # fmt: skip
        try:
            wait_for(lambda: (folder / "paused-0").exists(), "the rebuild to start", proc)
        except AssertionError:
            raise AssertionError(output_of(folder)) from None
        started = mbx("campaign", "run", str(write_campaign(fast, "fast.yaml")), "--workspace", str(workspace),
                      "--no-report")  # fmt: skip
        (folder / "go-0").touch()
        proc.wait(timeout=120)
        assert proc.returncode == 0, output_of(folder)
    assert started.returncode == 1, started.stdout + started.stderr
    assert "is locked by mbx store rebuild pid" in started.stderr and "Traceback" not in started.stderr
    assert not (workspace / "fast").exists() or not list((workspace / "fast").glob("*/1")), "nothing ran"
    assert [c["state"] for c in status(mbx, workspace, "slow")] == ["completed"]


ENOSPC_ONCE = r"""
import os, sys, time
from pathlib import Path
log, first, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
lines = Path(log).read_text().splitlines(keepends=True)
if first.exists():  # a later attempt: the whole run
    sys.stdout.write("".join(lines)); sys.exit(0)
first.touch()
stop = next(i for i, line in enumerate(lines) if "iteration        4/" in line)
sys.stdout.write("".join(lines[:stop])); sys.stdout.flush()
while not go.exists():
    time.sleep(0.05)
with open("/dev/full", "w") as full:  # the kernel's own ENOSPC, as a full disk gives it
    full.write("checkpoint" * 1000); full.flush()
"""


def test_resume_reruns_an_attempt_that_failed_with_enospc_while_no_orchestrator_watched(mbx, write_campaign,
                                                                                          tmp_path):  # fmt: skip
    """retry.max_attempts is 1 (no retry within a run): the orchestrator is gone (SIGKILL), the attempt then fails
    writing with ENOSPC; `resume` adopts it, classifies it infra and runs it again, which completes."""
    script = tmp_path / "enospc_once.py"
    script.write_text(ENOSPC_ONCE)
    go = tmp_path / "go"
    path = write_campaign({"name": "disk", "trainer": {"kind": "command", "command": [
        sys.executable, str(script), str(MEGATRON_LOG), str(tmp_path / "first"), str(go)]},
        "wandb": {"mode": "disabled"}})  # fmt: skip
    workspace = tmp_path / "ws"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen([sys.executable, "-m", "orchestrator", "campaign", "run", str(path), "--workspace",
                            str(workspace), "--no-report"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_for(lambda: (tmp_path / "first").exists() and store_rows(
            workspace / "mbx.sqlite", "SELECT 1 FROM attempts WHERE state='running' AND job_id IS NOT NULL"),
            "the first attempt to run", run)  # fmt: skip
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
    go.touch()
    resumed = mbx("campaign", "resume", "disk", "--workspace", str(workspace), "--no-report")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "adopted running attempt 1" in resumed.stdout and "resume runs it again" in resumed.stdout
    db = sqlite3.connect(workspace / "mbx.sqlite")
    rows = db.execute("SELECT attempt, state, failure_class, reason FROM attempts ORDER BY attempt").fetchall()
    assert [r[:3] for r in rows] == [(1, "failed", "infra"), (2, "completed", None)], rows
    assert "No space left on device" in rows[0][3]


def test_decide_gives_an_adopted_retryable_failure_one_more_attempt():
    policy = Retry()  # max_attempts 1: no retry within a run
    assert not decide(policy, "failed", "infra", 1, 3, None).retry
    assert decide(policy, "failed", "infra", 1, 3, None, adopted=True).retry
    assert not decide(policy, "failed", "oom", 1, 3, None, adopted=True).retry, "not a retryable class"
    assert not decide(Retry(max_attempts=2), "failed", "infra", 2, 3, 3, adopted=True).retry, "no progress"
