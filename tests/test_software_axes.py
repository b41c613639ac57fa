"""Versions as sweep axes, for real: git refs of a repository made here (a worktree per SHA, built once and
reused), pip pins installed offline from wheels made here (an overlay per pin set), and container.image per
point (rendered per job by the Slurm backends, refused by the local launcher)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import FAKE_MEGATRON, MEGATRON_LOG, TINY_MOE_RECIPE


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "PATH": "/usr/bin:/bin", "HOME": str(repo)}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()  # fmt: skip


def make_repo(repo: Path) -> dict[str, str]:
    """A repository with tags v1 and v2, each with its own VERSION file; tag → SHA."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas = {}
    for tag in ("v1", "v2"):
        (repo / "VERSION").write_text(tag + "\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"release {tag}")
        git(repo, "tag", tag)
        shas[tag] = git(repo, "rev-parse", "HEAD")
    return shas


def make_wheel(wheels: Path, version: str) -> None:
    """A pure-Python wheel of `mbxtinypkg` (a module saying its version), written by hand: no network."""
    wheels.mkdir(exist_ok=True)
    dist = f"mbxtinypkg-{version}.dist-info"
    files = {
        "mbxtinypkg.py": f'VERSION = "{version}"\n',
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: mbxtinypkg\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(wheels / f"mbxtinypkg-{version}-py3-none-any.whl", "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)


def echo_campaign(name: str, **extra: object) -> dict:
    """A command campaign whose program (a fake Megatron) writes its argv and environment to echo.json."""
    command = [sys.executable, str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0",
               "--echo", "{run_dir}/echo.json", "--version-file", "{software.lib}/VERSION"]  # fmt: skip
    return {"name": name, "trainer": {"kind": "command", "command": command, "steps": 15},
            "wandb": {"mode": "disabled"}, "launchers": {"local": {"parallel": 2}}, **extra}  # fmt: skip


def echoes(workspace: Path, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((workspace / name).glob("*/*/echo.json"))]


def test_worktree_per_ref_built_once_and_reused(tmp_path, mbx, write_campaign):
    shas = make_repo(tmp_path / "lib")
    workspace = tmp_path / "ws"
    data = echo_campaign("refs", software={"repos": {"lib": {"path": "lib", "pythonpath": True}}},
                         sweep={"axes": {"software.repos.lib.ref": ["v1", "v2", shas["v1"]]}})  # fmt: skip
    file = write_campaign(data)
    plan = mbx("campaign", "plan", str(file), "--json")
    assert plan.returncode == 0, plan.stderr
    cells = json.loads(plan.stdout)
    assert len(cells) == 2  # v1 and its SHA are one point: the cell id names the commit, not the ref
    done = mbx("campaign", "run", str(file), "-w", str(workspace))
    assert done.returncode == 0, done.stdout + done.stderr
    trees = sorted((workspace / ".mbx" / "software" / "git").glob("lib-*/VERSION"))
    assert {p.parent.name for p in trees} == {f"lib-{shas[t][:12]}" for t in ("v1", "v2")}
    seen = {}
    for echo in echoes(workspace, "refs"):
        tree = Path(echo["env"]["MBX_SOFTWARE_LIB"])
        assert echo["argv"][echo["argv"].index("--version-file") + 1] == str(tree / "VERSION")
        assert str(tree) in echo["env"]["PYTHONPATH"].split(os.pathsep)
        seen[echo["env"]["MBX_SOFTWARE_LIB_SHA"]] = (tree / "VERSION").read_text().strip()
    assert seen == {shas["v1"]: "v1", shas["v2"]: "v2"}
    launched = [json.loads(p.read_text()) for p in (workspace / "refs").glob("*/*/launch.json")]
    assert sorted(rec["software"]["repos"]["lib"] for rec in launched) == sorted([shas["v1"], shas["v2"]])
    built = {p: p.with_name(".mbx-built").stat().st_mtime_ns for p in trees}

    data["name"] = "refs-again"  # another campaign over the same SHAs reuses the worktrees
    done = mbx("campaign", "run", str(write_campaign(data, "again.yaml")), "-w", str(workspace))
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p: p.with_name(".mbx-built").stat().st_mtime_ns for p in trees} == built
    assert len(echoes(workspace, "refs-again")) == 2


def test_bad_ref_and_bad_keys_are_named(tmp_path, mbx, write_campaign):
    make_repo(tmp_path / "lib")
    repos = {"repos": {"lib": {"path": "lib"}}}
    bad_ref = write_campaign(
        echo_campaign("bad", software=repos, sweep={"axes": {"software.repos.lib.ref": ["v1", "v9"]}})
    )
    done = mbx("campaign", "validate", str(bad_ref))
    assert done.returncode == 2
    assert "point [ref=v9]: software.repos.lib.ref: 'v9' does not name a commit in" in done.stderr
    assert "Traceback" not in done.stderr
    for key, said in (("software.repos.other.ref", "no repo 'other' in software.repos (known: lib)"),
                      ("container.mounts", "only container.image is sweepable"),
                      ("software.conda.x", "sweepable keys there: software.repos.NAME.ref")):  # fmt: skip
        for trainer in ({}, {"trainer": {"kind": "bundled", "recipe": TINY_MOE_RECIPE}}):
            data = {**echo_campaign("keys", software=repos, sweep={"axes": {key: ["a"]}}), **trainer}
            done = mbx("campaign", "validate", str(write_campaign(data)))
            assert done.returncode == 2, done.stdout
            assert f"sweep.axes.{key}: " in done.stderr and said in done.stderr, done.stderr


def test_pip_overlay_per_pin_set_offline(tmp_path, mbx, write_campaign):
    for version in ("1.0", "2.0"):
        make_wheel(tmp_path / "wheels", version)
    workspace = tmp_path / "ws"
    software = {"pip": {"mbxtinypkg": "1.0"}, "pip_args": ["--no-index", "--find-links", "wheels"]}
    data = echo_campaign(
        "pins", software=software, sweep={"axes": {"software.pip.mbxtinypkg": ["1.0", "2.0"]}}
    )
    data["trainer"]["command"] = data["trainer"]["command"][:-2]  # no repo here
    done = mbx("campaign", "run", str(write_campaign(data)), "-w", str(workspace))
    assert done.returncode == 0, done.stdout + done.stderr
    versions = {}
    for echo in echoes(workspace, "pins"):
        overlay = echo["env"]["PYTHONPATH"].split(os.pathsep)[1]  # after the mbx checkout
        assert (Path(overlay) / ".mbx-built").exists()
        probe = subprocess.run([sys.executable, "-c", "import mbxtinypkg; print(mbxtinypkg.VERSION)"],
                               env={**os.environ, "PYTHONPATH": echo["env"]["PYTHONPATH"]},
                               capture_output=True, text=True, check=True)  # fmt: skip
        versions[echo["env"]["MBX_PIP_PINS"]] = probe.stdout.strip()
    assert versions == {"mbxtinypkg==1.0": "1.0", "mbxtinypkg==2.0": "2.0"}
    assert len(list((workspace / ".mbx" / "software" / "pip").glob("*/.mbx-built"))) == 2


def test_container_image_per_point_on_slurm_refused_locally(tmp_path, mbx, write_campaign):
    data = {"name": "images", "trainer": {"kind": "bundled", "recipe": TINY_MOE_RECIPE},
            "cluster": {"gpus": False}, "container": {"mounts": ["/data:/data"]}, "wandb": {"mode": "disabled"},
            "sweep": {"axes": {"container.image": ["nvcr.io/nvidia/pytorch:26.04-py3", "nvcr.io/nvidia/pytorch:26.05-py3"]}}}  # fmt: skip
    file = write_campaign(data)
    workspace = tmp_path / "ws"
    done = mbx("campaign", "run", str(file), "--dry-run", "--launcher", "submitit", "-w", str(workspace))
    assert done.returncode == 0, done.stdout + done.stderr
    for tag in ("26.04", "26.05"):
        assert f"--container-image=nvcr.io/nvidia/pytorch:{tag}-py3" in done.stdout
        assert f'"container_image": "nvcr.io/nvidia/pytorch:{tag}-py3"' in done.stdout
    assert done.stdout.count("/%j_submission.sh\n") == 2  # one job (script) per image
    assert "--container-mounts=/data:/data" in done.stdout

    done = mbx("campaign", "run", str(file), "--launcher", "local", "-w", str(workspace))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "container.image:" in done.stderr and "the local launcher runs no container" in done.stderr
    assert not (workspace / "images").exists() or not list((workspace / "images").glob("*/*/recipe.yaml"))
