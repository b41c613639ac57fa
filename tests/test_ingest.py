"""`mbx ingest`: real Megatron-LM / Megatron-Bridge logs become run dirs and store rows that status, report and
`baseline:` use like new runs; bad input exits 2 and writes nothing."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from reports.parsers import parse_log
from reports.window import summarize

DATA = ROOT / "tests" / "data"
LOGS = DATA / "megatron" / "logs"
FAKE = ROOT / "tests" / "fixtures_cmd" / "fake_megatron.py"
LM_LOG = LOGS / "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"
FORMATS = {
    "megatron_bridge__dgxc_llama31_8b_ckpt_resume__excerpt.log": "megatron-bridge",
    "megatron_bridge__pr841_profiler_wrapped__excerpt.log": "megatron-bridge",
    "megatron_lm__attn_bench_llama3_1b_40gpu_rank39__stdout.log": "megatron-lm",
    "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log": "auto",
    "megatron_lm__ling_v2_moe_pretrain_example__excerpt.log": "megatron-lm",
    "megatron_lm__seunghyunseo_moe_exp_dropless_moe_64e_ep8__excerpt.log": "auto",
}
TRUNCATED = {  # real logs that stop before their `iteration N/M` total: step N of M
    "megatron_bridge__pr841_profiler_wrapped__excerpt.log": "20 of 50",
    "megatron_lm__attn_bench_llama3_1b_40gpu_rank39__stdout.log": "344 of 500",
    "megatron_lm__ling_v2_moe_pretrain_example__excerpt.log": "10 of 2000",
    "megatron_lm__seunghyunseo_moe_exp_dropless_moe_64e_ep8__excerpt.log": "220 of 40000",
}


def test_ingest_real_logs_status_and_report(mbx, tmp_path):
    workspace = tmp_path / "ws"
    assert sorted(FORMATS) == sorted(p.name for p in LOGS.iterdir()), "every real log is ingested"
    for name, fmt in FORMATS.items():
        result = mbx(
            "ingest", str(LOGS / name), "--format", fmt, "--campaign", "past", "--workspace", str(workspace)
        )
        # a truncated log is a failed cell: exit 1, as `campaign run` exits for one (issue 31)
        assert result.returncode == (1 if name in TRUNCATED else 0), result.stdout + result.stderr
        assert "ingested " in result.stdout
    # one run of 4 ranks (one log per rank) whose rank 3 ran out of memory, and a NCCL watchdog failure
    for folder, label in (("oom_cuda", "oom run"), ("infra_nccl_watchdog", "watchdog run")):
        result = mbx("ingest", str(DATA / "failures" / folder), "--campaign", "past", "--label", label,
                     "--param", "env.NUM_OF_TOKENS_PER_CHUNK_COMBINE_API=128", "--workspace", str(workspace))  # fmt: skip
        assert result.returncode == 1, result.stdout + result.stderr  # recorded failed, and said so

    status = json.loads(mbx("campaign", "status", "past", "--workspace", str(workspace), "--json").stdout)["cells"]
    assert len(status) == len(FORMATS) + 2
    by_label = {cell["label"]: cell for cell in status}
    for name in FORMATS:
        cell = by_label[Path(name).stem]
        if name in TRUNCATED:  # logs that stop before their planned iterations are never passed (issue 21)
            assert cell["state"] == "failed" and cell["verdict"] == "fail", cell
            assert f"stopped at step {TRUNCATED[name]}" in cell["reason"], cell
        else:
            assert cell["state"] == "completed" and cell["verdict"] == "pass", cell
        want = summarize(parse_log(LOGS / name), 10).to_dict()
        assert cell["summary"] == pytest.approx(want, nan_ok=True)
        run = Path(cell["run_dir"])
        assert (run / "logs" / name).read_bytes() == (LOGS / name).read_bytes()
        assert len((run / "metrics.jsonl").read_text().splitlines()) == want["steps"]
        assert json.loads((run / "status.json").read_text())["written_by"] == "mbx ingest"
    partial = by_label[Path("megatron_lm__attn_bench_llama3_1b_40gpu_rank39__stdout.log").stem]
    assert partial["summary"]["tflops_per_gpu"] > 0 and "stopped at step 344 of 500" in partial["reason"]
    sink = by_label[LM_LOG.stem]
    assert sink["summary"]["tokens_per_s_per_gpu"] > 0, "seq_length/world_size from the log's argument dump"

    oom, watchdog = by_label["oom run"], by_label["watchdog run"]
    assert oom["state"] == "failed" and oom["failure_class"] == "oom" and "rank3.log" in oom["reason"]
    assert watchdog["state"] == "failed" and watchdog["failure_class"] == "infra"
    assert oom["params"] == {"env.NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": 128}
    assert sorted(p.name for p in (Path(oom["run_dir"]) / "logs").iterdir()) == [
        f"rank{i}.log" for i in range(4)
    ]

    table = mbx("campaign", "status", "past", "--workspace", str(workspace))
    assert table.returncode == 0 and "failed (oom)" in table.stdout
    report = mbx("report", "past", "--workspace", str(workspace), "--markdown")
    assert report.returncode == 0, report.stderr
    html = (workspace / "past" / "report" / "index.html").read_text()
    assert all(cell["cell_id"] in html for cell in status) and "oom" in html

    # the same logs again: nothing new; --replace adds a second attempt of the same cell
    db = sqlite3.connect(workspace / "mbx.sqlite")
    before = db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
    again = mbx("ingest", str(LM_LOG), "--campaign", "past", "--workspace", str(workspace))
    assert again.returncode == 0 and "already ingested" in again.stdout
    assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == before
    replaced = mbx("ingest", str(LM_LOG), "--campaign", "past", "--replace", "--seq-length", "4096",
                   "--workspace", str(workspace))  # fmt: skip
    assert replaced.returncode == 0, replaced.stderr
    rows = db.execute("SELECT attempt FROM attempts WHERE cell_id=?", (sink["cell_id"],)).fetchall()
    assert rows == [(1,), (2,)]
    resume = mbx("campaign", "resume", "past", "--workspace", str(workspace))
    assert resume.returncode == 2 and "nothing to resume" in resume.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.log"], "missing.log: no such file or folder"),
        ([str(DATA / "megatron" / "SOURCES.md")], "no Megatron-LM/Megatron-Bridge iteration lines"),
        (
            [str(DATA / "failures" / "config_argparse" / "case.json")],
            "no Megatron-LM/Megatron-Bridge iteration",
        ),
        (
            [str(LM_LOG), "--format", "megatron"],
            "--format: must be one of auto, megatron-lm, megatron-bridge",
        ),
        ([str(LM_LOG), "--campaign", "no spaces please"], "is not a campaign name"),
        ([str(LM_LOG), "--param", "novalue"], "--param 'novalue': expected KEY=VALUE"),
    ],
)
def test_ingest_bad_input_exits_2_and_writes_nothing(mbx, tmp_path, args, message):
    workspace = tmp_path / "ws"
    if "--campaign" not in args:
        args = [*args, "--campaign", "past"]
    result = mbx("ingest", *args, "--workspace", str(workspace))
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not workspace.exists(), "nothing half-written"


def test_ingested_run_is_the_baseline_of_a_new_campaign(mbx, write_campaign, tmp_path):
    workspace = tmp_path / "ws"
    result = mbx(
        "ingest",
        str(LM_LOG),
        "--campaign",
        "before",
        "--label",
        "last release",
        "--workspace",
        str(workspace),
    )
    assert result.returncode == 0, result.stderr
    path = write_campaign(
        {
            "name": "after",
            "trainer": {"kind": "command", "command": [sys.executable, str(FAKE), "--replay", str(LM_LOG)]},
            "sweep": {"axes": {"fake_slowdown": [1.0, 1.25]}},
            "gates": {"tflops_rel_baseline_min": -0.05},
            "baseline": "before",
            "launchers": {"local": {"parallel": 2}},
            "wandb": {"mode": "disabled"},
        }
    )
    run = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report")
    assert run.returncode == 1, run.stdout + run.stderr
    status = json.loads(mbx("campaign", "status", "after", "--workspace", str(workspace), "--json").stdout)["cells"]
    verdicts = {cell["params"]["fake_slowdown"]: cell["verdict"] for cell in status}
    assert verdicts == {1.0: "pass", 1.25: "fail"}
    assert "tflops_rel_baseline_min" in run.stdout and "below the minimum" in run.stdout

    # a campaign run from a file is not an ingest target (its cells would be mixed with foreign runs)
    refused = mbx("ingest", str(LM_LOG), "--campaign", "after", "--workspace", str(workspace))
    assert refused.returncode == 2 and "was run from a campaign file" in refused.stderr
    cell_dirs = [p.name for p in (workspace / "after").iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert sorted(cell_dirs) == sorted(c["cell_id"] for c in status)


def test_plan_writes_nothing_and_commit_writes_run_dir_and_rows(tmp_path):
    """The plan decides everything from the logs and the store; the commit writes the run dir and the rows."""
    from orchestrator.run.ingest import commit, ingest_campaign, parse, plan_ingest, sources
    from orchestrator.run.store import Store
    from trainer import rundir

    parsed = parse(sources([LM_LOG]), "auto", None, None, None)
    with Store(tmp_path / "ws") as store:
        plan = plan_ingest(store, ingest_campaign(store, "past"), parsed, "auto", seq_length=None, num_gpus=None,
                           label=None, params={"x": 1}, exit_code=None)  # fmt: skip
        assert not (tmp_path / "ws" / "past").exists(), "a plan writes nothing"
        assert (plan.attempt, plan.cell.trainer_kind, plan.status["state"]) == (1, "ingested", "completed")
        done = commit(store, plan)
        assert store.attempts("past", plan.cell.cell_id)[0].state == "completed"
        assert store.cells("past")[0].trainer_kind == "ingested"
    assert done.run_dir == plan.run_dir and rundir.read_status(done.run_dir)["written_by"] == rundir.INGEST
    assert rundir.read_launch(done.run_dir)["launcher"] == "ingest"
    assert len(rundir.read_metrics(done.run_dir)) == len(parsed.rows)
    assert [p.name for p in plan.run_dir.parent.iterdir()] == ["1"], "no temporary folder left behind"


def test_a_lost_store_never_reuses_an_ingested_run_dir(mbx, tmp_path):
    workspace = tmp_path / "ws"
    first = mbx("ingest", str(LM_LOG), "--campaign", "past", "--workspace", str(workspace))
    assert first.returncode == 0, first.stderr
    (workspace / "mbx.sqlite").unlink()
    again = mbx("ingest", str(LM_LOG), "--campaign", "past", "--workspace", str(workspace))
    assert again.returncode == 0, again.stderr
    (cell_dir,) = [p for p in (workspace / "past").iterdir() if p.is_dir()]
    assert sorted(p.name for p in cell_dir.iterdir()) == ["1", "2"]


def test_a_bridge_log_without_tokens_says_which_options_give_them(mbx, tmp_path):
    """A real Megatron-Bridge 0.6.2 log prints no argument dump (its sequence length) and no world size: ingest
    said nothing while tokens/s/GPU stayed empty; now a note names the options, and with them the figure is there."""
    log = DATA / "bridge-0.6.2" / "h100_sweep" / "d1a49eaa0e_moe-token-dispatcher-type-alltoall.log"
    workspace = tmp_path / "ws"
    bare = mbx("ingest", "bare", str(log), "--format", "megatron-bridge", "-w", str(workspace))
    assert bare.returncode == 0 and "give --seq-length and --num-gpus" in " ".join(bare.stderr.split())
    half = mbx("ingest", "half", str(log), "--format", "megatron-bridge", "-w", str(workspace), "--seq-length", "4096")
    assert "the log does not say its GPU count; give --num-gpus" in " ".join(half.stderr.split()), half.stderr
    given = mbx("ingest", "given", str(log), "--format", "megatron-bridge", "-w", str(workspace),
                "--seq-length", "4096", "--num-gpus", "1", "--json")  # fmt: skip
    assert "no tokens/s/GPU" not in given.stderr
    tokens = json.loads(given.stdout)["summary"]["tokens_per_s_per_gpu"]
    assert tokens == pytest.approx(8 * 4096 / 1.31711, rel=1e-3)  # 8 sequences of 4096 in 1317.11 ms a step
