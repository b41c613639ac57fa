"""The run-directory module: one schema for status.json, tolerant reads, the fingerprint keys, resolve_state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer import rundir
from trainer.rundir import SchedulerWord, resolve_state


def test_write_status_refuses_what_breaks_the_schema(tmp_path: Path) -> None:
    rundir.write_status(tmp_path, {"state": "failed", "reason": "x", "exit_code": 1}, rundir.WRAPPER)
    assert rundir.read_status(tmp_path) == {"state": "failed", "reason": "x", "exit_code": 1, "written_by": "launcher"}
    with pytest.raises(ValueError, match="unknown key 'stat'"):
        rundir.write_status(tmp_path, {"stat": "failed", "state": "failed"}, rundir.WRAPPER)
    with pytest.raises(ValueError, match="state 'done' is not one of"):
        rundir.write_status(tmp_path, {"state": "done"}, rundir.TRAINER)
    with pytest.raises(ValueError, match="written_by 'me'"):
        rundir.write_status(tmp_path, {"state": "failed"}, "me")
    assert rundir.read_status(tmp_path)["reason"] == "x", "a refused record leaves the file as it was"


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", b"{not json", b"[1, 2]", b""])
def test_reads_tolerate_damaged_json(tmp_path: Path, content: bytes) -> None:
    (tmp_path / rundir.STATUS).write_bytes(content)
    (tmp_path / rundir.EXIT).write_bytes(content)
    assert rundir.read_status(tmp_path) is None and rundir.read_exit(tmp_path) is None
    (tmp_path / rundir.LAUNCH).mkdir()  # a directory where a file should be
    assert rundir.read_launch(tmp_path) is None


def test_metrics_truncated_tail_is_dropped_but_corruption_is_an_error(tmp_path: Path) -> None:
    writer = rundir.MetricsWriter(tmp_path)
    writer.write({"step": 1, "loss": float("nan")})
    writer.write({"step": 2, "loss": 1.0})
    writer.close()
    with (tmp_path / rundir.METRICS).open("a") as handle:
        handle.write('{"step": 3, "lo')
    assert rundir.read_metrics(tmp_path) == [{"step": 1, "loss": None}, {"step": 2, "loss": 1.0}]
    assert rundir.last_logged_step(tmp_path) == 2
    (tmp_path / rundir.METRICS).write_text('{"step": 1}\ngarbage\n{"step": 2}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        rundir.read_metrics(tmp_path)


def test_fingerprint_merges_login_node_and_trainer_sides_with_one_key_list(tmp_path: Path) -> None:
    rundir.write_launch(tmp_path, rundir.launch_record(
        launcher="local", campaign="c", cell_id="x-r0", attempt=1, job_id="1", command=None,
        fingerprint={"python": "3.11.7", "git_sha": "abc", "submit_host": "login"},
    ))  # fmt: skip
    # a v1 node.json (no format version) of mbx before 2026-12-03, which named TE's version `te`
    (tmp_path / rundir.NODE).write_text(json.dumps({"te": "2.20.2", "hostname": "node1", "gpu_name": "H200"}))
    rundir.write_env(tmp_path, {"python": "3.12.3", "torch": "2.11.0", "gpu_name": "NVIDIA H200"})
    fingerprint = rundir.read_fingerprint(tmp_path)
    assert fingerprint == {"gpu_name": "NVIDIA H200", "torch": "2.11.0", "transformer_engine": "2.20.2",
                           "python": "3.12.3", "git_sha": "abc", "hostname": "node1"}  # fmt: skip
    assert set(fingerprint) <= set(rundir.FINGERPRINT_KEYS)


def test_exit_record(tmp_path: Path) -> None:
    rundir.write_exit(tmp_path, exit_code=-15, started_at=1.0, ended_at=2.0, stopped_by_signal=15)
    assert json.loads((tmp_path / rundir.EXIT).read_text()) == {rundir.FORMAT_KEY: rundir.FORMAT_VERSION,
        "exit_code": -15, "signal": 15, "started_at": 1.0, "ended_at": 2.0, "stopped_by_signal": 15}  # fmt: skip


# ---- resolve_state: the order of trust -------------------------------------------------------------------
TRAINER_DONE = {"state": "completed", "reason": None, "written_by": rundir.TRAINER}
TRAINER_SIGNALLED = {"state": "failed", "reason": "SystemExit: terminated by signal SIGTERM", "written_by": "trainer"}
WRAPPER_CANCELLED = {"state": "cancelled", "reason": "cancelled (signal 15)", "written_by": rundir.WRAPPER}
EXIT_OK = {"exit_code": 0}
TIMEOUT = SchedulerWord("timeout", "Slurm time limit reached: job 7 TIMEOUT", "TIMEOUT")
FAILED = SchedulerWord("failed", "Slurm job 7 ended FAILED", "FAILED", failed_as="Slurm job 7 FAILED")


def test_completed_status_wins_over_everything() -> None:
    found = resolve_state(TRAINER_DONE, {"exit_code": -15, "stopped_by_signal": 15}, scheduler=TIMEOUT)
    assert (found.state, found.write) == ("completed", None)


def test_scheduler_explains_a_signal() -> None:
    found = resolve_state(WRAPPER_CANCELLED, {"exit_code": -15}, scheduler=TIMEOUT)
    assert (found.state, found.failure_class, found.writer) == ("timeout", "timeout", rundir.SCHEDULER)
    assert found.write["attempt_wrapper"] == {"state": "cancelled", "reason": "cancelled (signal 15)"}
    assert rundir.status_problems({**found.write, "written_by": found.writer}) == []


def test_scheduler_failure_names_the_other_rank() -> None:
    found = resolve_state(WRAPPER_CANCELLED, {"exit_code": -15}, scheduler=FAILED)
    assert found.state == "failed" and "another rank failed and srun stopped the others" in found.reason
    found = resolve_state(TRAINER_SIGNALLED, None, scheduler=FAILED)
    assert found.reason.startswith("Slurm job 7 FAILED: SystemExit: terminated by signal SIGTERM")


def test_scheduler_does_not_override_a_status_written_with_an_exit() -> None:
    oom = {"state": "failed", "reason": "OutOfMemoryError: CUDA out of memory", "written_by": "trainer"}
    found = resolve_state(oom, {"exit_code": 1}, scheduler=FAILED)
    assert (found.state, found.reason, found.write) == ("failed", oom["reason"], None)


def test_scheduler_alone_when_nothing_was_written() -> None:
    found = resolve_state(None, None, scheduler=TIMEOUT)
    assert (found.state, found.reason, found.writer) == ("timeout", TIMEOUT.reason, rundir.SCHEDULER)


def test_wrapper_stop_over_a_signalled_trainer_status() -> None:
    found = resolve_state(TRAINER_SIGNALLED, {"exit_code": 1, "timed_out_after_s": 60.0})
    assert (found.state, found.reason, found.writer) == ("timeout", "time limit of 60 s reached", rundir.WRAPPER)
    found = resolve_state(TRAINER_SIGNALLED, {"exit_code": -15, "stopped_by_signal": 15})
    assert (found.state, found.reason) == ("cancelled", "cancelled (signal 15)")


def test_a_scheduler_correction_stands_once_written() -> None:
    # the Slurm base writes the scheduler's word over the wrapper's; collection reads it back later
    found = resolve_state(WRAPPER_CANCELLED, {"exit_code": -15, "stopped_by_signal": 15}, scheduler=TIMEOUT)
    written = {**found.write, "written_by": found.writer}
    again = resolve_state(written, {"exit_code": -15, "stopped_by_signal": 15})
    assert (again.state, again.reason, again.write) == ("timeout", TIMEOUT.reason, None)


def test_exit_code_when_the_trainer_wrote_nothing() -> None:
    assert resolve_state(None, {"exit_code": -9}).reason == "trainer killed by signal 9"
    assert resolve_state(None, {"exit_code": 3}).reason == "trainer exited with code 3"
    found = resolve_state(None, EXIT_OK)
    assert (found.state, found.reason) == ("failed", "trainer exited 0 without writing status.json")
    assert found.write == {"state": "failed", "reason": found.reason, "exit_code": 0}


def test_nothing_at_all_uses_the_job_state() -> None:
    found = resolve_state(None, None, job_state="timeout")
    assert (found.state, found.failure_class) == ("timeout", "timeout")
    assert found.reason == "no status.json was written (scheduler state: timeout)"
    assert resolve_state(None, None).state == "failed"


def test_a_status_keeps_its_class_and_unknown_states_fail() -> None:
    found = resolve_state({"state": "failed", "reason": "r", "failure_class": "oom"}, EXIT_OK)
    assert (found.state, found.failure_class, found.write) == ("failed", "oom", None)
    assert resolve_state({"state": "exploded"}, EXIT_OK).state == "failed"


def test_settle_writes_only_what_a_resolution_calls_for(tmp_path: Path) -> None:
    rundir.settle(tmp_path, resolve_state(None, {"exit_code": 2}))
    assert rundir.read_status(tmp_path)["written_by"] == rundir.WRAPPER
    before = (tmp_path / rundir.STATUS).read_bytes()
    rundir.settle(tmp_path, resolve_state(rundir.read_status(tmp_path), {"exit_code": 2}))
    assert (tmp_path / rundir.STATUS).read_bytes() == before


def test_interrupted_reads_the_signal_key_not_the_reason_text(tmp_path: Path) -> None:
    signalled = {"state": "failed", "reason": "ValueError: x", "written_by": rundir.TRAINER, "signal": "SIGTERM"}
    assert rundir.interrupted(signalled) and rundir.status_problems(signalled) == []
    # a reason that merely mentions a signal is not a stop by one
    mention = {"state": "failed", "reason": "ValueError: bad signal-to-noise", "written_by": rundir.TRAINER}
    assert not rundir.interrupted(mention)
    # the wrapper saw its child killed (e.g. the OOM killer): the scheduler may know why
    killed = {"state": "failed", "reason": "trainer killed by signal 9", "exit_code": -9, "written_by": rundir.WRAPPER}
    assert rundir.interrupted(killed) and not rundir.interrupted({**killed, "exit_code": 1})
    (tmp_path / rundir.STATUS).write_text(json.dumps(TRAINER_SIGNALLED))  # v1, before the signal key
    assert rundir.interrupted(rundir.read_status(tmp_path)), "status files from before the signal key still count"
    assert not rundir.interrupted({**signalled, "state": "completed"})
