"""Slurm faults on a real cluster that the other Slurm tests do not cover: sacct failing on every call."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from conftest import ROOT

pytest_plugins = ["slurm_cluster"]
pytestmark = pytest.mark.slurm


def test_campaign_survives_a_failing_sacct(slurm, tmp_path: Path, cache_env, write_campaign) -> None:
    """A stub `sacct` first on PATH fails every call (the accounting database is down): squeue and the run dirs
    still answer, the point completes once, no traceback."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    sacct = stubs / "sacct"
    sacct.write_text("#!/bin/sh\necho \"sacct: error: Problem talking to the database: Connection refused\" >&2\n"
                     f"echo called >> {tmp_path / 'sacct.calls'}\nexit 1\n")  # fmt: skip
    sacct.chmod(0o755)
    workspace = tmp_path / "ws"
    file = write_campaign(slurm.campaign("qs-sacct", sweep={"axes": {"model.moe.top_k": [2]}}))
    env = {**os.environ, **cache_env, **slurm.env, "PYTHONPATH": str(ROOT),
           "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    with slurm.campaign_in_background(file, workspace, env) as proc:
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "PASS 1/1 completed" in out, out
    assert (tmp_path / "sacct.calls").exists(), "the stub was asked"
    db = sqlite3.connect(workspace / "mbx.sqlite")
    attempts = db.execute("SELECT cell_id, attempt, state FROM attempts WHERE campaign='qs-sacct'").fetchall()
    db.close()
    assert [(n, s) for _, n, s in attempts] == [(1, "completed")], attempts
