"""Rank-local JIT cache resolution: root and rank precedence, and replacing inherited values."""

from __future__ import annotations

import os
from pathlib import Path

import trainer_helpers  # noqa: F401 (puts the checkout on sys.path)

from trainer import jit_cache


def test_root_precedence():
    env = {"MBX_CACHE_DIR": "/m", "XDG_CACHE_HOME": "/x", "USER": "ada"}
    assert jit_cache.cache_root("/explicit", env) == Path("/explicit")
    assert jit_cache.cache_root(None, env) == Path("/m")
    assert jit_cache.cache_root(None, {"XDG_CACHE_HOME": "/x", "USER": "ada"}) == Path("/x/mbx")
    assert jit_cache.cache_root(None, {"USER": "ada"}) == Path("/tmp/mbx-cache-ada")


def test_rank_precedence():
    assert jit_cache.global_rank({"RANK": "3", "SLURM_PROCID": "5"}) == 3
    assert jit_cache.global_rank({"SLURM_PROCID": "5"}) == 5
    assert jit_cache.global_rank({}) == 0


def test_setup_replaces_inherited_values(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/shared/nfs/triton")
    for var in (*jit_cache.RANK_LOCAL_VARS, *jit_cache.SHARED_VARS):
        monkeypatch.setenv(var, os.environ.get(var, ""))  # restored after the test
    record = jit_cache.setup_jit_caches(str(tmp_path))
    assert record["rank"] == 1
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "rank-1" / "triton")
    assert record["replaced"]["TRITON_CACHE_DIR"] == "/shared/nfs/triton"
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "torch_extensions")
    assert all(Path(p).is_dir() for p in record["env"].values())
    path = jit_cache.write_record(record, tmp_path / "run")
    assert path.name == "jit-cache-rank1.json"
