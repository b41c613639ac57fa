"""The allocation's real GPU (issue 31, item 8): every attempt records its GPU (name, memory) on the node before
the trainer starts; a point that cannot fit it is refused there, recorded infeasible with the reason and never
started, while the others run; the headroom gate, the report and `mbx campaign plan --gpu auto` show the real
GPU. No GPU needed: a stand-in nvidia-smi (tests/fixtures_cmd/fake_nvidia_smi.py, an external tool's double) on
PATH reports an H100 80 GB (81,559 MiB → 79.6 GiB) to campaigns planned for an H200 (139.8 GiB)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAKE_MEGATRON, MEGATRON_LOG, ROOT

from orchestrator.run.store import Store
from trainer import rundir

pytest_plugins = ["slurm_cluster"]

FAKE_SMI = ROOT / "tests" / "fixtures_cmd" / "fake_nvidia_smi.py"
H100 = "NVIDIA H100 80GB HBM3"
H200_FILE = ROOT / "campaigns" / "seed003_parallel_search_h200.yaml"
# the shipped H200 search's points that fit the H200 but not the H100's 79.6 GiB (estimate + allocator slack)
H100_TOO_SMALL = ["micro_batch_size=4, cross_entropy=native, recompute=none",
                  "micro_batch_size=4, cross_entropy=native, recompute=full",
                  "micro_batch_size=8, cross_entropy=native, recompute=full",
                  "micro_batch_size=16, cross_entropy=fused, recompute=none"]  # fmt: skip


@pytest.fixture
def fake_gpu(tmp_path: Path):
    """An environment whose PATH has `nvidia-smi` listing `gpus` ("name|MiB;..."; "" lists none)."""

    def env(gpus: str = f"{H100}|81559") -> dict[str, str]:
        bin_dir = tmp_path / "fake-bin"
        bin_dir.mkdir(exist_ok=True)
        shim = bin_dir / "nvidia-smi"
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE_SMI))} "$@"\n')
        shim.chmod(0o755)
        return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "FAKE_NVIDIA_SMI_GPUS": gpus}

    return env


def h200_command_campaign() -> dict:
    """The fake Megatron (replays a real log: peak 19.8 GiB) planned for an H200 with a 10 GiB headroom gate:
    hidden 1024 and 8192 fit an H100 too, 10240 (93 GiB by its estimate) only the H200, 12288 neither."""
    return {
        "name": "h200-on-h100",
        "trainer": {
            "kind": "command",
            "command": [sys.executable, str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0"],
            "params": {
                "num_layers": 4,
                "hidden_size": 1024,
                "num_attention_heads": 16,
                "seq_length": 2048,
                "vocab_size": 32000,
                "micro_batch_size": 1,
                "global_batch_size": 8,
                "bf16": True,
            },
            "log_format": "megatron-lm",
        },  # fmt: skip
        "resources": {"gpu": "H200"},
        "sweep": {"axes": {"params.hidden_size": [1024, 8192, 10240, 12288]}},
        "gates": {"headroom_gib_min": 10},
        "wandb": {"mode": "disabled"},
    }


def test_h200_campaign_on_an_80gb_card_refuses_what_cannot_fit(mbx, write_campaign, tmp_path, fake_gpu):
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(write_campaign(h200_command_campaign())), "-w", str(workspace),
                 env=fake_gpu())  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "1 of 4 point(s) infeasible, skipped" in out  # hidden 12288: over the H200 already, at plan time
    assert "1 point(s) infeasible on the allocation's GPU, not run" in out
    assert "point [hidden_size=10240]: memory: estimated peak 93.1 GiB per GPU" in out
    assert f"exceeds the {H100}'s 79.6 GiB" in out and "PASS 2/2 completed" in out

    with Store(workspace) as store:
        active = {c.label: c for c in store.cells("h200-on-h100")}
        every = {c.label: c for c in store.cells("h200-on-h100", active_only=False)}
        attempts = {a.cell_id: a for a in store.attempts("h200-on-h100")}
        estimates = {r["label"]: r for r in store.estimates("h200-on-h100")}
        gates = {c.label: store.result("h200-on-h100", c.cell_id, 1).gate for c in active.values()}
    assert sorted(active) == ["hidden_size=1024", "hidden_size=8192"]  # the refused point left the active set
    refused = attempts[every["hidden_size=10240"].cell_id]
    assert refused.state == "failed" and refused.failure_class == rundir.INFEASIBLE
    row = estimates["hidden_size=10240"]
    assert not row["feasible"] and row["gpu"] == H100 and row["gpu_gib"] == 79.6 and row["headroom_gib"] < 0
    assert estimates["hidden_size=8192"]["feasible"] and estimates["hidden_size=8192"]["gpu"] == "H200"

    # the refused attempt: its node's GPU recorded, the reason in status.json, no trainer ever started
    run_dir = Path(refused.run_dir)
    node = rundir.read_node(run_dir)
    assert node["gpu_name"] == H100 and node["gpu_memory_gib"] == 79.6
    status = rundir.read_status(run_dir)
    assert status["failure_class"] == rundir.INFEASIBLE and rundir.read_exit(run_dir)["exit_code"] == 78
    assert f"{H100} has 79.6 GiB, the point needs 103.1 GiB per GPU" in status["reason"]
    assert "(planned on H200, 139.8 GiB); the trainer was not started" in status["reason"]
    assert "iteration" not in (run_dir / "logs" / "launcher.log").read_text()  # the fake Megatron never ran

    # the headroom gate on the GPU each run recorded (79.6 − 19.8), not the H200's 139.8
    for gate in gates.values():
        (check,) = [c for c in gate["checks"] if c["gate"] == "headroom_gib_min"]
        assert check["ok"] and check["value"] == pytest.approx(79.6 - 20306.24 / 1024)
        assert check["message"].endswith(f"(GPU as its node recorded it: {H100}, 79.6 GiB)")

    # the report: the gates line reads the GPU the runs had, the environment names it, the estimate shows it
    page = (workspace / "h200-on-h100" / "report" / "index.html").read_text()
    assert "gpu_memory_gib=79.6</code>" in page and "gpu_memory_gib=139.8" not in page
    assert H100 in page
    summary = (workspace / "h200-on-h100" / "report" / "summary.md").read_text()
    assert "`gpu_memory_gib=79.6`" in summary and H100 in summary

    # a resume runs nothing again: the refused point is out of the campaign, as one infeasible at plan time
    again = mbx("campaign", "resume", "h200-on-h100", "-w", str(workspace), "--no-report", env=fake_gpu())
    assert again.returncode == 0 and "PASS 2/2 completed (2 skipped: already completed)" in again.stdout


def test_every_point_refused_is_a_failure_not_a_pass(mbx, write_campaign, tmp_path, fake_gpu):
    data = h200_command_campaign()
    data["sweep"] = {"axes": {"params.hidden_size": [10240]}, "repeats": 2}
    result = mbx("campaign", "run", str(write_campaign(data)), "-w", str(tmp_path / "ws"), "--no-report",
                 env=fake_gpu())  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL 0/0 completed" in result.stdout and "infeasible, not run: memory:" in result.stdout
    assert "gates FAIL: every point (1) is infeasible, none ran" in result.stdout
    assert "1 point(s) infeasible on the allocation's GPU, not run" in result.stdout
    with Store(tmp_path / "ws") as store:  # the second repeat was dropped, not refused on its own
        assert [a.attempt for a in store.attempts("h200-on-h100")] == [1]
    # the one outcome owner says the same afterwards: status (a view, read-only) and regate
    status = mbx("campaign", "status", "h200-on-h100", "-w", str(tmp_path / "ws"), "--json")
    shown = json.loads(status.stdout)
    assert shown["verdict"] == "fail" and shown["exit_code"] == 1, status.stdout
    regated = mbx("campaign", "regate", "h200-on-h100", "-w", str(tmp_path / "ws"))
    assert regated.returncode == 1 and "gates FAIL: every point (1) is infeasible" in regated.stdout


def test_compare_run_counts_a_side_refused_on_its_gpu_as_not_run(mbx, write_campaign, tmp_path, fake_gpu):
    sides = []
    for name, hidden in (("fits", 8192), ("too-big", 10240)):  # 10240 fits the H200, not the H100 it gets
        data = h200_command_campaign()
        data["name"], data["trainer"]["params"]["hidden_size"] = name, hidden
        data["sweep"] = {"axes": {"params.micro_batch_size": [1]}}
        sides.append(str(write_campaign(data, f"{name}.yaml")))
    result = mbx("compare", "--run", *sides, "-w", str(tmp_path / "ws"), env=fake_gpu())
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "did not complete: infeasible, not run: memory:" in out and "Traceback" not in out


def test_without_a_gpu_nothing_is_refused_and_the_headroom_gate_uses_the_campaigns(
    mbx, write_campaign, tmp_path, fake_gpu
):
    data = h200_command_campaign()
    data["sweep"] = {"axes": {"params.hidden_size": [1024, 10240]}}
    result = mbx("campaign", "run", str(write_campaign(data)), "-w", str(tmp_path / "ws"), "--no-report",
                 env=fake_gpu(""))  # fmt: skip
    assert result.returncode == 0 and "PASS 2/2 completed" in result.stdout, result.stdout + result.stderr
    with Store(tmp_path / "ws") as store:
        gates = [store.result("h200-on-h100", c.cell_id, 1).gate for c in store.cells("h200-on-h100")]
    messages = [c["message"] for g in gates for c in g["checks"] if c["gate"] == "headroom_gib_min"]
    assert messages and all(m.endswith("(the campaign's GPU, 139.8 GiB)") for m in messages)


def test_plan_gpu_auto_reads_the_card_and_the_shipped_h200_search_loses_four_points(mbx, fake_gpu, tmp_path):
    result = mbx("campaign", "plan", str(H200_FILE), "--gpu", "auto", env=fake_gpu())
    assert result.returncode == 0, result.stderr
    assert f"--gpu auto: this machine's GPU is {H100} (79.6 GiB) (nvidia-smi)" in result.stderr
    assert "7 of 16 point(s) infeasible, skipped" in result.stdout  # the H200's 3, and 4 more on 79.6 GiB
    for label in H100_TOO_SMALL:
        assert f"point [{label}]: memory: estimated peak" in result.stdout
    assert f"exceeds the {H100}'s 79.6 GiB" in result.stdout

    cells = json.loads(
        mbx("campaign", "plan", str(H200_FILE), "--gpu", "auto", "--json", env=fake_gpu()).stdout
    )
    assert {c["estimate"]["gpu"] for c in cells} == {H100} and {c["estimate"]["gpu_gib"] for c in cells} == {
        79.6
    }

    for env, why in ((fake_gpu(""), "nvidia-smi lists no GPU"),
                     ({"PATH": str(Path(sys.executable).parent)}, "there is no nvidia-smi on PATH")):  # fmt: skip
        none = mbx("campaign", "plan", str(H200_FILE), "--gpu", "auto", env=env)
        assert none.returncode == 2 and "Traceback" not in none.stderr, none.stderr
        assert f"--gpu auto: no GPU on this machine ({why})" in none.stderr


def test_the_shipped_h200_search_checks_its_gpu_on_the_node_before_the_trainer(mbx, fake_gpu, tmp_path):
    """The shipped H200 search: each point's need is the plan's (the four H100 misfits need more than 79.6
    GiB); its dry run's attempt carries it to the wrapper, which, run as printed, starts the trainer on a GPU
    big enough and never on one too small."""
    plan = json.loads(mbx("campaign", "plan", str(H200_FILE), "--json").stdout)
    need = {c["estimate"]["label"]: c["estimate"]["need_gib"] for c in plan}
    assert all(79.6 < need[label] <= 139.8 for label in H100_TOO_SMALL)

    dry = mbx("campaign", "run", str(H200_FILE), "--dry-run", "-w", str(tmp_path / "ws"))
    assert dry.returncode == 0, dry.stdout + dry.stderr
    (argv,) = [shlex.split(line[2:]) for line in dry.stdout.splitlines() if line.startswith("$ ")]
    first = "micro_batch_size=2, cross_entropy=native, recompute=none"  # halving's first batch
    assert argv[argv.index("--gpu-min-gib") + 1] == f"{need[first]:g}" and "H200, 139.8 GiB" in argv
    run_dir = Path(argv[argv.index("--run-dir") + 1])
    marker = tmp_path / "trainer-started"
    wrapper = argv[: argv.index("--") + 1] + [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]

    def run_on(gpus: str) -> int:
        env = {**os.environ, **fake_gpu(gpus), "PYTHONPATH": str(ROOT)}
        return subprocess.run(wrapper, env=env, capture_output=True, text=True, timeout=60).returncode

    assert run_on("NVIDIA A100-SXM4-40GB|40960") == 78 and not marker.exists()  # 40.0 GiB < its 69.7
    status = rundir.read_status(run_dir)
    assert (
        status["failure_class"] == rundir.INFEASIBLE
        and "NVIDIA A100-SXM4-40GB has 40.0 GiB" in status["reason"]
    )
    assert rundir.read_node(run_dir)["gpu_memory_gib"] == 40.0
    assert run_on(f"{H100}|81559") == 0 and marker.exists()  # 79.6 GiB: it fits, the command runs


@pytest.mark.parametrize("rank", [0, 1])
def test_the_rank_entry_refuses_a_point_its_gpu_cannot_hold_on_every_rank(tmp_path, fake_gpu, rank):
    """rank.py as srun starts it, with a task entry whose point needs 100 GiB: on the 79.6 GiB GPU no rank
    starts its command (rank 0 records why; another rank exits 78 instead of waiting for a rank 0 that never
    comes); the same entry without a need runs."""
    run_dir, marker = tmp_path / "run", tmp_path / "started"
    entry = {"cell_id": "c", "attempt": 1, "run_dir": str(run_dir), "env": {}, "time_limit_s": None,
             "argv": [sys.executable, "-c", f"open({str(marker)!r}, 'w')"], "container_image": None,
             "git_sha": None, "gpu_need": {"min_gib": 100.0, "planned": "H200, 139.8 GiB"}}  # fmt: skip
    table = tmp_path / "tasks.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(fake_gpu(), SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank), SLURM_NODEID="0",
               SLURM_JOB_NODELIST="localhost", SLURM_JOB_ID="7", SLURM_NTASKS_PER_NODE="2")  # fmt: skip
    rank_py = [sys.executable, "-u", str(ROOT / "launchers" / "node" / "rank.py"), "--tasks", str(table)]

    table.write_text(json.dumps([entry]))
    done = subprocess.run(rank_py, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 78 and not marker.exists(), done.stdout + done.stderr
    log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
    assert f"infeasible on this allocation's GPU: {H100} has 79.6 GiB, the point needs 100.0 GiB" in log
    if rank == 0:
        assert rundir.read_status(run_dir)["failure_class"] == rundir.INFEASIBLE
        assert rundir.read_node(run_dir)["gpu_name"] == H100
    else:  # rank 0 owns the run dir's records
        assert rundir.read_status(run_dir) is None

    table.write_text(json.dumps([{**entry, "gpu_need": None}]))
    ran = subprocess.run(rank_py, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert marker.exists(), ran.stdout + ran.stderr


@pytest.mark.slurm
def test_on_slurm_the_job_checks_its_gpu_before_the_trainer(slurm, mbx, write_campaign, tmp_path, fake_gpu):
    """The same H200 campaign through submitit on a real Slurm, 2 ranks a point: inside each job, rank 0 reads
    the node's GPU (the fake H100 on the job's PATH) and refuses the point that cannot fit; rank 1 never starts
    its trainer either; the other point runs and its headroom gate is judged on the node's GPU."""
    data = h200_command_campaign()
    data["sweep"] = {"axes": {"params.hidden_size": [1024, 10240]}}
    data.update(resources={"nodes": 1, "gpus_per_node": 2, "gpu": "H200"},
                cluster={"gpus": False, "python": sys.executable},
                launchers={"submitit": {"poll_interval_s": 1, "poll_max_interval_s": 2}})  # fmt: skip
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(write_campaign(data)), "--launcher", "submitit", "-w", str(workspace),
                 "--no-report", env={**slurm.env, **fake_gpu()})  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "1 point(s) infeasible on the allocation's GPU" in result.stdout
        and "PASS 1/1 completed" in result.stdout
    )
    with Store(workspace) as store:
        by_label = {c.label: c for c in store.cells("h200-on-h100", active_only=False)}
        attempts = {a.cell_id: a for a in store.attempts("h200-on-h100")}
        (kept,) = store.cells("h200-on-h100")
        gate = store.result("h200-on-h100", kept.cell_id, 1).gate
    refused = attempts[by_label["hidden_size=10240"].cell_id]
    assert refused.failure_class == rundir.INFEASIBLE and refused.job_id  # it was a Slurm job
    logs = Path(refused.run_dir) / "logs"
    # rank 1 refuses on its own, unless srun's --kill-on-bad-exit ended it first (rank 0 exited 78 before rank 1's
    # nvidia-smi answered: seen on a loaded machine); either way it started nothing
    rank1 = (logs / "rank-1.log").read_text() if (logs / "rank-1.log").exists() else ""
    assert rank1 == "" or "infeasible on this allocation's GPU" in rank1, rank1
    assert all("iteration" not in p.read_text() for p in logs.glob("rank-*.log"))  # no trainer started
    (check,) = [c for c in gate["checks"] if c["gate"] == "headroom_gib_min"]
    assert check["message"].endswith(f"(GPU as its node recorded it: {H100}, 79.6 GiB)")


def test_a_points_need_is_exactly_where_feasibility_turns(tmp_path):
    """The number the node checks (`need_gib`) is the plan's own rule: on a GPU of that size each point of the
    shipped H200 search is feasible (headroom gate included), 0.01 GiB less and it is not."""
    from orchestrator.run.feasibility import Card, Limits, assess
    from orchestrator.spec.loader import load_campaign
    from orchestrator.trainers import expand, memory_estimate

    campaign = load_campaign(H200_FILE)
    points = expand(campaign, H200_FILE, strict=False)
    limits = Limits(
        campaign.gates.headroom_gib_min
    )  # the gate's 10 GiB (the search's peak limit is no GPU's)
    for row in assess(points, memory_estimate, "H200", limits).rows:
        cells = [p for p in points if p.point_id == row.point_id]
        fits = assess(cells, memory_estimate, Card("GPU", row.need_gib), limits).rows[0]
        short = assess(cells, memory_estimate, Card("GPU", row.need_gib - 0.01), limits).rows[0]
        assert fits.feasible and not short.feasible, (row.label, row.need_gib)


def test_the_headroom_gate_names_the_gpu_each_run_had():
    from reports.gates import headroom_check
    from reports.window import Summary

    def run(peak: float, gpu: str | None = None, memory: float | None = None) -> Summary:
        return Summary(steps=10, window_first_step=2, window_last_step=10, window_steps=9, step_time_ms=1.0,
                       step_time_ms_std=0.0, tflops_per_gpu=1.0, tokens_per_s_per_gpu=1.0, peak_alloc_gib=peak,
                       peak_reserved_gib=peak, first_loss=1.0, last_loss=1.0, loss_finite=True, nan_iterations=0,
                       skipped_iterations=0, gpu_name=gpu, gpu_memory_gib=memory)  # fmt: skip

    on_h100 = headroom_check(10, 139.8, [run(75.0, H100, 79.6)])
    assert on_h100.ok is False and on_h100.value == pytest.approx(4.6)
    assert on_h100.message.endswith(f"(GPU as its node recorded it: {H100}, 79.6 GiB)")
    planned = headroom_check(10, 139.8, [run(75.0)])
    assert planned.ok and planned.message.endswith("(the campaign's GPU, 139.8 GiB)")
    mixed = headroom_check(10, 139.8, [run(60.0, H100, 79.6), run(60.0), run(60.0, "NVIDIA H200", 139.8)])
    assert mixed.value == pytest.approx((19.6 + 79.8 + 79.8) / 3)
    assert mixed.message.endswith(f"(GPU as recorded: {H100}, 79.6 GiB; NVIDIA H200, 139.8 GiB; else the "
                                  "campaign's, 139.8 GiB)")  # fmt: skip
    assert headroom_check(10, None, [run(60.0)]).ok is None  # no GPU memory known: undecided
