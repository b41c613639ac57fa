"""Rank-local JIT caches for an external trainer command (launchers/node/jit_env.py): locally, under torchrun-like
ranks and through the Slurm rank entry, each rank's caches lie under <run dir>/jit-cache/rank-<r>/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

from launchers.node import jit_env
from trainer import jit_cache, rundir

PRINT_ENV = "import json, os; print('ENV=' + json.dumps({k: os.environ.get(k) for k in ('TRITON_CACHE_DIR', " \
            "'TORCHINDUCTOR_CACHE_DIR', 'CUDA_CACHE_PATH', 'TORCH_EXTENSIONS_DIR')}))"


def test_a_local_command_campaign_gets_rank_local_caches_recorded(tmp_path: Path, write_campaign, mbx):
    path = write_campaign({"name": "jit", "trainer": {"kind": "command", "command": [sys.executable, "-c", PRINT_ENV]},
                           "launcher": "local", "wandb": {"mode": "disabled"}})  # fmt: skip
    env = {"TRITON_CACHE_DIR": "/shared/nfs/triton"}  # inherited from the login shell: must not be used
    mbx("campaign", "run", str(path), "-w", str(tmp_path / "ws"), "--no-report", env=env)
    (run_dir,) = [p for p in (tmp_path / "ws" / "jit").glob("*/*") if p.is_dir()]
    seen = json.loads(next(line for line in (run_dir / "logs" / "launcher.log").read_text().splitlines()
                           if line.startswith("ENV="))[4:])  # fmt: skip
    root = run_dir / rundir.JIT_CACHE
    assert seen["TRITON_CACHE_DIR"] == str(root / "rank-0" / "triton")
    assert seen["TORCHINDUCTOR_CACHE_DIR"] == str(root / "rank-0" / "inductor")
    assert seen["TORCH_EXTENSIONS_DIR"] == str(root / "torch_extensions")  # one shared build cache
    record = json.loads((run_dir / "logs" / "jit-cache-rank0.json").read_text())
    assert record["replaced"]["TRITON_CACHE_DIR"] == "/shared/nfs/triton"
    launch = json.loads((run_dir / rundir.LAUNCH).read_text())
    assert launch["jit_caches"]["root"] == str(root) and "TRITON_CACHE_DIR" in launch["jit_caches"]["variables"]


def test_each_rank_points_at_its_own_folder(tmp_path: Path):
    """What torchrun's ranks (RANK) and srun's tasks (SLURM_PROCID) get: different folders, records per rank."""
    seen = {}
    for rank_env in ({"RANK": "0"}, {"RANK": "1"}, {"SLURM_PROCID": "3"}):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID")}
        env.update(rank_env, MBX_JIT_CACHE_ROOT=str(tmp_path / "jit"), MBX_RUN_DIR=str(tmp_path),
                   PYTHONPATH=str(ROOT))  # fmt: skip
        out = subprocess.run([sys.executable, "-m", "launchers.node.jit_env", "--", sys.executable, "-c", PRINT_ENV],
                             env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
        seen[next(iter(rank_env.values()))] = json.loads(out.split("ENV=", 1)[1])["TRITON_CACHE_DIR"]
    assert seen == {r: str(tmp_path / "jit" / f"rank-{r}" / "triton") for r in ("0", "1", "3")}
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [f"jit-cache-rank{r}.json" for r in (0, 1, 3)]


def test_without_the_root_nothing_changes():
    environ = {"TRITON_CACHE_DIR": "/kept"}
    assert jit_env.apply(environ, 0) is None and environ == {"TRITON_CACHE_DIR": "/kept"}


def test_the_slurm_rank_entry_sets_them_in_process(tmp_path: Path):
    """launchers/node/rank.py on task 1 of 2: the external command sees rank-1's folders."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    table = tmp_path / "tasks.json"
    table.write_text(json.dumps([{"cell_id": "c", "attempt": 1, "run_dir": str(run_dir),
                                  "argv": [sys.executable, "-c", PRINT_ENV],
                                  "env": {jit_cache.ROOT_VAR: str(run_dir / rundir.JIT_CACHE),
                                          "MBX_RUN_DIR": str(run_dir)}}]))  # fmt: skip
    env = dict(os.environ, SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_JOB_ID="7", SLURM_JOB_NODELIST="n1")
    subprocess.run([sys.executable, str(ROOT / "launchers" / "node" / "rank.py"), "--tasks", str(table)],
                   env=env, check=True, timeout=60)  # fmt: skip
    out = (run_dir / "logs" / "rank-1.log").read_text()
    seen = json.loads(out.split("ENV=", 1)[1])
    assert seen["TRITON_CACHE_DIR"] == str(run_dir / rundir.JIT_CACHE / "rank-1" / "triton")
    assert (run_dir / "logs" / "jit-cache-rank1.json").is_file()
