"""`profile:` for Megatron-Bridge command trainers: the overrides mbx renders (torch and nsys), the refusals at
validate (the collect window, keys `profile:` sets itself), and `mbx profile show` on a run dir holding Bridge's
torch_profile/rank-0.json.gz, recorded here by real torch.profiler driven by the rendered overrides."""

from __future__ import annotations

import gzip
import json
import re
import shlex
from pathlib import Path

import pytest

from orchestrator.spec import profile_spec
from orchestrator.spec.profile_spec import Profile
from reports import kernels
from reports.profile_nsys import megatron_steps
from reports.profile_view import BRIDGE_TRACE_DIR, profile_section, trace_breakdown, trace_file

TORCH_OVERRIDES = [
    "profiling.use_pytorch_profiler=true", "profiling.use_nsys_profiler=false", "profiling.profile_step_start=16",
    "profiling.profile_step_end=18", "profiling.profile_ranks=[0]",
]  # fmt: skip
NSYS_OVERRIDES = [
    "profiling.use_nsys_profiler=true", "profiling.use_pytorch_profiler=false", "profiling.profile_step_start=15",
    "profiling.profile_step_end=17", "profiling.profile_ranks=[0]",
]  # fmt: skip


def bridge_campaign(profile: dict | None = None, params: dict | None = None, extra: list[str] = ()) -> dict:
    """A one-point Bridge command campaign of 30 steps with a window of 10 (as campaigns/bridge_qwen3_*)."""
    return {
        "name": "bridge-prof",
        "trainer": {
            "kind": "command",
            "command": [
                "python3",
                "-m",
                "trainer.bridge_entry",
                "--recipe",
                "qwen3_30b_a3b_pretrain_config",
                "--dataset",
                "mock",
                *extra,
                "{params}",
            ],  # fmt: skip
            "style": "megatron-bridge",
            "params": {"train": {"train_iters": 30, "global_batch_size": 8}, **(params or {})},
        },
        "resources": {"nodes": 1, "gpus_per_node": 1},
        "collect": {"window": 10},
        "launcher": "local",
        "wandb": {"mode": "disabled"},
        **({"profile": profile} if profile is not None else {}),
    }


def dry_run_argv(
    mbx, path: Path, workspace: Path, env: dict[str, str] | None = None
) -> tuple[list[str], Path]:
    """The trainer argv `mbx campaign run --dry-run` prints (after the jit_env wrapper) and the attempt's run dir."""
    result = mbx("campaign", "run", str(path), "--dry-run", "--workspace", str(workspace), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("$ "))
    words = shlex.split(line[2:])
    run_dir = Path(words[words.index("--run-dir") + 1])
    return words[words.index("launchers.node.jit_env") + 2 :], run_dir


def test_bridge_overrides_rendered(mbx, write_campaign, tmp_path):
    """tool torch (and auto): Bridge's torch profiler over steps 16..17, its trace under the run dir; tool nsys:
    nsys around the argv and Bridge's cudaProfilerStart/Stop switches (the Megatron-LM mapping)."""
    base, run_dir = dry_run_argv(mbx, write_campaign(bridge_campaign()), tmp_path / "ws")
    for tool in ("auto", "torch"):
        path = write_campaign(bridge_campaign({"steps": "16:2", "tool": tool}), f"{tool}.yaml")
        argv, _ = dry_run_argv(mbx, path, tmp_path / "ws")
        assert argv == [*base, *TORCH_OVERRIDES, f"logger.tensorboard_dir={run_dir}/tensorboard"]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nsys").write_text("#!/bin/sh\nexit 0\n")
    (fake / "nsys").chmod(0o755)
    path = write_campaign(bridge_campaign({"steps": "16:2", "tool": "nsys"}), "nsys.yaml")
    argv, _ = dry_run_argv(mbx, path, tmp_path / "ws", env={"PATH": f"{fake}:/usr/bin:/bin"})
    prefix = profile_spec.nsys_prefix(Profile(tool="nsys"), run_dir, nsys=str(fake / "nsys"))
    assert argv == [*prefix, *base, *NSYS_OVERRIDES]


def test_bridge_nsys_without_nsys_leaves_the_argv(tmp_path, monkeypatch):
    """No nsys to run it under: the argv is left alone (as for Megatron-LM), never half-switched."""
    monkeypatch.setenv("PATH", str(tmp_path))
    argv = ["python3", "-m", "trainer.bridge_entry", "train.train_iters=30"]
    assert profile_spec.command_argv(Profile(tool="nsys"), argv, tmp_path, style="megatron-bridge") == argv
    assert profile_spec.command_argv(Profile(), argv, tmp_path, style="megatron-bridge")[-1] == (
        f"logger.tensorboard_dir={tmp_path}/tensorboard"
    )


def test_bridge_window_refused_with_the_export_step(mbx, write_campaign):
    """Bridge's torch profiler writes the trace at the start of the step after the profiled ones: 19:2 slows step
    21, the first of the window (the last 10 of 30), so it is refused; nsys stops after step 20 and is not."""
    result = mbx("campaign", "validate", str(write_campaign(bridge_campaign({"steps": "19:2"}))))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert ("profile.steps: 19:2 reaches step 21 (Bridge's torch profiler writes the trace of steps 19..20 at the "
            "start of step 21), inside the collect window (the last 10 of 30 steps); profile earlier steps, e.g. "
            "18:2") in result.stderr  # fmt: skip
    for ok in ({"steps": "18:2"}, {"steps": "19:2", "tool": "nsys"}):
        result = mbx("campaign", "validate", str(write_campaign(bridge_campaign(ok), "ok.yaml")))
        assert result.returncode == 0, (ok, result.stdout + result.stderr)
    result = mbx("campaign", "validate", str(write_campaign(bridge_campaign({"steps": "29:1"}), "late.yaml")))
    assert result.returncode == 2 and "profile.steps: 29:1 reaches step 30 (Bridge's" in result.stderr
    result = mbx("campaign", "validate", str(write_campaign(bridge_campaign({"steps": "30:1"}), "past.yaml")))
    assert result.returncode == 2 and "profiles up to step 31 (Bridge" in result.stderr
    assert "but the point runs 30 steps" in result.stderr  # the trace would never be written


def test_keys_profile_sets_are_refused(mbx, write_campaign):
    """A campaign that sets profiling.* (or, for the torch profiler, logger.tensorboard_dir) besides `profile:`
    is refused naming the key path it came from, not silently given the key twice."""
    cases = [
        (bridge_campaign({"steps": "8:2"}, params={"profiling": {"use_pytorch_profiler": True}}),
         "trainer.params.profiling.use_pytorch_profiler: 'profiling.use_pytorch_profiler=true' sets "
         "profiling.use_pytorch_profiler, which the campaign's `profile:` sets itself"),
        (bridge_campaign({"steps": "8:2"}, extra=["logger.tensorboard_dir=/tmp/tb"]),
         "trainer.command: 'logger.tensorboard_dir=/tmp/tb' sets logger.tensorboard_dir"),
        (bridge_campaign({"steps": "8:2", "tool": "nsys"}, extra=["++profiling.profile_step_start=3"]),
         "trainer.command: '++profiling.profile_step_start=3' sets profiling.profile_step_start"),
    ]  # fmt: skip
    for i, (campaign, said) in enumerate(cases):
        result = mbx("campaign", "validate", str(write_campaign(campaign, f"dup{i}.yaml")))
        assert result.returncode == 2, result.stdout + result.stderr
        assert said in result.stderr and "Traceback" not in result.stderr
    allowed = [  # nsys leaves tensorboard alone; without `profile:` the campaign's own profiling stands
        bridge_campaign({"steps": "8:2", "tool": "nsys"}, extra=["logger.tensorboard_dir=/tmp/tb"]),
        bridge_campaign(None, params={"profiling": {"use_pytorch_profiler": True}}),
    ]
    for i, campaign in enumerate(allowed):
        result = mbx("campaign", "validate", str(write_campaign(campaign, f"ok{i}.yaml")))
        assert result.returncode == 0, result.stdout + result.stderr


def test_megatron_lm_command_window_and_switches(mbx, write_campaign):
    """Style megatron-lm (nsys where found): the profiled steps are checked against the window too, and a
    --profile switch of its own is refused; tool torch leaves Megatron's switches to the campaign."""
    campaign = bridge_campaign({"steps": "25:2"})
    campaign["trainer"].update(style="megatron-lm", command=["python3", "pretrain_gpt.py", "{params}"],
                               params={"train_iters": 30})  # fmt: skip
    result = mbx("campaign", "validate", str(write_campaign(campaign)))
    assert (
        result.returncode == 2
        and "profile.steps: 25:2 reaches step 26, inside the collect window" in result.stderr
    )
    campaign["profile"] = {"steps": "8:2"}
    campaign["trainer"]["params"]["profile_step_start"] = 3
    result = mbx("campaign", "validate", str(write_campaign(campaign, "dup.yaml")))
    assert result.returncode == 2
    assert (
        "trainer.params.profile_step_start: '--profile-step-start' sets --profile-step-start" in result.stderr
    )
    campaign["profile"] = {"steps": "25:2", "tool": "torch"}
    result = mbx("campaign", "validate", str(write_campaign(campaign, "torch.yaml")))
    assert result.returncode == 0, result.stdout + result.stderr


def bridge_like_run(argv: list[str], train_iters: int) -> None:
    """Drive real torch.profiler from the overrides the way megatron-bridge 0.6.2 does (training/profiling.py's
    initialize_pytorch_profiler, train.py's loop): schedule(wait=start-1, warmup=1, active=end-start), started
    before the loop, prof.step() at the top of each iteration, the trace exported to
    <logger.tensorboard_dir>/../torch_profile/rank-0.json.gz. A few matmuls per step on the CPU."""
    import torch

    overrides = dict(item.split("=", 1) for item in argv if "=" in item)
    start, end = int(overrides["profiling.profile_step_start"]), int(overrides["profiling.profile_step_end"])
    tensorboard = overrides["logger.tensorboard_dir"]

    def export(prof: torch.profiler.profile) -> None:
        folder = Path(f"{tensorboard}/../torch_profile")
        folder.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(f"{folder}/rank-0.json.gz")

    schedule = torch.profiler.schedule(wait=max(start - 1, 0), warmup=1 if start > 0 else 0, active=end - start,
                                       repeat=1)  # fmt: skip
    prof = torch.profiler.profile(schedule=schedule, on_trace_ready=export)
    prof.start()
    weights = torch.randn(256, 256)
    for _ in range(train_iters):
        prof.step()
        x = torch.randn(256, 256)
        for _ in range(4):
            x = torch.relu(x @ weights)
    prof.stop()


def test_profile_show_on_a_bridge_run_dir(mbx, tmp_path):
    """The rendered overrides record steps 3..4 (ProfilerStep#3, #4) into <run dir>/torch_profile/rank-0.json.gz;
    `mbx profile show` and the report's section read it per profiled step, not per trace."""
    run_dir = tmp_path / "ws" / "c" / "1"
    (run_dir / "logs").mkdir(parents=True)
    argv = profile_spec.command_argv(
        Profile(steps="3:2"), ["python3", "x.py"], run_dir, style="megatron-bridge"
    )
    bridge_like_run(argv, train_iters=7)
    trace = run_dir / BRIDGE_TRACE_DIR / "rank-0.json.gz"
    assert trace_file(run_dir) == trace
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    steps = {e["name"]: e["dur"] for e in events if re.fullmatch(r"ProfilerStep#\d+", str(e.get("name")))}
    assert sorted(steps) == [
        "ProfilerStep#3",
        "ProfilerStep#4",
    ]  # 1-based steps 3 and 4, as profile.steps says
    result = mbx("profile", "show", str(run_dir), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    shown = json.loads(result.stdout)[str(run_dir)]
    assert shown["device"] == "cpu" and shown["steps"] == 2 and shown["source"] == str(trace)
    # per profiled step: the mean ProfilerStep range (µs timestamps of ~1e12: within a microsecond)
    assert shown["window_ms"] == pytest.approx(sum(steps.values()) / 2 / 1000.0, abs=2e-3)
    assert shown["classes"][kernels.GEMM] > 0
    table = mbx("profile", "show", str(run_dir))
    assert table.returncode == 0 and f"| {run_dir} | {shown['window_ms']:.2f} |" in table.stdout
    assert "GEMM" in table.stdout.splitlines()[2]
    html = profile_section([{"label": "bridge", "run_dir": run_dir}])
    assert 'data-class="GEMM"' in html
    found = trace_breakdown(run_dir)
    assert found is not None and found.steps == 2


def test_lowest_rank_first(tmp_path):
    """Bridge's trace of rank 0 first (ranks compared as numbers)."""
    folder = tmp_path / BRIDGE_TRACE_DIR
    folder.mkdir()
    for rank in (10, 2):
        (folder / f"rank-{rank}.json.gz").write_bytes(b"")
    assert trace_file(tmp_path) == folder / "rank-2.json.gz"
    (folder / "rank-0.json.gz").write_bytes(b"")
    assert trace_file(tmp_path) == folder / "rank-0.json.gz"


def test_bridge_nsys_steps_from_the_recorded_argv(tmp_path):
    """An nsys run's step count (its report has no ProfilerStep ranges) from Bridge's recorded overrides."""
    argv = profile_spec.bridge_argv(
        Profile(steps="16:3", tool="nsys"), ["python3", "x.py"], tmp_path, nsys="nsys"
    )
    (tmp_path / "recipe.yaml").write_text(json.dumps({"argv": argv}))
    assert megatron_steps(tmp_path) == 3
