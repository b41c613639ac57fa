"""Issue 21: names mbx uses itself cannot come from a campaign, nothing from campaign data is installed or
removed unchecked, and `mbx campaign validate` refuses what render would (exit 2, one line, no traceback).

The hostile campaigns are the ones the issue reports: `env.values.MBX_SOFTWARE_X_SHA: "/../../../.."` (it
emptied the whole workspace), `env.values.MBX_PIP_PINS: "evilpkg @ file:///..."` (it installed a package and
ran its setup.py), swept and bisected `env.MBX_*`, and a newline in a swept `container.image` (a traceback at
render). They run through the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import string
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAKE_MEGATRON, MEGATRON_LOG
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import ConfigError, UsageError
from orchestrator.flow import bisect
from orchestrator.spec import software
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.loader import load_campaign, trust_problems
from orchestrator.spec.reserved_env import reserved_reason

WIPE = "/../../../.."  # 12 characters: sha[:12] of a worktree path that resolved to the workspace itself


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "PATH": "/usr/bin:/bin", "HOME": str(repo)}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()  # fmt: skip


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A real git repository with one commit."""
    where = tmp_path / "lib"
    where.mkdir()
    git(where, "init", "-q", "-b", "main")
    (where / "VERSION").write_text("v1\n")
    git(where, "add", "-A")
    git(where, "commit", "-q", "-m", "v1")
    return where


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace holding an unrelated file and another campaign's folder: both must survive."""
    ws = tmp_path / "ws"
    (ws / "other-campaign" / "cell" / "1").mkdir(parents=True)
    (ws / "other-campaign" / "cell" / "1" / "status.json").write_text('{"state": "completed"}\n')
    (ws / "sentinel.txt").write_text("keep me\n")
    return ws


def survived(ws: Path) -> bool:
    return (ws / "sentinel.txt").read_text() == "keep me\n" and (ws / "other-campaign/cell/1/status.json").exists()


def command_campaign(name: str, **extra: object) -> dict:
    command = [sys.executable, str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0"]
    return {"name": name, "trainer": {"kind": "command", "command": command, "steps": 15},
            "wandb": {"mode": "disabled"}, **extra}  # fmt: skip


def assert_refused(done: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2, one `file: key: problem` line per problem on stderr, no traceback."""
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    assert "Traceback" not in text, text
    for needle in needles:
        assert needle in done.stderr, done.stderr


# ---- 1. a campaign value that deleted the workspace ---------------------------------------------------------
def test_sha_value_that_wiped_the_workspace_is_refused(tmp_path, repo, workspace, mbx, write_campaign):
    data = command_campaign("wipe", env={"values": {"MBX_SOFTWARE_X_SHA": WIPE, "MBX_SOFTWARE_X_REPO": str(repo)}})
    file = write_campaign(data)
    assert_refused(mbx("campaign", "validate", str(file)), f"{file}: env.values.MBX_SOFTWARE_X_SHA: 'MBX_SOFTWARE_X_SHA' is reserved")
    assert_refused(mbx("campaign", "run", str(file), "-w", str(workspace)), "env.values.MBX_SOFTWARE_X_REPO: ")
    assert survived(workspace)
    assert not (workspace / ".mbx").exists() and not (workspace / "wipe").exists()  # nothing half-written


def test_swept_sha_is_refused_in_axes_zip_and_cells(repo, workspace, mbx, write_campaign):
    sweep = {"axes": {"env.MBX_SOFTWARE_X_SHA": [WIPE]},
             "zip": [{"env.MBX_SOFTWARE_X_REPO": [str(repo)], "env.FINE": ["a"]}],
             "cells": [{"env.RANK": "3"}, {"env.TRITON_CACHE_DIR": "/shared"}]}  # fmt: skip
    file = write_campaign(command_campaign("wipe-swept", sweep=sweep))
    done = mbx("campaign", "run", str(file), "-w", str(workspace))
    assert_refused(done, "sweep.axes.env.MBX_SOFTWARE_X_SHA: 'MBX_SOFTWARE_X_SHA' is reserved",
                   "sweep.zip[0].env.MBX_SOFTWARE_X_REPO: ", "sweep.cells[0].env.RANK: 'RANK' is reserved",
                   "sweep.cells[1].env.TRITON_CACHE_DIR: ")  # fmt: skip
    assert "env.FINE" not in done.stderr and survived(workspace)


def test_bisect_key_env_mbx_is_refused(repo, workspace, mbx, write_campaign):
    file = write_campaign(command_campaign("wipe-bisect"))
    done = mbx("bisect", str(file), "--key", "env.MBX_SOFTWARE_X_SHA", "--values", f"{WIPE},0123456789ab",
               "-w", str(workspace))  # fmt: skip
    assert_refused(done, "--key env.MBX_SOFTWARE_X_SHA: 'MBX_SOFTWARE_X_SHA' is reserved")
    assert survived(workspace) and not (workspace / ".mbx").exists()
    campaign = load_campaign(file)
    for key, values, needle in (("env.SLURM_PROCID", "0,1", "--key env.SLURM_PROCID: 'SLURM_PROCID' is reserved"),
                                ("env.NOTE", "a,b\0", "--values: env.NOTE='b\\x00' contains a NUL"),
                                ("container.image", "a,b\tc", "--values: container.image='b\\tc' contains a control")):
        with pytest.raises(UsageError) as err:
            bisect.make_plan(campaign, file, good=None, bad=None, repo=None, key=key, values=values, repeats=None,
                             max_repeats=10, metric="step_time", min_effect=0.01)  # fmt: skip
        assert str(err.value).startswith(needle), err.value


def test_parity_sides_are_checked_like_sweeps(write_campaign):
    """parity.toggle and parity.pairs become sweep factors: the same name and value checks apply there."""
    data = command_campaign("par", parity={"toggle": {"env.MBX_SOFTWARE_X_SHA": ["0" * 40, WIPE]}})
    with pytest.raises(ConfigError) as err:
        load_campaign(write_campaign(data))
    assert err.value.problems[0].startswith("parity.toggle.env.MBX_SOFTWARE_X_SHA: 'MBX_SOFTWARE_X_SHA' is reserved")
    data = command_campaign("par", parity={"pairs": [{"off": {"container.image": "a"}, "on": {"container.image": "b\r"}}]})
    with pytest.raises(ConfigError) as err:
        load_campaign(write_campaign(data))
    assert err.value.problems == ["parity.pairs[0].on.container.image: 'b\\r' contains a control character (newline, "
                                  "tab, NUL, ...); not allowed in job scripts"]  # fmt: skip


def test_pass_names_are_refused(mbx, write_campaign):
    file = write_campaign(command_campaign("pass", env={"pass": ["HF_TOKEN", "MBX_PIP_PINS", "MASTER_ADDR"]}))
    done = mbx("campaign", "validate", str(file))
    assert_refused(done, "env.pass[1]: 'MBX_PIP_PINS' is reserved", "env.pass[2]: 'MASTER_ADDR' is reserved")
    assert "HF_TOKEN" not in done.stderr


# ---- 2. an install that ran from an env value ----------------------------------------------------------------
@pytest.fixture
def evil(tmp_path: Path) -> tuple[Path, Path]:
    """A local package whose setup.py leaves a file behind when pip runs it: (package dir, that file)."""
    package, ran = tmp_path / "evilpkg", tmp_path / "setup-py-ran"
    package.mkdir()
    (package / "setup.py").write_text(
        f"from pathlib import Path\nPath({str(ran)!r}).write_text('ran')\n"
        "from setuptools import setup\nsetup(name='evilpkg', version='1.0', py_modules=[])\n"
    )
    return package, ran


def test_pip_pins_from_env_values_are_refused(evil, workspace, mbx, write_campaign):
    package, ran = evil
    values = {"MBX_PIP_PINS": f"evilpkg @ file://{package}", "MBX_PIP_ARGS": '["--no-build-isolation"]'}
    file = write_campaign(command_campaign("pins", env={"values": values}))
    assert_refused(mbx("campaign", "validate", str(file)), "env.values.MBX_PIP_PINS: 'MBX_PIP_PINS' is reserved",
                   "env.values.MBX_PIP_ARGS: ")  # fmt: skip
    assert_refused(mbx("campaign", "run", str(file), "-w", str(workspace)), "MBX_PIP_PINS")
    assert not ran.exists(), "the planted package's setup.py ran"
    assert not (workspace / ".mbx").exists() and survived(workspace)


def test_pip_args_cannot_carry_a_requirement(evil, workspace, mbx, write_campaign):
    """software.pip_args holds pip options from an allowlist: a requirement, -r or -e riding along is refused."""
    package, ran = evil
    cases = {"item 0: ": [f"file://{package}"], "item 0: '-e' is not": ["-e", str(package)],
             "item 1: '-r' is not": ["--no-index", "-r", "reqs.txt"], "item 0: --find-links needs": ["--find-links"],
             "item 1: --find-links needs a value, got '--pre'": ["--find-links", "--pre"]}  # fmt: skip
    for needle, args in cases.items():
        data = command_campaign("args", software={"pip": {"mbxtinypkg": "1.0"}, "pip_args": args})
        with pytest.raises(ConfigError) as err:
            load_campaign(write_campaign(data))
        assert err.value.problems[0].startswith(f"software.pip_args: {needle}"), err.value.problems
    data = command_campaign("args", software={"pip": {"mbxtinypkg": "1.0"}, "pip_args": [str(package)]})
    assert_refused(mbx("campaign", "run", str(write_campaign(data)), "-w", str(workspace)), "software.pip_args: item 0: ")
    assert not ran.exists() and survived(workspace)
    ok = ["--no-index", "--find-links", "wheels/", "--platform", "manylinux_2_28_aarch64", "--python-version=3.12",
          "--only-binary", ":all:"]  # the options campaigns/seed004_case_b_bisect.yaml uses
    assert load_campaign(write_campaign(command_campaign("ok", software={"pip_args": ok}))).software.pip_args == ok


def test_the_build_route_checks_what_it_installs_and_removes(evil, repo, tmp_path):
    """ensure_built re-checks a cell's recorded software (a store written before names were reserved): a pin
    that is not PACKAGE==VERSION, pip options off the allowlist, a SHA that is not hex all build nothing."""
    package, ran = evil
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "sentinel.txt").write_text("keep me\n")
    hostile = [
        {"MBX_PIP_PINS": f"evilpkg @ file://{package}", "MBX_PIP_ARGS": "[]"},
        {"MBX_PIP_PINS": "evilpkg==1.0", "MBX_PIP_ARGS": json.dumps([str(package)])},
        {"MBX_SOFTWARE_X_SHA": WIPE, "MBX_SOFTWARE_X_REPO": str(repo)},
        {"MBX_SOFTWARE_X_SHA": "0" * 40, "MBX_SOFTWARE_X_REPO": str(tmp_path)},  # not a git repository
    ]
    for env in hostile:
        with pytest.raises(software.BuildError, match="refusing|not a git repository"):
            software.ensure_built(env, ws)
    assert not ran.exists() and (ws / "sentinel.txt").exists() and not (ws / ".mbx").exists()


def test_half_built_dir_without_marker_is_not_removed(repo, tmp_path):
    """A worktree folder mbx did not make (no ownership marker) is left alone: the attempt fails with why."""
    sha = git(repo, "rev-parse", "HEAD")
    ws = tmp_path / "ws"
    where = software.worktree_dir(ws, "lib", sha)
    where.mkdir(parents=True)
    (where / "notes.txt").write_text("mine")
    with pytest.raises(software.BuildError, match="no .mbx-owned marker"):
        software.ensure_built({"MBX_SOFTWARE_LIB_SHA": sha, "MBX_SOFTWARE_LIB_REPO": str(repo)}, ws)
    assert (where / "notes.txt").read_text() == "mine"
    (where / "notes.txt").unlink()
    where.rmdir()
    built = software.ensure_built({"MBX_SOFTWARE_LIB_SHA": sha, "MBX_SOFTWARE_LIB_REPO": str(repo)}, ws)
    assert built == [where] and (where / "VERSION").read_text() == "v1\n"
    (where / software.MARKER).unlink()  # half-built by mbx: marked, so it is built again
    assert software.ensure_built({"MBX_SOFTWARE_LIB_SHA": sha, "MBX_SOFTWARE_LIB_REPO": str(repo)}, ws) == [where]


# ---- 3. what render refuses is refused at validate --------------------------------------------------------------
def test_newline_in_swept_image_refused_at_validate(workspace, mbx, write_campaign):
    data = command_campaign("img", sweep={"axes": {"container.image": ["nvcr.io#nvidia/pytorch:25.01",
                                                                       "x:1\nrm -rf ~"]}})  # fmt: skip
    file = write_campaign(data)
    needle = f"{file}: sweep.axes.container.image[1]: 'x:1\\nrm -rf ~' contains a control character"
    assert_refused(mbx("campaign", "validate", str(file)), needle)
    for launcher in ("submitit", "nemo-run"):  # both raised UnsafeValue (a traceback) at render
        done = mbx("campaign", "run", str(file), "--dry-run", "--launcher", launcher, "-w", str(workspace))
        assert_refused(done, needle)
    assert survived(workspace) and not (workspace / "img").exists()


def test_nul_in_values_that_reach_a_process_refused_at_validate(mbx, write_campaign):
    data = command_campaign("nul", env={"values": {"NOTE": "a\0b"}}, sweep={"cells": [{"env.OTHER": "c\0"}]})
    data["trainer"]["params"] = {"tokenizer_model": "x\0y"}
    done = mbx("campaign", "validate", str(write_campaign(data)))
    assert_refused(done, "env.values.NOTE: 'a\\x00b' contains a NUL", "sweep.cells[0].env.OTHER: ",
                   "trainer.params.tokenizer_model: ")  # fmt: skip


# ---- properties (fixed seed) ----------------------------------------------------------------------------------------
NAME_CHARS = string.ascii_uppercase + string.digits + "_"
names = st.one_of(
    st.builds(lambda p, s: p + s, st.sampled_from(["MBX_", "SLURM_", "TORCHELASTIC_", "", "X", "MBX", "SLURM"]),
              st.text(NAME_CHARS, max_size=12)),
    st.sampled_from(["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "TRITON_HOME",
                     "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH", "PYTHONPATH", "HF_HOME",
                     "OMP_NUM_THREADS", "MBX_SOFTWARE_X_SHA", "MBX_PIP_PINS", "MBX_CONTAINER_IMAGE", "RANKS",
                     "XDG_CACHE_HOME", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG"]),
).filter(lambda n: n and not n[0].isdigit())
EXPECTED_RESERVED = {  # torch.distributed's per-task variables and the JIT caches DESIGN.md lists as rank-local
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
    "TRITON_CACHE_DIR", "TRITON_HOME", "TORCHINDUCTOR_CACHE_DIR", "PYTORCH_KERNEL_CACHE_PATH", "CUDA_CACHE_PATH",
    "TILELANG_CACHE_DIR", "TILELANG_TMP_DIR", "DG_JIT_CACHE_DIR", "EP_JIT_CACHE_DIR", "DEEP_EP_JIT_CACHE_DIR",
    "CUPY_CACHE_DIR", "TORCH_EXTENSIONS_DIR",
}  # fmt: skip


def expected_reserved(name: str) -> bool:
    """The oracle, written from the documented rule, not from the module's tables."""
    return name.startswith(("MBX_", "SLURM_", "TORCHELASTIC_")) or name in EXPECTED_RESERVED


@settings(derandomize=True, max_examples=400, deadline=None)
@given(name=names, value=st.text(max_size=20), where=st.sampled_from(["values", "pass", "axes", "cells", "zip"]))
def test_fuzz_reserved_names_always_refused(name, value, where):
    env = {"values": {name: value}} if where == "values" else {"pass": [name]} if where == "pass" else {}
    sweep = {"axes": {f"env.{name}": [value]}} if where == "axes" else {}
    sweep = {"cells": [{f"env.{name}": value}]} if where == "cells" else sweep
    sweep = {"zip": [{f"env.{name}": [value]}]} if where == "zip" else sweep
    problems = trust_problems(Campaign.model_validate({"name": "fuzz", "env": env, "sweep": sweep}))
    reserved = [p for p in problems if f"{name!r} is reserved" in p]
    assert bool(reserved) == expected_reserved(name), (name, problems)
    assert (reserved_reason(name) is not None) == expected_reserved(name)


shas = st.one_of(
    st.text("0123456789abcdef", min_size=40, max_size=40),
    st.text("0123456789abcdef./~-_ ", max_size=64),
    st.sampled_from([WIPE, "../" * 10, "/", "..", "0" * 12 + "/../..", "a" * 39 + "/", "A" * 40]),
)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(name=st.text(NAME_CHARS + "./-", min_size=1, max_size=10), sha=shas)
def test_fuzz_software_values_never_leave_the_software_root(tmp_path_factory, name, sha):
    """Whatever name and SHA a recorded env holds, a worktree path is one component inside .mbx/software/git,
    and building either is refused or stays there; nothing else in the workspace is touched."""
    ws = tmp_path_factory.getbasetemp() / "fuzz-ws"
    (ws / "keep").mkdir(parents=True, exist_ok=True)
    (ws / "keep" / "sentinel").write_text("x")
    try:
        where = software.worktree_dir(ws, name, sha)
    except software.BuildError:
        where = None
    if where is not None:
        assert where.parent == software.software_root(ws) / "git" and where.resolve().parent == where.parent.resolve()
    env = {f"MBX_SOFTWARE_{name}_SHA": sha, f"MBX_SOFTWARE_{name}_REPO": str(ws / "keep")}  # not a repository
    with pytest.raises(software.BuildError):
        software.ensure_built(env, ws)
    assert (ws / "keep" / "sentinel").read_text() == "x" and not (ws / ".mbx").exists()
