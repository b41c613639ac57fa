"""The quickstart campaign through submitit on a real one-node Slurm: one job array, 2 ranks per point, hostile values."""

from __future__ import annotations

import json
import re
import shlex
import sqlite3
from pathlib import Path

import pytest
import submitit

pytest_plugins = ["slurm_cluster"]
pytestmark = pytest.mark.slurm

HOSTILE = 'it\'s "q" $(touch CANARY1) `touch CANARY2`; touch CANARY3 | x & y\nline2 \\ * ?'


def _attempts(workspace: Path, campaign: str) -> list[tuple]:
    db = sqlite3.connect(workspace / "mbx.sqlite")
    rows = db.execute(
        "SELECT cell_id, attempt, state, reason, job_id, run_dir FROM attempts WHERE campaign=? ORDER BY cell_id, attempt",
        (campaign,),
    ).fetchall()
    db.close()
    return [(*row[:5], str(workspace / row[5])) for row in rows]  # run dirs are stored relative


def _batch_files(workspace: Path, campaign: str) -> dict[str, Path]:
    return {p.parent.name: p.parent for p in (workspace / campaign / "slurm").glob("*/tasks.json")}


def test_quickstart_through_submitit(
    slurm, mbx, tmp_path: Path, cache_env: dict[str, str], write_campaign
) -> None:
    workspace = tmp_path / "ws"
    env_cache = (
        tmp_path / f"env cache {HOSTILE}"
    )  # reaches the trainer as an env.values entry (XDG_CACHE_HOME: the JIT cache root is <it>/mbx)
    recipe_cache = (
        tmp_path / f"recipe cache {HOSTILE}"
    )  # reaches it as a swept string field (recipe cache_dir)
    data = slurm.campaign(
        "qs-submitit",
        sweep={"zip": [{"model.moe.top_k": [1, 2], "cache_dir": [None, str(recipe_cache)]}]},
        env={
            "values": {"XDG_CACHE_HOME": str(env_cache), "HOSTILE_VALUE": HOSTILE},
            "pass": ["TEST_SECRET"],
        },
    )
    file = write_campaign(data)
    own = {k: v for k, v in cache_env.items() if k != "MBX_CACHE_DIR"}  # the campaign's XDG_CACHE_HOME decides
    env = {**own, **slurm.env, "TEST_SECRET": "s3cr3t-value-never-in-files",
           "TRITON_CACHE_DIR": str(tmp_path / "login-node-triton")}  # fmt: skip

    # 1. dry run: prints the scripts and task tables, submits and writes nothing
    dry = mbx("campaign", "run", str(file), "--dry-run", "--launcher", "submitit", "--workspace", str(workspace),
              env=env)  # fmt: skip
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "#SBATCH --array=0-1%2" in dry.stdout, dry.stdout + dry.stderr
    assert slurm.run("squeue", "-h", "-n", "mbx-qs-submitit-1n2g").stdout.strip() == ""
    assert not _batch_files(workspace, "qs-submitit"), "a dry run writes no job script"

    # 2. the real submission of the same campaign
    result = mbx(
        "campaign", "run", str(file), "--launcher", "submitit", "--workspace", str(workspace), env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS 2/2 completed" in result.stdout

    rows = _attempts(workspace, "qs-submitit")
    assert [(r[1], r[2]) for r in rows] == [(1, "completed")] * 2, rows  # the dry run recorded no attempt
    real = rows
    array_ids = {r[4].split("_")[0] for r in real}
    assert len(array_ids) == 1 and sorted(r[4].split("_")[1] for r in real) == ["0", "1"], (
        "one array, two tasks"
    )

    # the script submitit wrote and Slurm ran is byte for byte the one the dry run printed, task table included
    batches = _batch_files(workspace, "qs-submitit")
    assert len(batches) == 1
    (folder,) = batches.values()
    array_id = real[0][4].split("_")[0]
    submitted = (folder / f"{array_id}_submission.sh").read_text()
    assert f"# ---- {folder / '%j_submission.sh'}\n{submitted.rstrip()}\n" in dry.stdout
    # a submitit folder: each task's pickled CommandFunction is the srun line the script names, its logs there
    line = next(x for x in submitted.splitlines() if x.startswith("# each task runs"))
    for _, _, _, _, job_id, _ in real:
        job = submitit.SlurmJob(folder=folder, job_id=job_id)
        assert shlex.join(job.submission().function.command) == line.split(": ", 1)[1]
        assert job.submission().function.command[:3] == ["srun", "--unbuffered", "--kill-on-bad-exit=1"]
        assert "The following command is sent" in job.paths.stdout.read_text()
        assert job.paths.result_pickle.exists() and job.result() is not None, "submitit recorded the outcome"
    assert f"# ---- {folder / 'tasks.json'} (read by the ranks; no shell sees it)\n" in dry.stdout
    assert (folder / "tasks.json").read_text().rstrip() in dry.stdout

    for _, _, _, _, job_id, run_dir in real:
        run = Path(run_dir)
        for name in ("recipe.yaml", "launch.json", "metrics.jsonl", "status.json", "env.json", "exit.json"):
            assert (run / name).exists(), f"{run}/{name} missing"
        status = json.loads((run / "status.json").read_text())
        assert status["state"] == "completed" and status["world_size"] == 2
        assert (run / "logs" / "rank-0.log").exists() and (run / "logs" / "rank-1.log").exists()
        launch = json.loads((run / "launch.json").read_text())
        node = json.loads((run / "node.json").read_text())
        assert launch["job_id"] == job_id and launch["launcher"] == "submitit"
        assert node["job"]["slurm"]["SLURM_ARRAY_JOB_ID"] == job_id.split("_")[0]
        assert node["job"]["master_addr"] == "localhost" and node["job"]["world_size"] == "2"
        assert node["hostname"] and node["torch"]
        assert launch["env_passed_by_name"] == ["TEST_SECRET"]

    # hostile values arrived verbatim (the trainer's JIT cache record shows the root it used), nothing executed
    roots = set()
    for _, _, _, _, _, run_dir in real:
        record = json.loads((Path(run_dir) / "logs" / "jit-cache-rank0.json").read_text())
        roots.add(record["root"])
        assert record["replaced"] == {}, "no JIT cache variable is inherited from the submitting shell"
        rank1 = json.loads((Path(run_dir) / "logs" / "jit-cache-rank1.json").read_text())
        assert rank1["rank"] == 1 and rank1["rank_dir"].endswith("rank-1")
    assert roots == {str(env_cache / "mbx"), str(recipe_cache)}
    assert not [p for p in tmp_path.rglob("CANARY*")] and not list(Path.cwd().glob("CANARY*"))
    for path in workspace.rglob("*"):
        if path.is_file() and path.suffix != ".sqlite":
            assert "s3cr3t-value-never-in-files" not in path.read_text(errors="replace"), path

    # collected, gated and reported like a local run
    assert (workspace / "qs-submitit" / "report" / "index.html").exists()
    status = mbx("campaign", "status", "qs-submitit", "--workspace", str(workspace), "--json", env=env)
    payload = json.loads(status.stdout)["cells"]
    assert {c["state"] for c in payload} == {"completed"} and {c["verdict"] for c in payload} == {"pass"}
    assert re.search(r"\d+_[01]", real[0][4])
