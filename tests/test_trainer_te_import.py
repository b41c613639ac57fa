"""Transformer Engine import selection (issue 15): nothing imports TE unless a recipe knob needs it, and when
something does, TE's library loader is pointed at torch's own CUDA libraries and `transformer_engine.jax` is
kept out. A fake `transformer_engine` package stands in for TE (no GPU, no TE needed)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from trainer import te_support

FAKE_TOP = textwrap.dedent("""
    import os
    import sys
    sys.modules.setdefault("fake_te_log", type(sys)("fake_te_log")).imported = True
    try:
        from . import pytorch
    except ImportError:
        pass
    try:
        from . import jax
    except ImportError:
        pass
    __version__ = "9.9.9"
""")


@pytest.fixture
def fake_te(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "transformer_engine"
    (pkg / "pytorch").mkdir(parents=True)
    (pkg / "jax").mkdir()
    (pkg / "__init__.py").write_text(FAKE_TOP)
    (pkg / "pytorch" / "__init__.py").write_text("import os\nSEEN_ENV = dict(os.environ)\n")
    (pkg / "jax" / "__init__.py").write_text("import sys\nsys.modules['fake_te_log'].jax_imported = True\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [m for m in sys.modules if m.split(".")[0] in ("transformer_engine", "fake_te_log")]:
        monkeypatch.delitem(sys.modules, name)
    yield pkg
    for name in [m for m in sys.modules if m.split(".")[0] in ("transformer_engine", "fake_te_log")]:
        sys.modules.pop(name, None)


def _torch_like_purelib(root: Path) -> Path:
    nvidia = root / "nvidia"
    (nvidia / "cudnn" / "lib").mkdir(parents=True)
    (nvidia / "cudnn" / "lib" / "libcudnn.so.9").write_bytes(b"")
    (nvidia / "cu13" / "lib").mkdir(parents=True)
    (nvidia / "cu13" / "lib" / "libnvrtc.so.13").write_bytes(b"")
    (nvidia / "cu13" / "lib" / "libcurand.so.10").write_bytes(b"")
    return root


def test_library_env_names_torch_pip_folders(tmp_path):
    purelib = _torch_like_purelib(tmp_path)
    env = te_support.te_library_env(purelib, environ={})
    assert env == {
        "CUDNN_HOME": str(purelib / "nvidia/cudnn"),
        "NVRTC_HOME": str(purelib / "nvidia/cu13"),
        "CURAND_HOME": str(purelib / "nvidia/cu13"),
    }


def test_library_env_keeps_user_choice_and_skips_missing(tmp_path):
    purelib = _torch_like_purelib(tmp_path)
    env = te_support.te_library_env(purelib, environ={"CUDNN_HOME": "/opt/cudnn"})
    assert "CUDNN_HOME" not in env and set(env) == {"NVRTC_HOME", "CURAND_HOME"}
    assert te_support.te_library_env(tmp_path / "nothing", environ={}) == {}


def test_te_version_reads_metadata_without_import(monkeypatch):
    import importlib.metadata as md

    def fake_version(dist):
        if dist == "transformer_engine":
            return "2.20.2"
        raise md.PackageNotFoundError(dist)

    monkeypatch.setattr(md, "version", fake_version)
    before = {m for m in sys.modules if m.startswith("transformer_engine")}
    assert te_support.te_version() == "2.20.2"
    assert {m for m in sys.modules if m.startswith("transformer_engine")} == before


def test_te_version_none_when_absent(monkeypatch):
    import importlib.metadata as md

    def absent(dist):
        raise md.PackageNotFoundError(dist)

    monkeypatch.setattr(md, "version", absent)
    assert te_support.te_version() is None


def test_import_te_keeps_jax_out_and_names_libraries(fake_te, tmp_path, monkeypatch):
    import sysconfig

    purelib = _torch_like_purelib(tmp_path / "purelib")
    monkeypatch.setattr(sysconfig, "get_path", lambda name, *a, **k: str(purelib))
    for var in ("CUDNN_HOME", "NVRTC_HOME", "CURAND_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    te = te_support.import_te()
    assert te.SEEN_ENV["CUDNN_HOME"] == str(purelib / "nvidia/cudnn")  # set before TE's loader ran
    log = sys.modules["fake_te_log"]
    assert log.imported and not getattr(log, "jax_imported", False)


def test_plain_import_of_the_fake_does_import_jax(fake_te):
    """The fake behaves as TE's top-level package does: a plain import pulls `transformer_engine.jax` in."""
    import transformer_engine  # noqa: F401

    assert sys.modules["fake_te_log"].jax_imported


def test_no_te_knob_never_imports_te(fake_te):
    """select_paths for a recipe with no TE knob uses no TE; prepare_model then never imports it."""
    from trainer.cli import load_recipe

    root = Path(__file__).resolve().parent.parent
    recipe = load_recipe(
        str(root / "benchmarks/recipes/moe_proxy.yaml"), ["device=cpu", "model.num_layers=1"]
    )
    paths = te_support.select_paths(recipe)
    assert not paths.uses_te
    assert te_support.te_knobs(recipe) == []
    runtime = te_support.prepare_model(object(), paths, "cpu")
    assert runtime.te is None and "fake_te_log" not in sys.modules


def test_torch_cudnn_preloaded_shim_first(tmp_path):
    """Every cuDNN library of torch is loaded (RTLD_GLOBAL) before TE, the shim first, so TE's core library
    finds torch's sub-libraries by soname instead of the system's older cuDNN."""
    lib = tmp_path / "nvidia" / "cudnn" / "lib"
    lib.mkdir(parents=True)
    for name in ("libcudnn_graph.so.9", "libcudnn.so.9", "libcudnn_ops.so.9", "libcudnn_adv.so.9"):
        (lib / name).write_bytes(b"")
    loaded: list[str] = []
    names = te_support.preload_torch_cudnn(tmp_path, load=loaded.append)
    assert names[0] == "libcudnn.so.9" and sorted(names) == sorted(p.name for p in lib.iterdir())
    assert loaded == [str(lib / n) for n in names]
    assert te_support.preload_torch_cudnn(tmp_path / "none", load=loaded.append) == []
