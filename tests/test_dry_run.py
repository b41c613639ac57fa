"""Rendering without a cluster: golden sbatch files, quoting of hostile values, describe() (what `--dry-run`
prints), render purity, and the `mbx campaign run FILE --dry-run` CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from launchers.backends.submitit_slurm import SubmititLauncher, SubmititSettings
from launchers.base import LaunchSpec, Resources
from launchers.profile import SlurmProfile
from launchers.slurm.render import slurm_minutes, wrapper_limit_s

GOLDEN = Path(__file__).parent / "golden" / "sbatch"
UPDATE = os.environ.get("MBX_UPDATE_GOLDEN") == "1"
HOSTILE = "a 'b' \"c\" $(touch CANARY1) `touch CANARY2`; touch CANARY3 && x|y >z \\"


def profile(cluster: dict | None = None, container: dict | None = None) -> SlurmProfile:
    """The profile a campaign with these `cluster` / `container` sections gives its launcher."""
    return SlurmProfile.model_validate({
        "cluster": cluster if cluster is not None else {"partition": "debug", "gpus": False, "python": "python3"},
        "container": container or {},
    })  # fmt: skip


def spec(
    workspace: Path, cell: str, nodes: int = 1, ranks: int = 2, minutes: float | None = None, **kw
) -> LaunchSpec:
    run_dir = workspace / "golden" / cell / "1"
    return LaunchSpec(
        campaign="golden",
        cell_id=cell,
        attempt=1,
        run_dir=run_dir,
        resources=Resources(nodes, ranks, minutes),
        module="trainer",
        args=["--recipe", str(run_dir / "recipe.yaml"), "--out", str(run_dir)],
        env=kw.get("env", {"MBX_NOTE": "hello world"}),
        env_pass=["HF_TOKEN", "WANDB_API_KEY"],
    )


def normalize(text: str, workspace: Path) -> str:
    return (
        text.replace(str(workspace.resolve()), "<WS>")
        .replace(str(workspace), "<WS>")
        .replace(str(ROOT), "<MBX>")
    )


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if not UPDATE:
            pytest.fail(f"golden file {path} was missing and has been written; check it in and rerun")
    assert text == path.read_text(), f"{name} differs from its golden file (MBX_UPDATE_GOLDEN=1 rewrites it)"


def test_time_limits() -> None:
    assert slurm_minutes(None) is None and slurm_minutes(0.2) == 1 and slurm_minutes(30) == 30
    assert slurm_minutes(30.01) == 31
    assert wrapper_limit_s(0.2, 30) == 12.0  # the asked limit, Slurm's is a whole minute
    assert wrapper_limit_s(30, 30) == 1770.0  # 30 s before Slurm's own kill
    assert wrapper_limit_s(None, 30) is None


def test_submitit_golden_arrays_per_shape(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    p = profile(cluster={"partition": "debug", "account": "acct", "qos": "high", "constraint": "h100&ib",
                         "exclusive": True, "gpus": True, "python": "python3", "sbatch_extra": {"mail_type": "END"}})  # fmt: skip
    settings = {"array_parallelism": 2, "sbatch_parameters": {"comment": "sweep"}}
    launcher = SubmititLauncher(SubmititSettings.model_validate(settings), workspace, p)
    specs = [spec(workspace, "aaaa-r0", minutes=20), spec(workspace, "bbbb-r0", minutes=20),
             spec(workspace, "cccc-r0", minutes=20), spec(workspace, "dddd-r0", nodes=2, ranks=4, minutes=60)]  # fmt: skip
    rendered = launcher.render(specs)
    assert [len(r.specs) for r in rendered] == [3, 1], "one array per shape (nodes, ranks, time limit)"
    assert "#SBATCH --array=0-2%2" in next(iter(rendered[0].scripts.values()))
    for index, item in enumerate(rendered):
        script = next(iter(item.scripts.values()))
        check_golden(f"submitit_shape{index}.sbatch", normalize(script, workspace))
        assert item.submit_argv is None, "submitit's executor submits (sbatch is not called by mbx)"
        assert next(iter(item.scripts)).name == "%j_submission.sh" and next(iter(item.scripts)) not in item.files
    table = json.loads(rendered[0].files[next(p for p in rendered[0].files if p.name == "tasks.json")])
    assert [t["cell_id"] for t in table] == ["aaaa-r0", "bbbb-r0", "cccc-r0"]
    assert table[0]["env"]["MBX_NOTE"] == "hello world" and "HF_TOKEN" not in table[0]["env"]
    assert table[0]["env_passed_by_name"] == ["HF_TOKEN", "WANDB_API_KEY"]
    assert table[0]["argv"][:4] == ["python3", "-u", "-m", "trainer"]
    assert table[0]["time_limit_s"] == 1170.0
    # render is pure: same input, same output, nothing written
    assert [r.files for r in launcher.render(specs)] == [r.files for r in rendered]
    assert not workspace.exists()


def test_submitit_golden_container(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    p = profile(container={"image": "nvcr.io#nvidia/pytorch:25.01-py3", "mounts": ["/lustre/data:/data:ro"],
                           "workdir": "/workspace"})  # fmt: skip
    launcher = SubmititLauncher(None, workspace, p)
    (item,) = launcher.render([spec(workspace, "aaaa-r0")])
    script = next(iter(item.scripts.values()))
    check_golden("submitit_container.sbatch", normalize(script, workspace))
    assert "--container-image=nvcr.io#nvidia/pytorch:25.01-py3" in script
    assert f"--container-mounts=/lustre/data:/data:ro,{ROOT}:{ROOT}," in script
    assert "--container-workdir=/workspace" in script and "--container-env=HF_TOKEN,WANDB_API_KEY" in script
    assert "hello world" not in script, "environment values go through the task table, not the script"


def test_describe_is_what_submit_writes_and_runs(tmp_path: Path) -> None:
    """describe() (what `mbx campaign run --dry-run` prints) shows every file submit() writes, byte for byte, the
    job script submitit will write and the command each task runs (tests/test_slurm_submitit.py submits it)."""
    launcher = SubmititLauncher(None, tmp_path, profile())
    specs = [spec(tmp_path, "aaaa-r0"), spec(tmp_path, "bbbb-r0")]
    (item,) = launcher.render(specs)
    printed = item.describe()
    script_path, script = next(iter(item.scripts.items()))
    assert f"# ---- {script_path}\n{script.rstrip()}" in printed and "$ " not in printed
    assert "# each task runs (a submitit.helpers.CommandFunction): srun --unbuffered --kill-on-bad-exit=1 " in script
    table_path, table = next((p, t) for p, t in item.files.items() if p.name == "tasks.json")
    assert f"# ---- {table_path} (read by the ranks; no shell sees it)\n{table.rstrip()}" in printed
    assert not tmp_path.joinpath("golden").exists(), "render() and describe() write nothing"


def test_local_describe_shows_the_attempt_wrapper_and_torchrun(tmp_path: Path) -> None:
    from launchers.backends.local import LocalLauncher

    launcher = LocalLauncher({"parallel": 2}, tmp_path)
    one, two = spec(tmp_path, "aaaa-r0", ranks=1), spec(tmp_path, "bbbb-r0", ranks=2)
    first, second = launcher.render([one, two])
    assert launcher.max_in_flight == 2
    assert first.submit_argv[:3] == [sys.executable, "-m", "launchers.node.attempt"]
    assert first.submit_argv[first.submit_argv.index("--") + 1 :] == [
        sys.executable,
        "-u",
        "-m",
        "trainer",
        *one.args,
    ]
    assert "torch.distributed.run" in second.submit_argv and "--nproc-per-node" in second.submit_argv
    text = second.describe()
    assert text.startswith("# env set: ") and "MBX_RUN_DIR" in text and "\n$ " in text
    assert not tmp_path.joinpath("golden").exists()


def _fake_srun(bin_dir: Path, name: str = "srun") -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    out = bin_dir / f"{name}-argv.json"
    srun = bin_dir / name
    srun.write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(out)!r}, 'w'))\n"
    )
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    return out


def test_hostile_values_never_reach_a_shell(tmp_path: Path) -> None:
    """Run the rendered script under bash with a fake srun: every value arrives as one verbatim argument."""
    workspace = tmp_path / "w s'$(touch CANARY0)"
    p = profile(container={"image": "img" + HOSTILE, "mounts": ["/d" + HOSTILE.replace(",", "") + ":/d"],
                           "workdir": "/w" + HOSTILE},  # fmt: skip
                cluster={"partition": "p" + HOSTILE, "gpus": False, "python": "python3",
                         "sbatch_extra": {"comment": HOSTILE}})  # fmt: skip
    launcher = SubmititLauncher(SubmititSettings(container_auto_mounts=False), workspace, p)
    (item,) = launcher.render([spec(workspace, "aaaa-r0", env={"WEIRD": HOSTILE})])
    script_path, script = next(iter(item.scripts.items()))
    script_path = script_path.with_name("submission.sh")  # (as submitit writes it, under the job's id)
    for path, text in {**item.files, script_path: script}.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert subprocess.run(["bash", "-n", str(script_path)]).returncode == 0
    # the batch shell starts submitit's job entry with the folder as one argument (a fake python3 records it)
    entry_file = _fake_srun(tmp_path / "bin", name="python3")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": "0"}
    subprocess.run(["bash", str(script_path)], cwd=tmp_path, env=env, check=True, timeout=30)
    assert json.loads(entry_file.read_text()) == ["-u", "-m", "submitit.core._submit", str(script_path.parent)]
    # which runs the task's CommandFunction: the srun line, every value one verbatim argument (a fake srun)
    import submitit

    argv_file = _fake_srun(tmp_path / "bin")
    plan = launcher.plan(launcher.batch(item.specs))
    submitit.helpers.CommandFunction(plan.command, verbose=False, env=env)()
    argv = json.loads(argv_file.read_text())
    assert f"--container-image=img{HOSTILE}" in argv
    assert f"--container-workdir=/w{HOSTILE}" in argv
    table_path = str(next(p for p in item.files if p.name == "tasks.json"))
    assert argv[-4:] == ["--tasks", table_path, "--port-base", "20000"]
    assert not list(tmp_path.rglob("CANARY*")) and not list(Path.cwd().glob("CANARY*"))
    table = json.loads(next(t for p, t in item.files.items() if p.name == "tasks.json"))
    assert table[0]["env"]["WEIRD"] == HOSTILE
    # #SBATCH lines are comments to bash and single-quoted for sbatch
    assert re.search(r"^#SBATCH --partition='p.*'$", script, re.MULTILINE)


@pytest.mark.parametrize("where", ["partition", "image", "extra", "python"])
def test_control_characters_are_refused(tmp_path: Path, where: str) -> None:
    cluster: dict = {"partition": "debug", "gpus": False}
    container: dict = {}
    if where == "partition":
        cluster["partition"] = "debug\nrm -rf /"
    elif where == "image":
        container = {"image": "img\ntouch CANARY"}
    elif where == "python":
        cluster["python"] = "python3\ntouch CANARY"
    else:
        cluster["sbatch_extra"] = {"comment": "x\ny"}
    with pytest.raises(ValueError, match="control character"):
        SubmititLauncher(None, tmp_path, profile(cluster=cluster, container=container))


def test_unknown_sbatch_parameter_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown sbatch parameter 'gpu_count'; valid: .*gres"):
        SubmititSettings.model_validate({"sbatch_parameters": {"gpu_count": 2}})
    with pytest.raises(ValueError, match="set by mbx"):
        SubmititSettings.model_validate({"sbatch_parameters": {"nodes": 2}})


def _fake_slurm_bin(tmp_path: Path) -> tuple[Path, Path]:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    marker = tmp_path / "sbatch-called"
    for name in ("sbatch", "srun", "squeue", "sacct", "scancel"):
        tool = fake_bin / name
        tool.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\nexit 1\n')
        tool.chmod(0o755)
    return fake_bin, marker


def _attempt_rows(workspace: Path) -> int:
    db_path = workspace / "mbx.sqlite"
    if not db_path.exists():
        return 0
    db = sqlite3.connect(db_path)
    try:
        return db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
    finally:
        db.close()


def test_dry_run_cli_submits_nothing(tmp_path: Path, mbx, write_campaign) -> None:
    fake_bin, marker = _fake_slurm_bin(tmp_path)
    data = yaml.safe_load((ROOT / "campaigns" / "quickstart.yaml").read_text())
    data.update(
        resources={"nodes": 1, "gpus_per_node": 2}, cluster={"gpus": False}, wandb={"mode": "disabled"}
    )
    file = write_campaign(data)
    result = mbx("campaign", "run", str(file), "--dry-run", "--launcher", "submitit", "--workspace",
                 str(tmp_path / "ws"), env={"PATH": f"{fake_bin}:{os.environ['PATH']}"})  # fmt: skip
    assert "#SBATCH --array=0-3%4" in result.stdout, result.stdout + result.stderr
    assert "_submission.sh" in result.stdout and "launchers/node/rank.py --tasks" in result.stdout
    assert not marker.exists(), marker.read_text() if marker.exists() else ""
    assert "dry run: nothing submitted (4 attempt(s) rendered)" in result.stdout
    assert result.returncode == 0
    assert _attempt_rows(tmp_path / "ws") == 0, "a dry run records no attempt"


def test_dry_run_cli_renders_the_campaigns_own_launcher(tmp_path: Path, mbx, write_campaign) -> None:
    """`launcher: nemo-run` in the campaign: --dry-run shows NeMo-Run's scripts (not submitit's)."""
    pytest.importorskip("nemo_run", reason="pip install 'mbx[nemo]' (nemo-run==0.11.1, leptonai==0.27.3)")
    fake_bin, marker = _fake_slurm_bin(tmp_path)
    data = yaml.safe_load((ROOT / "campaigns" / "quickstart.yaml").read_text())
    data.update(resources={"nodes": 1, "gpus_per_node": 2}, cluster={"gpus": False}, wandb={"mode": "disabled"},
                launcher="nemo-run", sweep={"axes": {"model.moe.top_k": [1, 2]}})  # fmt: skip
    file = write_campaign(data)
    result = mbx("campaign", "run", str(file), "--dry-run", "--workspace", str(tmp_path / "ws"),
                 env={"PATH": f"{fake_bin}:{os.environ['PATH']}"})  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        result.stdout.count("Generated by NeMo Run") == 2
        and "$ sbatch --requeue --parsable " in result.stdout
    )
    assert "#SBATCH --array" not in result.stdout
    assert not marker.exists() and _attempt_rows(tmp_path / "ws") == 0


@pytest.mark.parametrize("chosen", ["nemo-run-local", "nemo-run"])
def test_nemo_run_local_is_its_own_backend(tmp_path: Path, mbx, write_campaign, chosen: str) -> None:
    """`launcher: nemo-run-local`, and its old spelling `launchers.nemo-run.executor: local`, render NeMo-Run's
    local executor (a task table, no sbatch); the old spelling keeps the name it was chosen by."""
    pytest.importorskip("nemo_run", reason="pip install 'mbx[nemo]' (nemo-run==0.11.1, leptonai==0.27.3)")
    from launchers.backends.nemo_run import NemoRunLauncher
    from launchers.backends.nemo_run_local import NemoRunLocalLauncher

    data = yaml.safe_load((ROOT / "campaigns" / "quickstart.yaml").read_text())
    data.update(resources={"nodes": 1, "gpus_per_node": 2}, wandb={"mode": "disabled"}, launcher=chosen,
                sweep={"axes": {"model.moe.top_k": [1, 2]}}, launchers={"nemo-run": {"executor": "local"}})  # fmt: skip
    result = mbx("campaign", "run", str(write_campaign(data)), "--dry-run", "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"dry run with launcher {chosen}" in result.stdout
    assert "NeMo-Run local executor: 2 task(s)" in result.stdout and "sbatch" not in result.stdout
    made = NemoRunLauncher.create({"executor": "local", "stop_margin_s": 7}, tmp_path / "ws")
    assert isinstance(made, NemoRunLocalLauncher) and made.name == "nemo-run"
    assert made.settings.stop_margin_s == 7
    with pytest.raises(ValueError, match="nemo-run-local backend"):
        NemoRunLauncher({"executor": "local"}, tmp_path / "ws")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_nemo_run_golden(tmp_path: Path) -> None:
    pytest.importorskip("nemo_run", reason="pip install 'mbx[nemo]' (nemo-run==0.11.1, leptonai==0.27.3)")
    from launchers.backends.nemo_run import NemoRunLauncher

    workspace = tmp_path / "ws"
    p = profile(container={"image": "nvcr.io#nvidia/pytorch:25.01-py3", "workdir": "/workspace"})
    launcher = NemoRunLauncher(None, workspace, p)
    (item,) = launcher.render(
        [spec(workspace, "aaaa-r0", minutes=30), spec(workspace, "bbbb-r0", minutes=30)]
    )
    assert len(item.scripts) == 2
    first = next(iter(item.scripts.values()))
    check_golden("nemo_run_container.sh", normalize(first, workspace))
    assert "hello world" not in first and "--container-env HF_TOKEN,WANDB_API_KEY" in first
    assert item.commands[0][:3] == ["sbatch", "--requeue", "--parsable"]
    printed = item.describe()
    assert printed.count("Generated by NeMo Run") == 2 and "$ sbatch --requeue --parsable " in printed
    assert not (workspace / "golden" / "nemo-run" / "experiments").exists() or not any(
        (workspace / "golden" / "nemo-run" / "experiments").rglob("*_sbatch.sh")
    ), "NeMo-Run's own dry run leaves no script behind"
