"""`--parallel/-j N` caps the attempts in flight on every backend (its help says "running (or queued on Slurm) at
once"): before, only the local backend read it and a Slurm campaign submitted all its points at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import store_rows

pytest_plugins = ["slurm_cluster"]
pytestmark = pytest.mark.slurm


def test_parallel_one_submits_one_slurm_job_at_a_time(slurm, mbx, tmp_path: Path, cache_env, write_campaign) -> None:
    workspace = tmp_path / "ws"
    file = write_campaign(slurm.campaign("qs-cap", steps=4))
    env = {**cache_env, **slurm.env}
    result = mbx("campaign", "run", str(file), "--launcher", "submitit", "-j", "1", "-w", str(workspace), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = [r[0] for r in store_rows(workspace / "mbx.sqlite", "SELECT job_id FROM attempts WHERE campaign='qs-cap'")]
    assert len(jobs) == 2 and len({job.split("_")[0] for job in jobs}) == 2, f"one job array, not one at a time: {jobs}"
