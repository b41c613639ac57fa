"""The fault matrix: real processes killed, files corrupted, disks filled, stores deleted; nothing lost or doubled.

Every test ends with `assert_consistent`: every cell of the campaign has its attempts numbered 1..n (no gap,
no repeat), none left `submitted`/`running`, at most one `completed` attempt per cell, every attempt that did
not complete has a reason, and a completed attempt's metrics.jsonl holds steps 1..N exactly once. mbx's own
output never holds a traceback.

| fault | test |
|---|---|
| SIGKILL of one rank of a 2-rank local torchrun attempt | test_faults.py::test_sigkill_of_one_rank |
| SIGKILL of the orchestrator before any submission is recorded, then resume | test_faults.py::test_orchestrator_killed_before_submission_is_recorded |
| SIGKILL of the orchestrator while attempts run, then resume | test_resume.py::test_sigkill_then_resume_finishes_everything_exactly_once; test_retry.py::test_retry_budget_survives_a_killed_orchestrator |
| SIGKILL of the orchestrator while collecting, then resume | test_faults.py::test_orchestrator_killed_while_collecting |
| two runs of one campaign at once | test_engine_guards.py::test_second_run_of_a_running_campaign_is_refused_before_it_writes |
| re-run after the store is lost never writes into an earlier attempt | test_engine_guards.py::test_rerun_after_the_store_is_lost_never_appends_to_an_earlier_attempt |
| a cell's run-dir path is a file | test_faults.py::test_run_dir_path_that_is_a_file_fails_that_cell_only (+ ..._is_recorded_as_a_failed_attempt) |
| scancel of a running Slurm job; mbx's and Slurm's time limits | test_slurm_states.py (test_scancel_and_time_limit_campaign_goes_on, test_direct_scancel_limit_rank_failure_and_completion, test_native_slurm_timeout) |
| Slurm requeue mid-run | test_slurm_requeue.py::test_requeued_job_is_a_new_attempt_of_the_same_cell |
| sacct failing (a stub that errors, first on PATH) | test_slurm_faults.py::test_campaign_survives_a_failing_sacct |
| SIGTERM repeated while the trainer handles the first | test_trainer_signals.py::test_repeated_sigterm_is_a_failed_run_never_a_completed_one |
| corrupt / truncated / directory-in-place status.json, exit.json, launch.json, env.json, node.json, metrics.jsonl, recipe.yaml, before, while and after a run | test_faults.py::test_corrupt_run_dir_files (bundled trainer); test_faults.py::test_corrupt_files_of_a_command_attempt (command kind, whose collection writes status.json / metrics.jsonl) |
| a full disk (small tmpfs workspace) during a run | test_faults.py::test_full_disk_during_a_run (+ test_full_disk_reason_names_enospc) |
| the store deleted mid-run, then `mbx store rebuild` | test_faults.py::test_store_deleted_mid_run_then_rebuilt; test_store_rebuild.py (damaged and lost stores after a run) |
"""

from __future__ import annotations

import copy
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY_MOE_RECIPE

from trainer import rundir

FAKE = ROOT / "tests" / "fixtures_cmd" / "fake_megatron.py"
LOG = ROOT / "tests" / "data" / "megatron" / "logs" / "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"
LOG_STEPS = 15  # iterations in LOG

# `python -c PAUSE_HOOK ARGS` runs `mbx ARGS` with the functions named in $MBX_TEST_PAUSE
# ("module:Class.method,...") pausing on their first call: the i-th touches $MBX_TEST_PAUSE_DIR/paused-i and
# waits for go-i. The test then acts (kills, corrupts) at an exact moment of the engine's loop.
PAUSE_HOOK = r"""
import importlib, os, sys, time
from pathlib import Path

def _pause(spec, index):
    module, _, attr = spec.partition(":")
    owner_name, _, method = attr.rpartition(".")
    owner = importlib.import_module(module)
    for part in owner_name.split("."):
        owner = getattr(owner, part)
    original = getattr(owner, method)
    folder = Path(os.environ["MBX_TEST_PAUSE_DIR"])
    marker, go = folder / f"paused-{index}", folder / f"go-{index}"

    def paused(*args, **kwargs):
        if not marker.exists():
            marker.touch()
            while not go.exists():
                time.sleep(0.02)
        return original(*args, **kwargs)

    setattr(owner, method, paused)

for index, spec in enumerate(s for s in os.environ.get("MBX_TEST_PAUSE", "").split(",") if s):
    _pause(spec, index)
sys.argv = ["mbx", *sys.argv[1:]]
from orchestrator.cli.app import main
main()
"""


# ---- helpers --------------------------------------------------------------------------------------------
def rows(workspace: Path, sql: str, params: tuple = ()) -> list[tuple]:
    store = workspace / "mbx.sqlite"
    if not store.exists():
        return []
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)
    try:
        return list(db.execute(sql, params))
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


def metric_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def assert_consistent(workspace: Path, campaign: str, steps: int | None) -> dict[str, list[tuple]]:
    """0 cells lost, 0 duplicated, nothing left active, every non-completed attempt with a reason; returns
    {cell_id: [(attempt, state, reason, run_dir), ...]}."""
    cells = [c for (c,) in rows(workspace, "SELECT cell_id FROM cells WHERE campaign=? AND active=1", (campaign,))]
    assert cells, "the campaign's cells are in the store"
    attempts: dict[str, list[tuple]] = {cell: [] for cell in cells}
    for cell, *rest in rows(workspace, "SELECT cell_id, attempt, state, reason, run_dir FROM attempts "
                                       "WHERE campaign=? ORDER BY cell_id, attempt", (campaign,)):  # fmt: skip
        attempts.setdefault(cell, []).append(tuple(rest))
    for cell, tries in attempts.items():
        assert tries, f"{cell}: lost (no attempt recorded)"
        assert [a for a, *_ in tries] == list(range(1, len(tries) + 1)), f"{cell}: attempts not 1..n: {tries}"
        states = [s for _, s, *_ in tries]
        assert not {"submitted", "running"} & set(states), f"{cell}: left active: {tries}"
        assert states.count("completed") <= 1, f"{cell}: completed twice: {tries}"
        for _, state, reason, _ in tries:
            assert state == "completed" or (reason and reason.strip()), f"{cell}: {state} without a reason"
        if steps is not None and "completed" in states:
            run_dir = workspace / next(r for _, s, _, r in tries if s == "completed")  # stored relative
            assert metric_steps(run_dir) == list(range(1, steps + 1)), f"{cell}: steps missing or repeated"
    return attempts


def assert_clean(*outputs: str) -> None:
    for output in outputs:
        assert "Traceback" not in output, output


def tiny_campaign(name: str, steps: int, **extra: object) -> dict:
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = steps
    return {"name": name, "trainer": {"recipe": recipe}, "wandb": {"mode": "disabled"}, **extra}


def command_campaign(name: str, tags: list[str], sleep_s: float = 0.01, **extra: object) -> dict:
    """Cells of fake_megatron replaying LOG (no torch: each attempt takes a fraction of a second)."""
    return {
        "name": name,
        "trainer": {"kind": "command", "command": [sys.executable, str(FAKE), "--replay", str(LOG),
                                                   "--sleep-s", str(sleep_s)]},  # fmt: skip
        "sweep": {"axes": {"tag": tags}},
        "wandb": {"mode": "disabled"},
        **extra,
    }


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@contextmanager
def orchestrator(tmp_path: Path, *args: str, pause: list[str] = (), env: dict | None = None
                 ) -> Iterator[tuple[subprocess.Popen, Path]]:  # fmt: skip
    """`mbx ARGS` in the background with pause points; yields (process, pause dir); killed on the way out."""
    folder = tmp_path / f"pause-{time.monotonic_ns()}"
    folder.mkdir()
    full = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "MBX_CACHE_DIR": str(tmp_path / "cache"),
            "WANDB_MODE": "offline", "WANDB_SILENT": "true", "MBX_TEST_PAUSE": ",".join(pause),
            "MBX_TEST_PAUSE_DIR": str(folder), **(env or {})}  # fmt: skip
    out = (folder / "output").open("w")
    proc = subprocess.Popen([sys.executable, "-c", PAUSE_HOOK, *args], cwd=ROOT, env=full, stdout=out,
                            stderr=subprocess.STDOUT)  # fmt: skip
    try:
        yield proc, folder
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        out.close()


def wait_for(predicate, what: str, proc: subprocess.Popen | None = None, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the orchestrator ended before {what}")
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def output_of(folder: Path) -> str:
    return (folder / "output").read_text()


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


# ---- the orchestrator killed at exact moments -----------------------------------------------------------
def test_orchestrator_killed_before_submission_is_recorded(mbx, tmp_path):
    """Killed after an attempt is reserved and its inputs written, before the launcher ran anything: resume
    retires it (never submitted) and runs the cell as attempt 2; the other cell runs once."""
    file = write(tmp_path, command_campaign("presubmit", ["a", "b"]))
    workspace = tmp_path / "ws"
    with orchestrator(tmp_path, "campaign", "run", str(file), "--workspace", str(workspace), "--no-report",
                      pause=["launchers.base:Launcher.submit"]) as (proc, folder):  # fmt: skip
        wait_for(lambda: (folder / "paused-0").exists(), "the first submission", proc)
        assert [s for (s,) in rows(workspace, "SELECT state FROM attempts")] == ["submitted"]
        kill(proc)
    resumed = mbx("campaign", "resume", "presubmit", "--workspace", str(workspace), "--no-report")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_clean(resumed.stdout, resumed.stderr)
    attempts = assert_consistent(workspace, "presubmit", LOG_STEPS)
    shapes = sorted([s for _, s, *_ in tries] for tries in attempts.values())
    assert shapes == [["completed"], ["failed", "completed"]], attempts
    assert any(r == "never submitted" for tries in attempts.values() for _, _, r, _ in tries)


def test_orchestrator_killed_while_collecting(mbx, tmp_path):
    """Killed when the first attempt has ended and is being recorded: resume adopts and collects it (no rerun)."""
    file = write(tmp_path, command_campaign("collecting", ["a", "b"]))
    workspace = tmp_path / "ws"
    with orchestrator(tmp_path, "campaign", "run", str(file), "--workspace", str(workspace), "--no-report",
                      pause=["orchestrator.run.store:Store.record_outcome"]) as (proc, folder):  # fmt: skip
        wait_for(lambda: (folder / "paused-0").exists(), "the first collection", proc)
        assert [s for (s,) in rows(workspace, "SELECT state FROM attempts")] == ["running"]
        kill(proc)
    resumed = mbx("campaign", "resume", "collecting", "--workspace", str(workspace), "--no-report")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "adopted running attempt 1" in resumed.stdout
    assert_clean(resumed.stdout, resumed.stderr)
    attempts = assert_consistent(workspace, "collecting", LOG_STEPS)
    assert sorted(len(tries) for tries in attempts.values()) == [1, 1], "nothing ran twice"


# ---- a run dir that cannot be made ----------------------------------------------------------------------
def _blocked_run(mbx, tmp_path: Path, name: str) -> tuple[Path, str, subprocess.CompletedProcess]:
    """A 2-cell campaign whose first cell's directory is a file; returns (workspace, that cell, the run)."""
    file = write(tmp_path, command_campaign(name, ["a", "b"]))
    workspace = tmp_path / "ws"
    first = json.loads(mbx("campaign", "plan", str(file), "--json").stdout)[0]["cell_id"]
    (workspace / name).mkdir(parents=True)
    (workspace / name / first).write_text("in the way\n")
    run = mbx("campaign", "run", str(file), "--workspace", str(workspace), "--no-report")
    assert run.returncode == 1, run.stdout + run.stderr
    assert_clean(run.stdout, run.stderr)
    return workspace, first, run


def test_run_dir_path_that_is_a_file_fails_that_cell_only(mbx, tmp_path):
    """<campaign>/<cell-id> is a file: that cell fails with the reason (never left `submitted`), the others run."""
    workspace, first, run = _blocked_run(mbx, tmp_path, "blocked")
    assert "1/2 completed" in run.stdout and "Not a directory" in run.stdout, run.stdout
    assert "mbx campaign resume blocked" in run.stdout
    states = dict(rows(workspace, "SELECT cell_id, state FROM attempts WHERE campaign='blocked'"))
    assert states.get(first, "failed") == "failed" and list(states.values()).count("completed") == 1, states


def test_run_dir_path_that_is_a_file_is_recorded_as_a_failed_attempt(mbx, tmp_path):
    workspace, first, _ = _blocked_run(mbx, tmp_path, "blocked2")
    attempts = assert_consistent(workspace, "blocked2", LOG_STEPS)
    ((number, state, reason, _),) = attempts[first]
    assert (number, state) == (1, "failed") and "Not a directory" in reason


# ---- corrupt, truncated and misplaced files in run dirs -----------------------------------------------------
JUNK = b"\xff\xfe\x00{not json: [\n\x80garbage"
BEFORE = ("recipe-junk",)  # corrupted after the inputs are written, before the launch
WHILE = "while"  # env.json, launch.json and a junk line in metrics.jsonl while the trainer runs
AFTER = {  # corrupted once the process has ended, before the engine collects it
    "status-junk": {"status.json": "junk"},
    "status-dir": {"status.json": "dir"},
    "exit-and-fingerprint-junk": {name: "junk" for name in ("exit.json", "launch.json", "env.json", "node.json",
                                                            "recipe.yaml")},  # fmt: skip
    "metrics-middle": {"metrics.jsonl": "middle"},
    "metrics-dir": {"metrics.jsonl": "dir"},
    "all-truncated": {name: "truncate" for name in ("status.json", "exit.json", "launch.json", "env.json",
                                                    "metrics.jsonl", "recipe.yaml")},  # fmt: skip
}
COMPLETES = ("exit-and-fingerprint-junk",)  # the trainer's status says so; the rest is not needed to collect
FAILS = (*BEFORE, "status-junk", "status-dir", "all-truncated")  # no readable status: the exit code decides


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes() if path.is_file() else b""
    if how == "junk":
        path.write_bytes(JUNK)
    elif how == "truncate":
        path.write_bytes(data[: max(1, len(data) // 2)] if data.endswith(b"\n") or not data else data[:-3])
    elif how == "middle":
        lines = data.splitlines(keepends=True)
        path.write_bytes(b"".join(lines[:2]) + JUNK + b"\n" + b"".join(lines[2:]))
    elif how == "dir":
        path.unlink(missing_ok=True)
        path.mkdir()
        (path / "inside").write_text("a directory where a file belongs\n")


def test_corrupt_run_dir_files(tmp_path):
    """Every kind of run-dir file corrupted (junk bytes, cut short, a directory in its place) before, while and
    after a real run: each attempt ends in a final state with a reason, the run ends, nothing stays active."""
    faults = [*BEFORE, WHILE, *AFTER]
    data = tiny_campaign("corrupt", 6, launchers={"local": {"parallel": len(faults)}},
                         sweep={"zip": [{"env.FAULT": faults,
                                         "training.steps": [150 if f == WHILE else 6 for f in faults]}]})  # fmt: skip
    file = write(tmp_path, data)
    workspace = tmp_path / "ws"
    pause = ["launchers.base:Launcher.submit", "orchestrator.run.engine:Engine._finish"]
    with orchestrator(tmp_path, "campaign", "run", str(file), "--workspace", str(workspace), "--no-report",
                      pause=pause) as (proc, folder):  # fmt: skip
        wait_for(lambda: (folder / "paused-0").exists(), "the submission", proc)
        dirs = {json.loads(params)["env.FAULT"]: workspace / run_dir for params, run_dir in rows(
            workspace, "SELECT c.params_json, a.run_dir FROM attempts a JOIN cells c USING (campaign, cell_id)")}
        assert sorted(dirs) == sorted(faults)
        corrupt(dirs["recipe-junk"] / "recipe.yaml", "junk")
        (folder / "go-0").touch()

        metrics = dirs[WHILE] / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 3, "3 steps of the long run", proc)
        corrupt(dirs[WHILE] / "env.json", "junk")
        corrupt(dirs[WHILE] / "launch.json", "truncate")
        with metrics.open("ab") as handle:
            handle.write(JUNK + b"\n")

        wait_for(lambda: (folder / "paused-1").exists(), "the first collection", proc)
        wait_for(lambda: all((d / "exit.json").exists() for d in dirs.values()), "every process to end", proc)
        for fault, files in AFTER.items():
            for name, how in files.items():
                corrupt(dirs[fault] / name, how)
        (folder / "go-1").touch()
        proc.wait(timeout=120)
        out = output_of(folder)
    assert proc.returncode == 1, out
    assert_clean(out)
    attempts = assert_consistent(workspace, "corrupt", None)
    final = {fault: attempts[Path(d).parent.name][-1] for fault, d in dirs.items()}
    for fault in COMPLETES:
        assert final[fault][1] == "completed", (fault, final[fault])
    for fault in FAILS:
        assert final[fault][1] == "failed" and final[fault][2], (fault, final[fault])
    for fault in BEFORE:
        assert "recipe" in final[fault][2], final[fault]
    for fault in (WHILE, "metrics-middle"):
        state, reason = final[fault][1:3]
        assert state == "completed" or "metrics.jsonl" in reason, (fault, final[fault])
    junk_at = next(i for i, line in enumerate(metrics.read_bytes().splitlines()) if line.startswith(JUNK[:4]))
    assert junk_at < len(metrics.read_bytes().splitlines()) - 1, "the trainer went on writing after the junk"


COMMAND_AFTER = {  # a command attempt's files, corrupted before the engine collects (finalize) it
    "status-dir": {"status.json": "dir"},  # finalize cannot write its status: mbx records why
    "metrics-dir": {"metrics.jsonl": "dir"},
    "exit-junk": {"exit.json": "junk"},
    "launch-junk": {"launch.json": "junk", "recipe.yaml": "junk"},
    "status-junk": {"status.json": "junk"},
}


def test_corrupt_files_of_a_command_attempt(tmp_path):
    """The command kind collects by parsing logs and writing status.json and metrics.jsonl itself: files in the
    way of those writes, or junk in what it reads, end the attempt with a reason, never a crash."""
    tags = list(COMMAND_AFTER)
    file = write(tmp_path, command_campaign("cmdcorrupt", tags, launchers={"local": {"parallel": len(tags)}}))
    workspace = tmp_path / "ws"
    with orchestrator(tmp_path, "campaign", "run", str(file), "--workspace", str(workspace), "--no-report",
                      pause=["orchestrator.run.engine:Engine._finish"]) as (proc, folder):  # fmt: skip
        wait_for(lambda: (folder / "paused-0").exists(), "the first collection", proc)
        dirs = {json.loads(params)["tag"]: workspace / run_dir for params, run_dir in rows(
            workspace, "SELECT c.params_json, a.run_dir FROM attempts a JOIN cells c USING (campaign, cell_id)")}
        wait_for(lambda: all((d / "exit.json").exists() for d in dirs.values()), "every process to end", proc)
        for tag, files in COMMAND_AFTER.items():
            for name, how in files.items():
                corrupt(dirs[tag] / name, how)
        (folder / "go-0").touch()
        proc.wait(timeout=120)
        out = output_of(folder)
    assert proc.returncode == 1, out
    assert_clean(out)
    attempts = assert_consistent(workspace, "cmdcorrupt", None)
    final = {tag: attempts[d.parent.name][-1] for tag, d in dirs.items()}
    assert final["status-dir"][1] == "failed" and "status.json" in final["status-dir"][2], final["status-dir"]
    assert final["metrics-dir"][1] == "failed" and "metrics.jsonl" in final["metrics-dir"][2], final
    for tag in ("exit-junk", "launch-junk", "status-junk"):
        assert final[tag][1] in ("completed", "failed"), (tag, final[tag])


# ---- a full disk --------------------------------------------------------------------------------------------
@contextmanager
def small_disk(path: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (root only), unmounted on the way out."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs as the workspace needs root")
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; returns it."""
    filler = disk / "filler"
    with filler.open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
    return filler


@pytest.fixture(scope="module")
def full_disk_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.CompletedProcess, dict]]:
    """The workspace's disk fills while a point trains; then space is freed and the campaign resumed.
    Yields (the stopped run's output, the resume, the attempts as assert_consistent returns them)."""
    from conftest import run_mbx

    tmp_path = tmp_path_factory.mktemp("full")
    with small_disk(tmp_path / "disk") as disk:
        workspace = disk / "ws"
        file = write(tmp_path, tiny_campaign("full", 200))
        with orchestrator(tmp_path, "campaign", "run", str(file), "--workspace", str(workspace),
                          "--no-report") as (proc, folder):  # fmt: skip
            wait_for(lambda: (m := list(workspace.glob("full/*/1/metrics.jsonl"))) and m[0].read_text().count("\n")
                     >= 3, "3 steps", proc)  # fmt: skip
            filler = fill(disk)
            proc.wait(timeout=120)
            out = output_of(folder)
        assert proc.returncode == 1, out
        assert rows(workspace, "PRAGMA integrity_check") == [("ok",)], "the store stays whole"
        assert [s for (s,) in rows(workspace, "SELECT state FROM attempts")] in (["running"], ["failed"])
        filler.unlink()
        resumed = run_mbx("campaign", "resume", "full", "--workspace", str(workspace), "--no-report")
        yield out, resumed, assert_consistent(workspace, "full", None)


def test_full_disk_during_a_run(full_disk_run):
    """mbx ends with a line naming ENOSPC and the way on (no traceback), the store stays whole; once space is
    freed `resume` runs the cell again to completion (an infrastructure failure, issue 21).

    Two endings, both right, by who needs space first once the attempt wrapper frees its reserve to record the
    end (launchers/node/attempt.py): the run records the attempt failed (infra, ENOSPC) and names `mbx campaign
    resume`; or the store's own write fails, mbx stops saying so, and `resume` adopts the attempt, failed."""
    out, resumed, attempts = full_disk_run
    assert_clean(out, resumed.stdout, resumed.stderr)
    assert "ENOSPC" in out and "mbx campaign resume full" in out, out
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    (_, state, reason, _), (_, again, _, _) = next(iter(attempts.values()))
    assert state == "failed" and reason and again == "completed", reason


def test_full_disk_reason_names_enospc(full_disk_run):
    _, _, attempts = full_disk_run
    (_, _, reason, _), _ = next(iter(attempts.values()))
    assert "ENOSPC" in reason or "No space left on device" in reason, reason


# ---- SIGKILL of one rank ------------------------------------------------------------------------------------
def attempt_pid(run_dir: Path, program: bytes, rank: int | None = None) -> int | None:
    """The pid of the process of the attempt in run_dir whose command line has `program` (the trainer's: of
    `rank`, when given), from /proc's environments."""
    want = {f"MBX_RUN_DIR={run_dir}".encode(), *([f"RANK={rank}".encode()] if rank is not None else [])}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = set((entry / "environ").read_bytes().split(b"\0"))
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if want <= env and program in cmdline and b"torchrun" not in cmdline:
            return int(entry.name)
    return None


def rank_pid(run_dir: Path, rank: int) -> int | None:
    """The pid of the trainer process of `rank` of the attempt in run_dir."""
    return attempt_pid(run_dir, b"trainer", rank)


def test_sigkill_of_one_rank(mbx, tmp_path):
    """Rank 1 of a 2-rank local torchrun attempt is SIGKILLed mid-run: the attempt ends failed with a reason (rank 0
    is stopped, nothing hangs), the campaign exits 1 cleanly."""
    file = write(tmp_path, tiny_campaign("rankkill", 5000, resources={"gpus_per_node": 2}))
    workspace = tmp_path / "ws"
    with orchestrator(tmp_path, "campaign", "run", str(file), "--workspace", str(workspace),
                      "--no-report") as (proc, folder):  # fmt: skip
        def started() -> bool:
            metrics = list(workspace.glob("rankkill/*/1/metrics.jsonl"))
            return bool(metrics) and metrics[0].read_text().count("\n") >= 3

        wait_for(started, "3 steps", proc)
        run_dir = next(workspace.glob("rankkill/*/1"))
        pid = rank_pid(run_dir, 1)
        assert pid is not None, "rank 1 not found"
        os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=120)
        out = output_of(folder)
    assert proc.returncode == 1, out
    assert_clean(out)
    attempts = assert_consistent(workspace, "rankkill", None)
    ((_, state, reason, _),) = next(iter(attempts.values()))
    assert state == "failed" and reason, reason
    steps = metric_steps(run_dir)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) < 5000, "steps logged once each, then stopped"
    assert rank_pid(run_dir, 0) is None, "rank 0 did not outlive the attempt"


def test_sigkill_of_the_attempt_wrapper_and_its_trainer(mbx, tmp_path):
    """The node side vanishes (wrapper and trainer SIGKILLed, as a lost node): the attempt ends failed with a
    reason, and the engine deletes the disk reserve the wrapper held (rundir.DISK_RESERVE) and could not free."""
    file = write(tmp_path, tiny_campaign("wrapkill", 5000))
    workspace = tmp_path / "ws"
    with orchestrator(tmp_path, "campaign", "run", str(file), "--workspace", str(workspace),
                      "--no-report") as (proc, folder):  # fmt: skip
        wait_for(lambda: (m := list(workspace.glob("wrapkill/*/1/metrics.jsonl"))) and m[0].read_text().count("\n")
                 >= 3, "3 steps", proc)  # fmt: skip
        run_dir = next(workspace.glob("wrapkill/*/1"))
        assert (run_dir / rundir.DISK_RESERVE).stat().st_size == rundir.DISK_RESERVE_BYTES
        pids = [attempt_pid(run_dir, b"launchers.node.attempt"), attempt_pid(run_dir, b"-m\0trainer")]
        assert None not in pids, pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=120)
        out = output_of(folder)
    assert proc.returncode == 1, out
    assert_clean(out)
    ((_, state, reason, _),) = next(iter(assert_consistent(workspace, "wrapkill", None).values()))
    assert state == "failed" and reason, reason
    assert not (run_dir / rundir.DISK_RESERVE).exists()


# ---- the store deleted mid-run ------------------------------------------------------------------------------
def test_store_deleted_mid_run_then_rebuilt(mbx, tmp_path):
    """mbx.sqlite (and its WAL) deleted while a campaign runs: the run finishes, `mbx store rebuild` brings back
    every cell and attempt from the run dirs, and a re-run finds nothing left to do."""
    file = write(tmp_path, command_campaign("lost", ["a", "b", "c"], sleep_s=0.05))
    workspace = tmp_path / "ws"
    with orchestrator(tmp_path, "campaign", "run", str(file), "--workspace", str(workspace),
                      "--no-report") as (proc, folder):  # fmt: skip
        wait_for(lambda: ("completed",) in rows(workspace, "SELECT state FROM attempts"), "one completed", proc)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{workspace / 'mbx.sqlite'}{suffix}").unlink(missing_ok=True)
        proc.wait(timeout=120)
        out = output_of(folder)
    assert proc.returncode == 0, out
    assert_clean(out)
    rebuilt = mbx("store", "rebuild", "--workspace", str(workspace))
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert_clean(rebuilt.stdout, rebuilt.stderr)
    attempts = assert_consistent(workspace, "lost", LOG_STEPS)
    assert sorted(len(tries) for tries in attempts.values()) == [1, 1, 1]
    assert all(tries[0][1] == "completed" for tries in attempts.values()), attempts
    again = mbx("campaign", "run", str(file), "--workspace", str(workspace), "--no-report")
    assert again.returncode == 0 and "3 skipped" in again.stdout, again.stdout + again.stderr
