"""The run-dir format version: every record mbx writes carries it, older records are upgraded as they are read,
newer ones are refused by name ("written by a newer mbx (vN)") and never written over."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import store_rows

from orchestrator.run.collect import collect_attempt
from reports.gates import GateSpec
from reports.profile_view import _steps_hint
from trainer import rundir

NEWER = rundir.FORMAT_VERSION + 1
LOGS = Path(__file__).parent / "data" / "megatron" / "logs"
V1_TINY = Path(__file__).parent / "data" / "rundir_v1" / "ws" / "tiny" / "7fab3c2a3f-r0" / "1"
JSON_RECORDS = {
    rundir.STATUS: lambda d: rundir.write_status(d, {"state": "completed"}, rundir.TRAINER),
    rundir.EXIT: lambda d: rundir.write_exit(d, exit_code=0, started_at=1.0, ended_at=2.0),
    rundir.HUNG: lambda d: rundir.write_hung(d, {"last_step": 3, "planned": 3}),
    rundir.LAUNCH: lambda d: rundir.write_launch(d, rundir.launch_record(
        launcher="local", campaign="c", cell_id="p-r0", attempt=1, job_id="1", command=["x"])),
    rundir.NODE: lambda d: rundir.write_node(d, {"hostname": "n1", "gpu_count": 0}),
    rundir.ENV: lambda d: rundir.write_env(d, {"hostname": "n1", "torch": "2.13.0"}),
}  # fmt: skip
READERS = {rundir.STATUS: rundir.read_status, rundir.EXIT: rundir.read_exit, rundir.HUNG: rundir.read_hung,
           rundir.LAUNCH: rundir.read_launch, rundir.NODE: rundir.read_node, rundir.ENV: rundir.read_env}  # fmt: skip


def _raw(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", sorted(JSON_RECORDS))
def test_every_json_record_carries_the_format_and_reads_back_without_it(tmp_path: Path, name: str) -> None:
    JSON_RECORDS[name](tmp_path)
    raw = _raw(tmp_path / name)
    assert next(iter(raw)) == rundir.FORMAT_KEY and raw[rundir.FORMAT_KEY] == rundir.FORMAT_VERSION
    read = READERS[name](tmp_path)
    assert read is not None and rundir.FORMAT_KEY not in read
    assert read == {k: v for k, v in raw.items() if k != rundir.FORMAT_KEY}
    assert rundir.file_problems(tmp_path) == []


def test_metrics_rows_profile_text_and_jit_record_carry_the_format(tmp_path: Path) -> None:
    writer = rundir.MetricsWriter(tmp_path)
    writer.write({"step": 1, "loss": 2.0})
    writer.close()
    line = (tmp_path / rundir.METRICS).read_text().splitlines()[0]
    assert line == f'{{"{rundir.FORMAT_KEY}": {rundir.FORMAT_VERSION}, "step": 1, "loss": 2.0}}'
    assert rundir.read_metrics(tmp_path) == [{"step": 1, "loss": 2.0}]
    rundir.write_metrics(tmp_path, [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}])
    rows = [json.loads(line) for line in (tmp_path / rundir.METRICS).read_text().splitlines()]
    assert [row[rundir.FORMAT_KEY] for row in rows] == [rundir.FORMAT_VERSION] * 2
    assert rundir.read_metrics(tmp_path) == [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}]

    rundir.write_profile_text(tmp_path, first=4, last=6, sorted_by="self_cpu_time_total", tables="TABLE\n")
    text = (tmp_path / rundir.PROFILE_TEXT).read_text()
    assert text.startswith(
        f"# {rundir.FORMAT_KEY}: {rundir.FORMAT_VERSION}\n# torch.profiler over steps 4..6 (3 steps)"
    )
    assert rundir.read_profile_header(tmp_path) == rundir.ProfileHeader(rundir.FORMAT_VERSION, 3)
    assert _steps_hint(tmp_path) == 3, "the report reads the steps through rundir"

    path = rundir.write_jit_cache_record(tmp_path, {"rank": 1, "root": "/c"})
    assert path == tmp_path / rundir.LOGS / "jit-cache-rank1.json"
    assert _raw(path) == {rundir.FORMAT_KEY: rundir.FORMAT_VERSION, "rank": 1, "root": "/c"}


def test_v1_records_are_read_and_upgraded_in_one_place(tmp_path: Path) -> None:
    """Records with no format version are v1 (mbx main before the version): read as before, drift upgraded."""
    for path in V1_TINY.iterdir():
        if path.is_file():
            shutil.copy(path, tmp_path / path.name)
    assert rundir.FORMAT_KEY not in _raw(tmp_path / rundir.STATUS)
    assert rundir.read_status(tmp_path)["state"] == "completed"
    assert (
        rundir.read_exit(tmp_path)["exit_code"] == 0
        and rundir.read_launch(tmp_path)["cell_id"] == "7fab3c2a3f-r0"
    )
    assert [r["step"] for r in rundir.read_metrics(tmp_path)] == [1, 2, 3, 4]
    assert rundir.read_profile_header(tmp_path) == rundir.ProfileHeader(1, 1)
    assert rundir.file_problems(tmp_path) == []
    # what changed between v1 and v2, upgraded as read: node.json's `te`, the trainer's signal in its reason
    (tmp_path / rundir.NODE).write_text(json.dumps({"te": "2.20.2", "hostname": "n1"}))
    (tmp_path / rundir.ENV).write_text(json.dumps({"transformer_engine": None, "torch": "2.11.0"}))
    assert rundir.read_fingerprint(tmp_path)["transformer_engine"] == "2.20.2"
    signalled = {
        "state": "failed",
        "reason": "SystemExit: terminated by signal SIGINT",
        "written_by": "trainer",
    }
    (tmp_path / rundir.STATUS).write_text(json.dumps({**signalled, "launcher_status": signalled}))
    status = rundir.read_status(tmp_path)
    assert status["signal"] == "SIGINT" and status["launcher_status"]["signal"] == "SIGINT"
    # a current record is taken as written: no upgrade applies to it
    rundir.write_node(tmp_path, {"te": "2.20.2", "hostname": "n1"})
    assert rundir.read_node(tmp_path) == {"te": "2.20.2", "hostname": "n1"}


def _newer(path: Path, record: dict) -> bytes:
    data = (json.dumps({rundir.FORMAT_KEY: NEWER, **record}) + "\n").encode()
    path.write_bytes(data)
    return data


def _refusal(path: Path | str) -> str:
    return (f"{path}: written by a newer mbx (v{NEWER}); this mbx reads run-dir formats v1 to "
            f"v{rundir.FORMAT_VERSION}: read it with that mbx or a newer one")  # fmt: skip


@pytest.mark.parametrize("name", sorted(JSON_RECORDS))
def test_a_newer_json_record_is_refused_by_name_and_never_written_over(tmp_path: Path, name: str) -> None:
    kept = _newer(tmp_path / name, {"state": "completed", "brand_new": True})
    for read in (lambda: READERS[name](tmp_path), lambda: rundir.file_problems(tmp_path),
                 lambda: JSON_RECORDS[name](tmp_path)):  # fmt: skip
        with pytest.raises(rundir.NewerFormat) as refused:
            read()
        assert str(refused.value) == _refusal(tmp_path / name)
    assert (tmp_path / name).read_bytes() == kept, "this mbx's writer does not write over it"


def test_a_version_that_is_not_one_is_a_damaged_record(tmp_path: Path) -> None:
    (tmp_path / rundir.STATUS).write_text(json.dumps({rundir.FORMAT_KEY: "2", "state": "completed"}))
    assert rundir.read_status(tmp_path) is None
    assert rundir.file_problems(tmp_path) == [
        f"{tmp_path / rundir.STATUS}: {rundir.FORMAT_KEY} '2' is not a format version (a whole number from 1)"
    ]
    rundir.settle(tmp_path, rundir.resolve_state(None, {"exit_code": 3}))  # damaged: written over, as before
    assert rundir.read_status(tmp_path)["written_by"] == rundir.WRAPPER


def test_newer_metrics_rows_and_profile_text_are_refused_by_name(tmp_path: Path) -> None:
    rundir.write_metrics(tmp_path, [{"step": 1}])
    with (tmp_path / rundir.METRICS).open("a") as handle:
        handle.write(json.dumps({rundir.FORMAT_KEY: NEWER, "step": 2}) + "\n")
    for read in (rundir.read_metrics, rundir.read_metrics_checked, rundir.last_logged_step):
        with pytest.raises(rundir.NewerFormat) as refused:
            read(tmp_path)
        assert str(refused.value) == _refusal(f"{tmp_path / rundir.METRICS}:2")
    kept = _newer(tmp_path / rundir.METRICS, {"step": 1})
    with pytest.raises(rundir.NewerFormat, match=r"metrics.jsonl:1: written by a newer mbx"):
        rundir.write_metrics(tmp_path, [{"step": 1}])
    assert (tmp_path / rundir.METRICS).read_bytes() == kept, "a newer metrics.jsonl is not replaced"

    profile = tmp_path / rundir.PROFILE_TEXT
    profile.write_text(f"# {rundir.FORMAT_KEY}: {NEWER}\n# over steps 1..2 (2 steps)\n")
    for read in (rundir.read_profile_header, _steps_hint, rundir.file_problems):
        with pytest.raises(rundir.NewerFormat) as refused:
            read(tmp_path)
        assert str(refused.value) == _refusal(profile)


def test_collection_refuses_an_attempt_a_newer_mbx_judged_and_nothing_writes_over_it(tmp_path: Path) -> None:
    """collect_attempt refuses it (the engine records the attempt failed with that); the collector fallback
    that writes status.json cannot write over it."""
    rundir.write_metrics(tmp_path, [{"step": s, "loss": 1.0, "step_time_ms": 10.0} for s in (1, 2, 3)])
    rundir.write_exit(tmp_path, exit_code=0, started_at=1.0, ended_at=2.0)
    kept = _newer(tmp_path / rundir.STATUS, {"state": "completed", "written_by": "trainer"})
    with pytest.raises(rundir.NewerFormat, match="written by a newer mbx"):
        collect_attempt(tmp_path, GateSpec(), window=2)
    with pytest.raises(rundir.NewerFormat):
        rundir.write_status(tmp_path, {"state": "failed", "reason": "x"}, rundir.COLLECTOR)
    assert (tmp_path / rundir.STATUS).read_bytes() == kept


NEWER_NODE = """import json, subprocess, sys
json.dump({"mbx_format": 99, "hostname": "node-of-a-newer-mbx"}, open(sys.argv[1] + "/node.json", "w"))
sys.exit(subprocess.call([sys.executable, sys.argv[2], "--replay", sys.argv[3]]))
"""


def test_a_campaign_whose_node_side_a_newer_mbx_ran_is_failed_with_that_said(mbx, write_campaign, tmp_path):
    """The node writes a node.json of a newer format (after the wrapper's own): `campaign run` records the attempt
    failed with the file and its version (the engine never stops for one attempt's files), keeps the record, and
    `campaign status` refuses the run dir with exit 2."""
    script = tmp_path / "newer_node.py"
    script.write_text(NEWER_NODE)
    fake = Path(__file__).parent / "fixtures_cmd" / "fake_megatron.py"
    log = LOGS / "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"
    command = [sys.executable, str(script), "{run_dir}", str(fake), str(log)]
    campaign = write_campaign({"name": "future", "trainer": {"kind": "command", "command": command},
                               "sweep": {"axes": {"seq_length": [64]}}, "wandb": {"mode": "disabled"}})  # fmt: skip
    workspace = tmp_path / "ws"
    ran = mbx("campaign", "run", str(campaign), "--workspace", str(workspace), "--no-report")
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stdout + ran.stderr
    (node,) = workspace.glob("future/*/1/node.json")
    assert json.loads(node.read_text()) == {"mbx_format": 99, "hostname": "node-of-a-newer-mbx"}
    query = "SELECT state, failure_class, reason FROM attempts"
    ((state, failure_class, reason),) = store_rows(workspace / "mbx.sqlite", query)
    assert (state, failure_class) == ("failed", "unknown")
    assert f"{node}: written by a newer mbx (v99)" in reason, reason
    status = mbx("campaign", "status", "future", "--workspace", str(workspace))
    assert status.returncode == 2 and "Traceback" not in status.stderr, status.stdout + status.stderr
    assert f"error: {node}: written by a newer mbx (v99)" in " ".join(status.stderr.split())
