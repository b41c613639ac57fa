"""Packing on a real one-node Slurm: many points in one allocation, one srun step each, back to back — a crash,
a hang past its limit and a cancelled point stop only themselves; the campaign's results look as one job per
point would leave them (submitit and NeMo-Run)."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import store_rows
from slurm_cluster import interrupt

from launchers.backends.submitit_slurm import SubmititLauncher, SubmititSettings
from launchers.base import JobState, LaunchSpec, Resources, Submitted
from launchers.profile import SlurmProfile
from launchers.slurm.pack import allocation_of
from trainer import rundir

pytest_plugins = ["slurm_cluster"]

ROOT = Path(__file__).resolve().parent.parent
WRITE_STATUS = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import os; from trainer import rundir; "
                "os.environ['RANK'] == '0' and rundir.write_status(os.environ['MBX_RUN_DIR'], "
                "{'state': 'completed', 'world_size': int(os.environ['WORLD_SIZE'])}, rundir.TRAINER)")  # fmt: skip
CRASH_RANK1 = "import os, sys, time; os.environ['RANK'] == '1' and sys.exit(3); time.sleep(300)"
HANG = "import time; time.sleep(300)"
UP_THEN_HANG = "import os, time; print('up', os.environ['RANK'], flush=True); time.sleep(300)"


def _spec(workspace: Path, cell: str, code: str) -> LaunchSpec:
    return LaunchSpec(campaign="packed", cell_id=cell, attempt=1, run_dir=workspace / "packed" / cell / "1",
                      resources=Resources(1, 2, 0.15), module=None, args=[sys.executable, "-c", code])  # fmt: skip


def _wait(launcher: SubmititLauncher, jobs: list[Submitted], timeout: float) -> dict[str, JobState]:
    deadline, states = time.time() + timeout, {}
    while time.time() < deadline:
        states = launcher.poll(jobs)
        if all(state.finished for state in states.values()):
            break
        time.sleep(1)
    return states


@pytest.mark.slurm
def test_one_allocation_isolates_its_points(slurm, tmp_path: Path) -> None:
    """Six points of two ranks in one allocation: ok, rank 1 crashes, ok, hangs past its limit, is cancelled
    while running, ok. Each ends as one job per point would; the crash and the hang stop nobody else."""
    workspace = tmp_path / "ws"
    profile = SlurmProfile.model_validate({"cluster": {"gpus": False, "python": sys.executable}})
    launcher = SubmititLauncher(SubmititSettings(pack=8, poll_interval_s=0.5, poll_max_interval_s=1), workspace,
                                profile)  # fmt: skip
    launcher.settle_s = 1.0
    cells = [("ok-a", WRITE_STATUS), ("crash", CRASH_RANK1), ("ok-b", WRITE_STATUS), ("hang", HANG),
             ("victim", UP_THEN_HANG), ("ok-c", WRITE_STATUS)]  # fmt: skip
    specs = [_spec(workspace, cell, code) for cell, code in cells]
    (rendered,) = launcher.render(specs)
    assert (
        "#SBATCH --array" not in rendered.describe()  # one allocation: submitit submits a plain job
        and "packed: 6 point(s) in 1 allocation" in rendered.notes[0]
    )
    assert "--time=" in rendered.describe(), "the allocation asks for every point's limit, back to back"
    jobs = {job.cell_id: job for job in launcher.submit(specs)}
    assert len({allocation_of(job.job_id) for job in jobs.values()}) == 1, "one allocation"
    assert [job.job_id.rsplit("#", 1)[1] for job in jobs.values()] == [str(i) for i in range(6)]

    victim = jobs["victim"]
    deadline = time.time() + 120
    while launcher.poll([victim])[victim.job_id] != JobState.RUNNING and time.time() < deadline:
        time.sleep(0.5)
    assert rundir.read_status(specs[3].run_dir)["state"] == "timeout", "points run one after the other"
    rank_logs = [specs[4].run_dir / "logs" / f"rank-{r}.log" for r in (0, 1)]
    while not all(log.exists() and "up" in log.read_text() for log in rank_logs) and time.time() < deadline:
        time.sleep(0.2)  # until both of the victim's ranks are up
    launcher.cancel([victim])
    states = _wait(launcher, list(jobs.values()), 180)
    expected = {"ok-a": "completed", "crash": "failed", "ok-b": "completed", "hang": "timeout",
                "victim": "cancelled", "ok-c": "completed"}  # fmt: skip
    assert {cell: states[job.job_id].value for cell, job in jobs.items()} == expected, states

    for spec in specs:  # the run dir of each point, as one job per point leaves it
        status = rundir.read_status(spec.run_dir)
        assert status is not None and not rundir.status_problems(status), status
        assert (spec.run_dir / "logs" / "rank-0.log").exists() and (spec.run_dir / "node.json").exists()
        assert rundir.read_exit(spec.run_dir) is not None, spec.cell_id
    crash = rundir.read_status(specs[1].run_dir)
    assert "another rank failed and srun stopped the others" in crash["reason"], crash
    assert "time limit of 9 s reached" in rundir.read_status(specs[3].run_dir)["reason"]
    assert "cancelled in Slurm" in rundir.read_status(specs[4].run_dir)["reason"]
    node = json.loads((specs[5].run_dir / "node.json").read_text())
    assert node["job"]["world_size"] == "2"
    ports = {json.loads((s.run_dir / "node.json").read_text())["job"]["master_port"] for s in specs}
    assert len(ports) == 1, "each point rendezvouses where one job of this id would (one point at a time)"


@pytest.mark.slurm
def test_cancel_every_point_cancels_the_allocation(slurm, tmp_path: Path) -> None:
    """Cancelling all points of a pack scancels its allocation: the running one and the waiting ones end cancelled."""
    workspace = tmp_path / "ws"
    profile = SlurmProfile.model_validate({"cluster": {"gpus": False, "python": sys.executable}})
    launcher = SubmititLauncher(SubmititSettings(pack=3, poll_interval_s=0.5, poll_max_interval_s=1), workspace,
                                profile)  # fmt: skip
    launcher.settle_s = 1.0
    specs = [_spec(workspace, f"sleep-{i}", HANG) for i in range(3)]
    jobs = launcher.submit(specs)
    deadline = time.time() + 120
    while launcher.poll(jobs)[jobs[0].job_id] != JobState.RUNNING and time.time() < deadline:
        time.sleep(0.5)
    assert launcher.poll(jobs)[jobs[1].job_id] == JobState.PENDING, "a waiting point is pending"
    launcher.cancel(jobs)
    states = _wait(launcher, jobs, 120)
    assert {state.value for state in states.values()} == {"cancelled"}, states
    assert "the pack ended before this point started" in rundir.read_status(specs[2].run_dir)["reason"]


@pytest.mark.slurm
def test_requeued_allocation_reruns_only_unfinished_points(slurm, tmp_path: Path) -> None:
    """A pack requeued by Slurm while its second point runs: the first is not run again, the second reruns with
    its interrupted outputs archived (requeued/0, which the engine records as the next attempt), the third starts
    fresh with nothing archived."""
    workspace = tmp_path / "ws"
    profile = SlurmProfile.model_validate({"cluster": {"gpus": False, "python": sys.executable}})
    settings = SubmititSettings(pack=3, requeue=True, poll_interval_s=0.5, poll_max_interval_s=1)
    launcher = SubmititLauncher(settings, workspace, profile)
    launcher.settle_s = 1.0
    slow = "import time; time.sleep(6); " + WRITE_STATUS
    specs = [_spec(workspace, cell, code) for cell, code in (("first", WRITE_STATUS), ("slow", slow),
                                                              ("third", WRITE_STATUS))]  # fmt: skip
    specs = [LaunchSpec(**{**vars(s), "resources": Resources(1, 2, 0.5)}) for s in specs]
    jobs = launcher.submit(specs)
    allocation = allocation_of(jobs[0].job_id)
    deadline = time.time() + 120
    while not (specs[1].run_dir / "node.json").exists() and time.time() < deadline:
        time.sleep(0.2)
    slurm.run("scontrol", "requeue", allocation)
    requeued_at = time.time()
    while time.time() < deadline + 60:  # Slurm holds a requeued job back (BeginTime +2 min): release it
        state = slurm.run("squeue", "-h", "-j", allocation, "-o", "%T", check=False).stdout.strip()
        node = slurm.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
        if state == "PENDING" and node == "idle" and time.time() - requeued_at > 2.5:
            slurm.run("scontrol", "update", f"JobId={allocation}", "StartTime=now")
            break
        time.sleep(0.5)
    states = _wait(launcher, jobs, 180)
    assert {state.value for state in states.values()} == {"completed"}, states
    assert (specs[1].run_dir / "requeued" / "0" / "logs" / "rank-0.log").exists(), (
        "the interrupted run, archived"
    )
    assert not (specs[0].run_dir / "requeued").exists() and not (specs[2].run_dir / "requeued").exists()
    log = next((workspace / "packed" / "slurm").glob("*/*_0_log.out")).read_text()
    assert "first attempt 1: ended in an earlier run of this allocation, skipped" in log, log


def _attempts(workspace: Path, campaign: str) -> list[tuple]:
    """The campaign's attempts (run dirs, stored relative to the workspace, made absolute); none while another
    process is still creating the store's tables."""
    rows = store_rows(workspace / "mbx.sqlite", "SELECT cell_id, attempt, state, job_id, run_dir FROM attempts "
                      "WHERE campaign=? ORDER BY cell_id, attempt", (campaign,))  # fmt: skip
    return [(*row[:4], str(workspace / row[4])) for row in rows]


def _interrupt_once_packed(slurm, file: Path, workspace: Path, env: dict[str, str], name: str,
                           running: bool = False) -> list[tuple]:  # fmt: skip
    """`mbx campaign run` in the background, Ctrl-C'ed once both points have their `<allocation>#<pos>` ids (and,
    with `running`, the first point has started; without, the partition is down until then, so the pack cannot
    finish first); the attempts as the store had them."""
    held = contextlib.nullcontext() if running else slurm.partition_down()
    with held, slurm.campaign_in_background(file, workspace, env) as proc:
        deadline, rows = time.time() + 120, []
        while time.time() < deadline:
            if (workspace / "mbx.sqlite").exists():
                rows = _attempts(workspace, name)
                submitted = len(rows) == 2 and all(r[3] and "#" in r[3] for r in rows)
                if submitted and (not running or (Path(rows[0][4]) / "node.json").exists()):
                    break
            time.sleep(0.5)
        assert len(rows) == 2 and (not running or (Path(rows[0][4]) / "node.json").exists()), rows
        assert interrupt(proc) == 130
    return rows


def _job_infos(workspace: Path, campaign: str) -> dict[str, dict]:
    db = sqlite3.connect(workspace / "mbx.sqlite")
    rows = db.execute("SELECT cell_id, job_info_json FROM attempts WHERE campaign=?", (campaign,)).fetchall()
    db.close()
    return {cell: json.loads(info) for cell, info in rows}


def _check_like_one_job_per_point(mbx, workspace: Path, name: str, env: dict[str, str]) -> list[tuple]:
    """Two completed points of one allocation, each run dir as one job per point leaves it, both points on the
    same rank-local JIT cache dirs (the second found the first one's caches warm), gated and reported."""
    rows = _attempts(workspace, name)
    assert [(r[1], r[2]) for r in rows] == [(1, "completed")] * 2, rows
    assert len({allocation_of(r[3]) for r in rows}) == 1 and sorted(r[3][-2:] for r in rows) == ["#0", "#1"]
    dirs = set()
    for _, _, _, job_id, run_dir in rows:
        run = Path(run_dir)
        for item in ("recipe.yaml", "launch.json", "metrics.jsonl", "status.json", "env.json", "exit.json",
                     "node.json", "logs/rank-0.log", "logs/rank-1.log"):  # fmt: skip
            assert (run / item).exists(), f"{run}/{item} missing"
        assert json.loads((run / "launch.json").read_text())["job_id"] == job_id
        dirs.add(json.loads((run / "logs" / "jit-cache-rank0.json").read_text())["rank_dir"])
    assert len(dirs) == 1, "both points used the same rank-local JIT cache dirs"
    status = mbx("campaign", "status", name, "--workspace", str(workspace), "--json", env=env)
    assert {c["verdict"] for c in json.loads(status.stdout)["cells"]} == {"pass"}
    assert (workspace / name / "report" / "index.html").exists()
    return rows


@pytest.mark.slurm
def test_campaign_packed_through_nemo_run(slurm, mbx, tmp_path: Path, cache_env, write_campaign) -> None:
    """The quickstart's two points in one NeMo-Run task (one allocation) through `mbx campaign run`: collected,
    gated and reported as one job per point."""
    pytest.importorskip("nemo_run", reason="NeMo-Run is optional: pip install 'mbx[nemo]'")
    workspace = tmp_path / "ws"
    data = slurm.campaign("qs-pack-nemo")
    data["launchers"]["nemo-run"]["pack"] = 2
    file = write_campaign(data)
    env = {**cache_env, **slurm.env}
    dry = mbx("campaign", "run", str(file), "--dry-run", "--launcher", "nemo-run", "--workspace", str(workspace),
              env=env)  # fmt: skip
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert dry.stdout.count("Generated by NeMo Run") == 1, "one task, one sbatch script for the pack"
    assert "launchers/node/pack.py" in dry.stdout and "pack.json" in dry.stdout and "--overlap" in dry.stdout
    result = mbx(
        "campaign", "run", str(file), "--launcher", "nemo-run", "--workspace", str(workspace), env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS 2/2 completed" in result.stdout
    _check_like_one_job_per_point(mbx, workspace, "qs-pack-nemo", env)


@pytest.mark.slurm
def test_interrupted_campaign_resumes_packed_points(
    slurm, mbx, tmp_path: Path, cache_env, write_campaign
) -> None:
    """submitit, pack 2: Ctrl-C after submission leaves the pack running; `mbx campaign resume` adopts both points
    by their `<allocation>#<pos>` ids from the store, submits nothing new and collects them as one job per point
    would be collected."""
    workspace = tmp_path / "ws"
    data = slurm.campaign("qs-pack-resume", steps=30)
    data["launchers"]["submitit"]["pack"] = 2
    file = write_campaign(data)
    env = {**cache_env, **slurm.env}
    rows = _interrupt_once_packed(slurm, file, workspace, env, "qs-pack-resume")
    result = mbx("campaign", "resume", "qs-pack-resume", "--workspace", str(workspace), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS 2/2 completed" in result.stdout, result.stdout
    after = _check_like_one_job_per_point(mbx, workspace, "qs-pack-resume", env)
    assert [r[3] for r in after] == [r[3] for r in rows], "adopted, not submitted again"


@pytest.mark.slurm
def test_a_rebuilt_store_still_cancels_packed_points(
    slurm, mbx, tmp_path: Path, cache_env, write_campaign
) -> None:
    """submitit, pack 2: Ctrl-C while the pack runs, the store deleted and rebuilt from the run dirs, then
    `mbx campaign cancel`: each point is stopped through its pack (launch.json keeps the launcher's job info),
    the allocation leaves the queue. Before, the rebuilt store knew only `<allocation>#<pos>`, an id scancel
    refuses, and the pack ran on."""
    workspace = tmp_path / "ws"
    data = slurm.campaign("qs-pack-rebuilt", steps=100000)
    data["launchers"]["submitit"]["pack"] = 2
    file = write_campaign(data)
    env = {**cache_env, **slurm.env}
    rows = _interrupt_once_packed(slurm, file, workspace, env, "qs-pack-rebuilt", running=True)
    infos = _job_infos(workspace, "qs-pack-rebuilt")
    (workspace / "mbx.sqlite").unlink()
    rebuilt = mbx("store", "rebuild", "--workspace", str(workspace), env=env)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert _job_infos(workspace, "qs-pack-rebuilt") == infos, "the launcher's job info comes back whole"
    assert [r[2] for r in _attempts(workspace, "qs-pack-rebuilt")] == ["running", "running"]

    cancel = mbx("campaign", "cancel", "qs-pack-rebuilt", "--workspace", str(workspace), env=env)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    allocation = allocation_of(rows[0][3])
    deadline = time.time() + 120
    while time.time() < deadline:
        queued = slurm.run("squeue", "-h", "-j", allocation, "-o", "%T", check=False).stdout.strip()
        if not queued or "COMPLET" in queued:
            break
        time.sleep(0.5)
    assert not queued or "COMPLET" in queued, f"allocation {allocation} still {queued} after the cancel"
    assert all(Path(info["pack_cancel"]).exists() for info in infos.values())


@pytest.mark.slurm
def test_packed_point_past_its_limit_is_retried(
    slurm, mbx, tmp_path: Path, cache_env, write_campaign
) -> None:
    """A packed point stopped by its own time limit is a timeout like one job per point, and `retry.on: [timeout]`
    gives it a second attempt, in an allocation of its own."""
    workspace = tmp_path / "ws"
    data = slurm.campaign("qs-pack-retry", steps=100000, sweep={"axes": {"model.moe.top_k": [2]}})
    data["resources"]["time_limit_min"] = 0.2
    data["retry"] = {"max_attempts": 2, "on": ["timeout"]}
    data["launchers"]["submitit"]["pack"] = 4
    result = mbx("campaign", "run", str(write_campaign(data)), "--launcher", "submitit", "--workspace",
                 str(workspace), env={**cache_env, **slurm.env})  # fmt: skip
    assert result.returncode != 0 and "timeout" in result.stdout, result.stdout + result.stderr
    rows = _attempts(workspace, "qs-pack-retry")
    assert [(r[1], r[2]) for r in rows] == [(1, "timeout"), (2, "timeout")], rows
    assert all("#0" in r[3] for r in rows) and len({allocation_of(r[3]) for r in rows}) == 2
    status = rundir.read_status(Path(rows[0][4]))
    assert "time limit of 12 s reached" in status["reason"], status


# ---- without Slurm: the rendering and the node runner ----------------------------------------------------
def test_render_cuts_a_group_into_packs(tmp_path: Path) -> None:
    """Seven points, pack 3: one array of three allocations (3, 3, 1); the pack file indexes the task table in
    order; the allocation asks for its points' limits back to back; pack 1 keeps one array task per point."""
    profile = SlurmProfile.model_validate({"cluster": {"gpus": False, "python": "python3"}})
    specs = [_spec(tmp_path, f"p{i}", WRITE_STATUS) for i in range(7)]
    packed = SubmititLauncher(SubmititSettings(pack=3), tmp_path, profile)
    (item,) = packed.render(specs)
    files = {path.name: text for path, text in item.files.items()}
    table, pack = json.loads(files["tasks.json"]), json.loads(files["pack.json"])
    assert [len(a) for a in pack["allocations"]] == [3, 3, 1]
    points = [p for allocation in pack["allocations"] for p in allocation]
    assert [table[p["index"]]["cell_id"] for p in points] == [f"p{i}" for i in range(7)]
    assert all(p["argv"][0] == "srun" and "--kill-on-bad-exit=1" in p["argv"] for p in points)
    script = next(iter(item.scripts.values()))  # the job script submitit will write (<id>_submission.sh)
    assert "#SBATCH --array=0-2%3" in script and "launchers/node/pack.py --pack" in script
    assert "#SBATCH --time=4" in script, "3 × (9 s + 60 s grace) + 30 s margin → 4 min"
    (single,) = SubmititLauncher(SubmititSettings(), tmp_path, profile).render(specs)
    assert "#SBATCH --array=0-6%7" in single.describe() and "pack.json" not in single.describe()


def test_pack_settings_are_checked(mbx, tmp_path: Path, write_campaign) -> None:
    """`pack` is validated with the campaign: at least 1, and NeMo-Run packs only on Slurm (exit 2, key path)."""
    from slurm_cluster import quickstart_campaign

    data = quickstart_campaign("qs-pack-bad")
    data["launchers"]["submitit"]["pack"] = 0
    out = mbx("campaign", "validate", str(write_campaign(data)))
    assert out.returncode == 2 and "launchers.submitit.pack" in out.stdout + out.stderr, (
        out.stdout + out.stderr
    )
    assert "Traceback" not in out.stdout + out.stderr
    data["launchers"] = {"nemo-run": {"executor": "local", "pack": 4}}
    out = mbx("campaign", "validate", str(write_campaign(data, "local.yaml")))
    assert out.returncode == 2 and "pack > 1 needs executor 'slurm'" in out.stdout + out.stderr, out.stdout


def _runner(pack: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "launchers" / "node" / "pack.py"), "--pack", str(pack)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})  # fmt: skip


def test_node_runner_isolates_points_and_resumes(tmp_path: Path) -> None:
    """The runner alone (plain commands for steps): a crash and a point past its deadline stop only themselves, a
    cancelled point never starts; run again as a requeued allocation it skips every point that ended and tells a
    point that never started that there is nothing to archive (SLURM_RESTART_COUNT=0)."""
    seen = tmp_path / "seen"
    echo = f"import os; open({str(seen)!r}, 'a').write(os.environ.get('MBX_P', '') + ':' + os.environ.get('SLURM_RESTART_COUNT', '-') + '\\n')"
    steps = [("ok", echo + "; os.environ['MBX_P'] = 'ok'", None), ("crash", "raise SystemExit(3)", None),
             ("hang", "import time; time.sleep(60)", 1.0), ("cancelled", echo, None), ("last", echo, None)]  # fmt: skip
    points = []
    for pos, (name, code, deadline) in enumerate(steps):
        points.append({"pos": pos, "index": pos, "cell_id": name, "attempt": 1, "run_dir": str(tmp_path / name),
                       "argv": ["env", f"MBX_P={name}", sys.executable, "-c", code], "deadline_s": deadline,
                       "record": str(tmp_path / "points" / f"0-{pos}.json"),
                       "cancel": str(tmp_path / "cancel" / f"0-{pos}")})  # fmt: skip
    (tmp_path / "cancel").mkdir()
    (tmp_path / "cancel" / "0-3").touch()
    pack = tmp_path / "pack.json"
    pack.write_text(json.dumps({"version": 1, "tasks": "unused", "allocations": [points]}))
    first = _runner(pack)
    assert first.returncode == 0, first.stdout + first.stderr
    records = [rundir.read_json(Path(p["record"])) for p in points]
    assert [(r["exit_code"], r["stopped"]) for r in records] == [(0, None), (3, None), (records[2]["exit_code"], "deadline"),
                                                                  (None, "cancel"), (0, None)]  # fmt: skip
    assert seen.read_text().split() == ["ok:-", "last:-"], "the cancelled point never ran; the last one did"
    Path(points[4]["record"]).unlink()  # as if the allocation was requeued before the last point started
    again = _runner(pack, {"SLURM_RESTART_COUNT": "1"})
    assert (
        again.returncode == 0
        and again.stdout.count("ended in an earlier run of this allocation, skipped") == 4
    )
    assert seen.read_text().split() == ["ok:-", "last:-", "last:0"], (
        "only the point that never started ran again"
    )


def test_nemo_run_pack_runner_with_an_image_runs_with_pack_python(tmp_path: Path) -> None:
    """With a container image the pack runner runs on the node outside the container: NeMo-Run's pack task starts it
    with `pack_python`, as submitit's does (it ran with `cluster.python`, the container's interpreter)."""
    pytest.importorskip("nemo_run", reason="NeMo-Run is optional: pip install 'mbx[nemo]'")
    from launchers.backends.nemo_run import NemoRunLauncher

    profile = SlurmProfile.model_validate({"cluster": {"gpus": False, "python": "/in/the/image/python"},
                                          "container": {"image": "nvcr.io#nvidia/pytorch:25.01-py3"}})  # fmt: skip
    specs = [_spec(tmp_path, f"p{i}", WRITE_STATUS) for i in range(2)]
    settings = {"pack": 2, "pack_python": "/on/the/node/python3"}
    (nemo,) = NemoRunLauncher(settings, tmp_path, profile).render(specs)
    (script,) = nemo.scripts.values()
    assert "/on/the/node/python3 -u " in script and "/in/the/image/python -u" not in script, script
    (submitit,) = SubmititLauncher(SubmititSettings(**settings), tmp_path, profile).render(specs)
    runs = "# each task runs (a submitit.helpers.CommandFunction): /on/the/node/python3 -u "
    assert runs in submitit.describe()
