"""`profile:` in a campaign: the real bundled trainer profiles those steps of every cell through the engine, and
reports/profile_view.py turns the traces into time per kernel class and stacked bars (escaped)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import TINY_MOE_RECIPE as TINY_RECIPE
from pydantic import ValidationError

from orchestrator.spec import profile_spec
from orchestrator.spec.profile_spec import Profile
from reports import kernels
from reports.profile_view import breakdown, profile_section, trace_breakdown

TRACES = Path(__file__).parent / "data" / "traces"


def profiled_campaign(steps: str = "2:2") -> dict:
    return {
        "name": "prof",
        "trainer": {
            "kind": "bundled",
            "recipe": {**TINY_RECIPE, "training": {**TINY_RECIPE["training"], "steps": 6}},
        },
        "resources": {"nodes": 1, "gpus_per_node": 1},
        "sweep": {"axes": {"model.moe.top_k": [1, 2]}},
        "collect": {"window": 2},
        "profile": {"steps": steps},
        "launcher": "local",
        "launchers": {"local": {"parallel": 2}},
        "wandb": {"mode": "disabled"},
    }


def test_campaign_profile_section_end_to_end(mbx, write_campaign, tmp_path, cache_env):
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(write_campaign(profiled_campaign())), "--workspace", str(workspace), "--no-report",
                 env=cache_env)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    run_dirs = sorted(p.parent for p in (workspace / "prof").glob("*/*/metrics.jsonl"))
    assert len(run_dirs) == 2
    cells = []
    for run_dir in run_dirs:
        assert (run_dir / "profile-trace.json").is_file(), sorted(p.name for p in run_dir.iterdir())
        assert "steps 2..3 (2 steps)" in (run_dir / "profile.txt").read_text()
        found = trace_breakdown(run_dir)
        assert found is not None and found.device == "cpu" and found.steps == 2
        shares = breakdown(run_dir)
        assert list(shares) == [c for c in kernels.ALL_CLASSES if c in shares]
        assert shares[kernels.GEMM] > 0 and shares[kernels.ATTENTION] > 0 and shares[kernels.OPTIMIZER] > 0
        assert shares[kernels.MOE_PERMUTE] > 0
        assert sum(shares.values()) - found.overlap_ms == pytest.approx(found.window_ms, rel=1e-6, abs=1e-4)  # ms: float sums of µs
        # the profiled steps are the ones the trainer timed: the window is about their step time
        rows = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
        step_ms = (rows[2]["step_time_ms"] + rows[3]["step_time_ms"]) / 2
        assert 0.5 * step_ms < found.window_ms < 1.5 * step_ms
        cells.append({"label": f"<script>alert(1)</script> top_k={run_dir.parent.name}", "run_dir": run_dir})
    html = profile_section([*cells, {"label": "never profiled", "run_dir": tmp_path}])
    assert html.count('class="pf-row"') == 2 and "never profiled" not in html
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'data-class="GEMM"' in html and html.startswith('<div class="mbx-profile">')
    assert html.count(" · vs &lt;script&gt;") == 1  # the second cell names what moved against the first


def test_no_trace_gives_nothing(tmp_path):
    assert breakdown(tmp_path) is None
    assert profile_section([{"label": "a", "run_dir": tmp_path}]) == ""
    assert profile_section([]) == "" and profile_section([{"label": "pending", "run_dir": None}]) == ""
    assert breakdown(None) is None
    (tmp_path / "profile-trace.json").write_text('{"traceEvents": [')  # torn by a killed trainer
    assert breakdown(tmp_path) is None


def test_recorded_trace_in_a_run_dir(tmp_path):
    """Kineto's own file name (Megatron's --use-pytorch-profiler) is found under the run dir's profile/."""
    (tmp_path / "profile").mkdir()
    source = TRACES / "cpu_quickstart_steps2-3.pt.trace.json.gz"
    (tmp_path / "profile" / source.name).write_bytes(source.read_bytes())
    shares = breakdown(tmp_path)
    assert shares is not None and shares[kernels.GEMM] > 0


def test_profile_steps_validated(mbx, write_campaign):
    assert Profile(steps=" 8 : 2 ").steps == "8:2" and Profile().window() == (8, 9)
    for bad in ("8", "0:2", "8:0", "a:b", "8:2:1"):
        with pytest.raises(ValidationError, match="START:COUNT"):
            Profile(steps=bad)
    result = mbx("campaign", "validate", str(write_campaign(profiled_campaign("8"))))
    assert result.returncode == 2 and "profile.steps" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    unquoted = write_campaign(
        yaml.safe_dump(profiled_campaign()).replace("steps: '2:2'", "steps: 2:2"), "raw.yaml"
    )
    result = mbx("campaign", "validate", str(unquoted))
    assert (
        result.returncode == 2 and "profile.steps: steps must be a quoted START:COUNT string" in result.stderr
    )
    assert 'write steps: "2:2" (got 122)' in result.stderr
    inside = mbx("campaign", "validate", str(write_campaign(profiled_campaign("4:2"), "inside.yaml")))
    assert inside.returncode == 2, inside.stdout + inside.stderr
    assert "inside the collect window (the last 2 of 6 steps); profile earlier steps, e.g. 3:2" in inside.stderr


def test_trainer_env_and_window_checks():
    from trainer.profiling import PROFILE_ENV

    assert profile_spec.TRAINER_PROFILE_ENV == PROFILE_ENV
    assert profile_spec.trainer_env(None) == {}
    assert profile_spec.trainer_env(Profile(steps="3:2")) == {PROFILE_ENV: "3:2"}
    assert profile_spec.trainer_env(Profile(tool="nsys")) == {
        PROFILE_ENV: "8:2"
    }  # the bundled trainer: torch
    assert profile_spec.window_problem(Profile(steps="8:2"), 30, 10) is None
    assert "collect window" in profile_spec.window_problem(Profile(steps="25:2"), 30, 10)
    assert "runs 6 steps" in profile_spec.window_problem(Profile(steps="8:2"), 6, 2)


def test_nsys_and_megatron_switches(tmp_path):
    profile = Profile(steps="8:2")
    prefix = profile_spec.nsys_prefix(profile, tmp_path, nsys="/usr/bin/nsys")
    assert prefix[:2] == ["/usr/bin/nsys", "profile"] and str(tmp_path / "profile.rank%q{RANK}") in prefix
    assert profile_spec.nsys_prefix(Profile(tool="torch"), tmp_path, nsys="/usr/bin/nsys") == []
    # Megatron starts at 0-based iteration 7 (logged as step 8) and stops at 9: steps 8 and 9
    assert profile_spec.megatron_args(profile) == [
        "--profile",
        "--profile-step-start",
        "7",
        "--profile-step-end",
        "9",
    ]
    megatron = ["python", "pretrain_gpt.py", "--train-iters", "20"]
    argv = profile_spec.command_argv(profile, megatron, tmp_path, nsys="/usr/bin/nsys")
    assert argv == [*prefix, *megatron, *profile_spec.megatron_args(profile)]
    assert profile_spec.command_argv(profile, ["./train.sh"], tmp_path, nsys="/usr/bin/nsys") == [
        "./train.sh"
    ]
    assert profile_spec.command_argv(None, megatron, tmp_path, nsys="/usr/bin/nsys") == megatron


def nsys_export(path: Path) -> None:
    """A small SQLite file in the layout of `nsys export --type sqlite` (the tables and columns read)."""
    import sqlite3

    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);"
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT,"
        " correlationId INT, demangledName INT, shortName INT);"
        "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT, end INT, deviceId INT, streamId INT, correlationId INT);"
        "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, globalTid INT, correlationId INT, nameId INT);"
        "CREATE TABLE NVTX_EVENTS (start INT, end INT, globalTid INT, text TEXT, textId INT);"
    )
    names = ["nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", "ncclDevKernel_SendRecv(...)", "cudaLaunchKernel",
             "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>(...)"]  # fmt: skip
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(names)))
    us = 1000  # nsys times are ns
    for step in range(2):  # two captured steps of 100 µs, as in tests/test_kernels.py's synthetic trace
        t = (1000 + 100 * step) * us
        db.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 7, ?, 0, 0)",
            (t, t + 40 * us, 10 * step + 1),
        )
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 20, ?, 1, 1)",
                   (t + 30 * us, t + 60 * us, 10 * step + 2))  # fmt: skip
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 7, ?, 3, 3)",
                   (t + 70 * us, t + 80 * us, 10 * step + 3))  # fmt: skip
        db.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, 0, 7, ?)", (t + 90 * us, t + 95 * us, 99)
        )
        for corr, launch in ((1, 1), (2, 5), (3, 61)):
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, 2)",
                       (t + launch * us, t + launch * us + 500, 10 * step + corr))  # fmt: skip
        db.execute(
            "INSERT INTO NVTX_EVENTS VALUES (?, ?, 1, 'alltoall dispatch', NULL)", (t + 4 * us, t + 7 * us)
        )
        db.execute(
            "INSERT INTO NVTX_EVENTS VALUES (?, ?, 1, 'optimizer step', NULL)", (t + 60 * us, t + 80 * us)
        )
    db.commit()
    db.close()


def test_nsys_export_of_a_command_trainer(tmp_path):
    """A run dir holding an Nsight Systems SQLite export (a command trainer under nsys): the same classes,
    with the NVTX ranges as launch context and the step count from the recorded Megatron argv."""
    from reports.profile_nsys import NSYS_SQLITE

    nsys_export(tmp_path / NSYS_SQLITE)
    (tmp_path / "recipe.yaml").write_text(
        "argv: [python, pretrain_gpt.py, --profile, --profile-step-start, '7', --profile-step-end, '9']\n"
    )
    found = trace_breakdown(tmp_path)
    assert found is not None and found.device == "gpu" and found.steps == 2
    c = found.classes
    assert c[kernels.GEMM] == pytest.approx(0.040)
    assert c[kernels.MOE_EXCHANGE] == pytest.approx(0.030)  # send/recv launched inside the 'alltoall' range
    assert c[kernels.OPTIMIZER] == pytest.approx(0.010)
    assert c[kernels.MEMCPY] == pytest.approx(0.005)
    assert found.overlap_ms == pytest.approx(0.010)


def test_a_one_rank_nsys_report_is_found(tmp_path, monkeypatch):
    """Review: a one-rank local run starts without torchrun, so nsys expands `profile.rank%q{RANK}` with RANK
    unset: `profile.rank.nsys-rep`. The report and `mbx profile show` read it too (they looked for rank0 only).
    `nsys` here is a stand-in that writes the export the real one would (the SQLite of nsys_export)."""
    import os
    import stat

    from reports.profile_view import trace_file

    export = tmp_path / "made.sqlite"
    nsys_export(export)
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n# nsys export --type sqlite --output OUT REPORT\ncp {export} \"$5\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "profile.rank.nsys-rep").write_bytes(b"report")
    (run_dir / "recipe.yaml").write_text(
        "argv: [python, pretrain_gpt.py, --profile, --profile-step-start, '7', --profile-step-end, '9']\n"
    )
    assert trace_file(run_dir) == run_dir / "profile.rank.nsys-rep"
    found = trace_breakdown(run_dir)
    assert found is not None and found.device == "gpu" and found.steps == 2
    assert found.classes[kernels.GEMM] == pytest.approx(0.040)


def test_mbx_profile_show_markdown_and_json(tmp_path):
    from typer.testing import CliRunner

    from orchestrator.cli.profile import app

    trace = TRACES / "cpu_quickstart_steps2-3.pt.trace.json.gz"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "profile-trace.json.gz").write_bytes(trace.read_bytes())
    shown = CliRunner().invoke(app, ["show", str(run_dir), str(trace)])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0] == "Where the time goes (CPU ms per profiled step by kernel class)"
    assert lines[2].startswith("| cell | step (ms) | GEMM | attention |") and len(lines) == 6
    assert lines[4].split("|")[2:] == lines[5].split("|")[2:]  # the same trace, as a run dir and as a file
    as_json = CliRunner().invoke(app, ["show", "--json", str(trace)])
    figures = json.loads(as_json.output)[str(trace)]
    assert figures["device"] == "cpu" and figures["steps"] == 2 and figures["classes"]["GEMM"] > 0
    missing = CliRunner().invoke(app, ["show", str(tmp_path / "nowhere")])
    assert missing.exit_code != 0 and "no such file" in str(missing.exception)
