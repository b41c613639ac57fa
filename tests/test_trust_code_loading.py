"""A campaign file is code; what it makes run beyond its trainer is said (issue 32): an `env` name that changes
which code runs (PYTHONPATH, LD_PRELOAD, PYTHONSTARTUP, ...) is refused at validate unless the campaign lists it in
`env.allow_code_loading`, wherever it is set, swept or passed; pip options that install from local sources are
named as such in the plan."""

from __future__ import annotations

import re
import sys

import pytest
import yaml
from conftest import FAKE_MEGATRON, MEGATRON_LOG, ROOT

from orchestrator.errors import ConfigError
from orchestrator.spec.loader import load_campaign
from orchestrator.spec.reserved_env import CODE_LOADING


def _load(tmp_path, env: dict | None = None, sweep: dict | None = None):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"name": "c", "env": env or {}, "sweep": sweep or {}}))
    return load_campaign(path)


@pytest.mark.parametrize("name", ["PYTHONPATH", "LD_PRELOAD", "PYTHONSTARTUP", "LD_LIBRARY_PATH", "BASH_ENV"])
@pytest.mark.parametrize("where", ["values", "pass", "axes", "cells"])
def test_a_code_loading_name_needs_the_opt_in(tmp_path, name, where):
    env = {"values": {name: "/opt/x"}} if where == "values" else {"pass": [name]} if where == "pass" else {}
    sweep = {"axes": {f"env.{name}": ["/a", "/b"]}} if where == "axes" else {}
    sweep = {"cells": [{f"env.{name}": "/a"}]} if where == "cells" else sweep
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, env, sweep)
    assert f"{name!r} changes which code runs" in str(refused.value) and "env.allow_code_loading" in str(
        refused.value
    )
    allowed = _load(tmp_path, {**env, "allow_code_loading": [name]}, sweep)
    assert allowed.env.allow_code_loading == [name]


@pytest.mark.parametrize(
    "name", ["CUDA_INJECTION64_PATH", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "GCONV_PATH", "PYTHONWARNINGS"]
)
def test_loader_and_plugin_names_need_the_opt_in_too(tmp_path, name):
    """Each loads a library or module it names (the CUDA driver, NCCL, glibc's iconv, Python's warning filters):
    they validated without the opt-in (issue 32's review)."""
    with pytest.raises(ConfigError, match=f"'{name}' changes which code runs"):
        _load(tmp_path, {"values": {name: "/tmp/x.so"}})
    assert _load(
        tmp_path, {"values": {name: "/tmp/x.so"}, "allow_code_loading": [name]}
    ).env.allow_code_loading


@pytest.mark.parametrize(
    "name",
    ["PATH", "HOME", "CC", "CXX", "CUDAHOSTCXX", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVTX_INJECTION64_PATH",
     "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "PYTHONPYCACHEPREFIX", "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
     "TORCHINDUCTOR_CUTLASS_DIR", "TORCH_CUSTOM_PYTHONPATH"],
)  # fmt: skip
def test_programs_compilers_and_bytecode_need_the_opt_in_too(tmp_path, name):
    """PATH (which python runs), HOME (Python's user site-packages), the compilers JIT builds run, NVTX's injection
    library, Triton's tools and torch.compile's remote cache validated without the opt-in (issue 32's second
    review: a planted evilbin/python ran)."""
    with pytest.raises(ConfigError, match=f"'{name}' changes which code runs"):
        _load(tmp_path, {"values": {name: "/tmp/x"}})
    with pytest.raises(ConfigError, match=f"'{name}' changes which code runs"):
        _load(tmp_path, {"pass": [name]})
    assert _load(tmp_path, {"values": {name: "/tmp/x"}, "allow_code_loading": [name]}).env.allow_code_loading


def test_a_planted_program_on_path_never_runs(mbx, tmp_path):
    """`env.values.PATH` put a folder holding a `python` first: `campaign run` passed and the planted one ran."""
    evil = tmp_path / "evilbin"
    evil.mkdir()
    marker = tmp_path / "MARKER"
    (evil / "python").write_text(f'#!/bin/sh\necho ran >> {marker}\nexec {sys.executable} "$@"\n')
    (evil / "python").chmod(0o755)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "name": "c", "env": {"values": {"PATH": f"{evil}:/usr/bin:/bin"}},
        "trainer": {"kind": "command", "log_format": "megatron-lm",
                    "command": ["python", str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0"]},
    }))  # fmt: skip
    for args in (("validate",), ("run", "-w", str(tmp_path / "ws"), "--no-wandb")):
        result = mbx("campaign", args[0], str(path), *args[1:])
        assert result.returncode == 2, (args, result.stdout[-1500:], result.stderr[-1500:])
        assert "env.values.PATH: 'PATH' changes which code runs" in result.stderr, result.stderr
    assert not marker.exists() and not (tmp_path / "ws" / "c").exists()


def test_only_code_loading_names_can_be_allowed(tmp_path):
    with pytest.raises(ConfigError, match="'XDG_CACHE_HOME' does not change which code runs"):
        _load(tmp_path, {"allow_code_loading": ["XDG_CACHE_HOME"]})
    assert {"PYTHONPATH", "LD_PRELOAD", "PYTHONSTARTUP", "PATH", "HOME", "CC", "CXX"} <= set(CODE_LOADING)


def test_the_threat_model_names_every_code_loading_name():
    """README's threat model is the user's list: each name (and family) the loader refuses without the opt-in."""
    from orchestrator.spec.reserved_env import code_loading_names

    text = (ROOT / "README.md").read_text()
    model = text[text.index("**Threat model.**") :]
    model = model[: model.index("\n\n")]
    missing = [
        n
        for n in code_loading_names().split(", ")
        if not re.search(rf"(?<![\w*]){re.escape(n)}(?![\w*])", model)
    ]
    assert not missing, missing


def test_the_plan_names_pip_options_that_build_from_local_sources(mbx, tmp_path):
    path = tmp_path / "c.yaml"
    (tmp_path / "wheels").mkdir()
    path.write_text(yaml.safe_dump({"name": "c", "software": {
        "pip_args": ["--no-index", "--find-links", "wheels/", "--no-build-isolation"]}}))  # fmt: skip
    result = mbx("campaign", "plan", str(path))
    assert result.returncode == 0, result.stderr
    assert "note: software.pip_args install from local sources (wheels/): a source package there runs its own " \
           "build script" in result.stdout  # fmt: skip
    assert "--no-build-isolation builds with the packages of the environment that runs pip" in result.stdout
    plain = tmp_path / "plain.yaml"
    plain.write_text(
        yaml.safe_dump({"name": "c", "software": {"pip_args": ["--index-url", "https://pypi.org/simple"]}})
    )
    assert "note:" not in mbx("campaign", "plan", str(plain)).stdout


@pytest.mark.parametrize(
    "pip_args",
    [["--find-links=file:///srv/wheels"], ["-f", "file:///srv/wheels"], ["--index-url", "file:///srv/index"],
     ["--extra-index-url=File:///srv/index"], ["-i", "FILE:///srv/index"], ["--find-links", "FILE:///srv/wheels"]],
)  # fmt: skip
def test_file_urls_are_local_sources_in_any_case(pip_args):
    """`--find-links=file:///…`, `-f file:///…` and `--index-url file:///…` got no note ('://' was taken for
    remote); the scheme is case-insensitive (issue 32's review)."""
    from orchestrator.spec.software import Software, local_source_notes

    notes = local_source_notes(Software(pip_args=pip_args))
    assert len(notes) == 1 and "install from local sources (" in notes[0] and "/srv/" in notes[0], notes
    assert local_source_notes(Software(pip_args=["--index-url", "HTTPS://pypi.org/simple"])) == []


def test_a_file_url_in_capitals_is_not_taken_for_a_relative_folder(tmp_path):
    from orchestrator.spec.software import Software, _pip_args

    args = _pip_args(Software(pip_args=["-f", "FILE:///srv/wheels", "-f", "wheels"]), tmp_path / "c.yaml")
    assert args == ["-f", "FILE:///srv/wheels", "-f", str(tmp_path / "wheels")]
