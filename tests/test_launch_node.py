"""The node side without a cluster: the attempt wrapper's exit.json/status.json, the rank entry run by path
(node.json, task table, environment), the rank environment from Slurm's variables, the registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, wait_for

from launchers import registry
from launchers.base import Launcher
from launchers.node import attempt
from launchers.node.environ import JIT_CACHE_VARIABLES, dist_env, expand_hostlist, prepare_env
from trainer import jit_cache, rundir


def run_wrapper(run_dir: Path, *command: str, limit: float | None = None) -> int:
    return attempt.run(run_dir, list(command), run_dir / "launcher.log", limit)


def test_a_failing_command_gets_exit_and_status(tmp_path: Path) -> None:
    code = run_wrapper(tmp_path, sys.executable, "-c", "print('boom'); raise SystemExit(3)")
    assert code == 3
    assert rundir.read_exit(tmp_path)["exit_code"] == 3
    status = rundir.read_status(tmp_path)
    assert status["state"] == "failed" and status["reason"] == "trainer exited with code 3"
    assert status["written_by"] == rundir.WRAPPER and "boom" in status["log_tail"]
    assert not rundir.status_problems(status)


def test_the_trainers_own_status_stands(tmp_path: Path) -> None:
    script = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from trainer import rundir; "
              f"rundir.write_status({str(tmp_path)!r}, {{'state': 'completed', 'reason': None}}, rundir.TRAINER)")  # fmt: skip
    assert run_wrapper(tmp_path, sys.executable, "-c", script) == 0
    status = rundir.read_status(tmp_path)
    assert status["state"] == "completed" and status["written_by"] == rundir.TRAINER
    assert rundir.read_exit(tmp_path)["exit_code"] == 0


def test_time_limit_is_a_timeout(tmp_path: Path) -> None:
    code = run_wrapper(tmp_path, sys.executable, "-c", "import time; time.sleep(30)", limit=0.5)
    assert code == 128 + 15
    exit_info = rundir.read_exit(tmp_path)
    assert exit_info["timed_out_after_s"] == 0.5 and exit_info["signal"] == 15
    status = rundir.read_status(tmp_path)
    assert status["state"] == "timeout" and "time limit" in status["reason"]


def test_a_program_that_cannot_start(tmp_path: Path) -> None:
    assert run_wrapper(tmp_path, str(tmp_path / "no-such-program")) == 127
    assert rundir.read_exit(tmp_path)["exit_code"] == 127
    status = rundir.read_status(tmp_path)
    assert status["state"] == "failed" and status["reason"].startswith("cannot start ")
    assert status["exit_code"] == 127 and "cannot start" in (tmp_path / "launcher.log").read_text()


def test_the_disk_reserve_lives_while_the_command_runs(tmp_path: Path) -> None:
    """The wrapper holds rundir.DISK_RESERVE_BYTES (allocated, not sparse) while the command runs, none after."""
    reserve = tmp_path / rundir.DISK_RESERVE
    probe = (f"import os, sys; s = os.stat({str(reserve)!r}); "
             f"sys.exit(0 if s.st_size == {rundir.DISK_RESERVE_BYTES} and s.st_blocks * 512 >= s.st_size else 5)")  # fmt: skip
    assert run_wrapper(tmp_path, sys.executable, "-c", probe) == 0
    assert not reserve.exists()
    assert run_wrapper(tmp_path, str(tmp_path / "no-such-program")) == 127 and not reserve.exists()


def _filling(disk: Path, then: str) -> list[str]:
    """A command that fills `disk` (a file written until ENOSPC), then runs `then`."""
    return [sys.executable, "-c", f"f = open({str(disk / 'filler')!r}, 'wb')\ntry:\n    while True:\n"
            f"        f.write(bytes(65536)); f.flush()\nexcept OSError:\n    pass\n{then}"]  # fmt: skip


def test_a_full_disk_still_gets_exit_status_and_its_reason(tmp_path: Path) -> None:
    """The command fills the run dir's disk and dies with no room for a word: the wrapper frees its reserve,
    notes the ENOSPC in the log and records the end with it, which the classifier calls infra (retried)."""
    from test_faults import small_disk

    from orchestrator.run.collect import classify_attempt

    with small_disk(tmp_path / "disk", size="1m") as disk:
        run_dir, log = disk / "run", disk / "run" / rundir.LOGS / "launcher.log"
        log.parent.mkdir(parents=True)
        assert attempt.run(run_dir, _filling(disk, "raise SystemExit(1)"), log) == 1
        assert rundir.read_exit(run_dir)["exit_code"] == 1
        status = rundir.read_status(run_dir)
        assert status["state"] == "failed" and status["reason"].startswith("trainer exited with code 1; ")
        assert "(ENOSPC)" in status["reason"], status
        assert log.read_text().splitlines()[-1].startswith("attempt: the run dir's disk was full (ENOSPC)")
        assert not (run_dir / rundir.DISK_RESERVE).exists()
        assert classify_attempt(run_dir, status, rundir.read_exit(run_dir))[0] == "infra"


def test_a_time_limit_on_a_full_disk_stays_a_timeout_and_says_both(tmp_path: Path) -> None:
    from test_faults import small_disk

    with small_disk(tmp_path / "disk", size="1m") as disk:
        run_dir = disk / "run"
        assert attempt.run(run_dir, _filling(disk, "import time; time.sleep(30)"), disk / "log", 1.0) == 128 + 15
        status = rundir.read_status(run_dir)
        assert status["state"] == "timeout" and "time limit" in status["reason"], status
        assert "(ENOSPC)" in status["reason"] and rundir.read_exit(run_dir)["timed_out_after_s"] == 1.0


def test_sigterm_is_forwarded_and_recorded(tmp_path: Path) -> None:
    """The wrapper as a process (python -m launchers.node.attempt): SIGTERM reaches the child; cancelled."""
    marker = tmp_path / "started"
    child = f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-m", "launchers.node.attempt", "--run-dir", str(tmp_path), "--log",
                             str(tmp_path / "log"), "--", sys.executable, "-c", child],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    wait_for(marker.exists, "the child to start", proc)  # a state: SIGTERM only once the child runs
    proc.terminate()
    assert proc.wait(timeout=30) == 128 + 15
    assert rundir.read_exit(tmp_path)["stopped_by_signal"] == 15
    status = rundir.read_status(tmp_path)
    assert status["state"] == "cancelled" and rundir.interrupted(status)


def test_rank_entry_by_path_writes_node_json_and_runs_the_entry(tmp_path: Path) -> None:
    """rank.py run by path (as srun runs it), outside Slurm: rank 0, node.json with the one key list, the
    entry's argv under the attempt wrapper, JIT cache values of the submitting shell removed."""
    run_dir = tmp_path / "run"
    probe = "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('MBX_NOTE', 'TRITON_CACHE_DIR', 'RANK')}))"
    table = tmp_path / "tasks.json"
    table.write_text(json.dumps([{"cell_id": "c", "attempt": 1, "run_dir": str(run_dir),
                                  "argv": [sys.executable, "-c", probe], "env": {"MBX_NOTE": "a b $(c)"},
                                  "time_limit_s": None, "container_image": "img:1", "git_sha": "abc123"}]))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["TRITON_CACHE_DIR"] = "/shared/login-node-cache"
    out = subprocess.run([sys.executable, "-u", str(ROOT / "launchers" / "node" / "rank.py"), "--tasks", str(table)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    seen = json.loads((run_dir / "logs" / "rank-0.log").read_text().strip().splitlines()[-1])
    assert seen == {"MBX_NOTE": "a b $(c)", "TRITON_CACHE_DIR": None, "RANK": "0"}
    node = json.loads((run_dir / "node.json").read_text())
    assert node["container_image"] == "img:1" and node["git_sha"] == "abc123" and node["python"]
    assert "te" not in node and set(node) - {"hosts", "job"} <= set(rundir.FINGERPRINT_KEYS)
    assert rundir.read_fingerprint(run_dir)["git_sha"] == "abc123"
    status = rundir.read_status(run_dir)
    assert status["state"] == "failed" and "without writing status.json" in status["reason"]


def test_hostlist_and_rank_env() -> None:
    assert expand_hostlist("gpu[01-03,7],login-a,x[1-2]-ib") == [
        "gpu01", "gpu02", "gpu03", "gpu7", "login-a", "x1-ib", "x2-ib"]  # fmt: skip
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_JOB_NODELIST": "node[12-13]", "SLURM_JOB_ID": "123456", "SLURM_NTASKS_PER_NODE": "4(x2)"}  # fmt: skip
    dist = dist_env(env, 20000)
    assert dist == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "NODE_RANK": "1",
                    "MASTER_ADDR": "node12", "MASTER_PORT": str(20000 + 123456 % 20000)}  # fmt: skip
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x"}
    assert dist_env(torchrun, 20000)["RANK"] == "1"
    prepared = prepare_env({"env": {"X": "1"}}, 20000, {**env, "TORCHINDUCTOR_CACHE_DIR": "/x", "RANK": "9"})
    assert prepared["RANK"] == "3" and prepared["X"] == "1" and "TORCHINDUCTOR_CACHE_DIR" not in prepared
    assert prepared["OMP_NUM_THREADS"] == "1"


def test_one_list_of_jit_cache_variables() -> None:
    assert set(JIT_CACHE_VARIABLES) == set(jit_cache.RANK_LOCAL_VARS) | set(jit_cache.SHARED_VARS)
    assert len(JIT_CACHE_VARIABLES) == 12


def test_node_code_imports_only_the_standard_library() -> None:
    """launchers/node runs where only the checkout is mounted: no pydantic, no launchers.base, no torch."""
    probe = ("import sys; import launchers.node.rank, launchers.node.attempt; "
             "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'torch', 'yaml', 'submitit') "
             "or m in ('launchers.base', 'launchers.registry')); print(bad)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_registry_names_settings_and_duplicates() -> None:
    assert set(registry.backends()) == {"local", "submitit", "nemo-run", "nemo-run-local"}
    with pytest.raises(KeyError, match="no such launcher 'dry-run'; known: local, nemo-run, nemo-run-local, submitit"):
        registry.get("dry-run")
    model = registry.settings_model("submitit")
    assert model.model_validate({"poll_interval_s": 1}).poll_interval_s == 1
    with pytest.raises(ValueError, match="parallel"):
        model.model_validate({"parallel": 4})  # --parallel is the local backend's, not an unknown Slurm key
    assert "parallel" in registry.settings_model("local").model_fields

    class Impostor(Launcher):
        name = "local"

    with pytest.raises(RuntimeError, match="registered twice"):
        registry.register(Impostor)
