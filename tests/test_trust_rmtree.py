"""Issue 21: a directory is removed only when mbx made it (marker inside) and it lies inside its owner's root;
everything is checked before anything is removed (orchestrator/owned_dirs.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.owned_dirs import OWNED_MARKER, NotOwned, make_owned_dir, remove_owned_dir


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """A workspace with an owned root, a sentinel beside it and an unowned directory holding a file."""
    root = tmp_path / "ws" / ".mbx" / "software"
    root.mkdir(parents=True)
    sentinel = tmp_path / "ws" / "keep.txt"
    sentinel.write_text("precious\n")
    outside = make_owned_dir(tmp_path / "outside")  # owned, but not under root
    (outside / "data").write_text("x")
    return {"root": root, "sentinel": sentinel, "outside": outside, "ws": tmp_path / "ws"}


def test_owned_dir_inside_root_is_removed(tree):
    where = make_owned_dir(tree["root"] / "git" / "lib-0123456789ab")
    (where / "sub").mkdir()
    (where / "sub" / "f").write_text("x")
    assert (where / OWNED_MARKER).is_file()
    remove_owned_dir(where, root=tree["root"])
    assert not where.exists() and tree["sentinel"].exists()
    remove_owned_dir(where, root=tree["root"])  # already gone: nothing to do


@pytest.mark.parametrize("relative", ["..", "../..", "git/../..", "/../../../..", "."])
def test_paths_outside_or_equal_to_root_are_refused(tree, relative):
    target = tree["root"] / relative if not relative.startswith("/") else Path(str(tree["root"]) + relative)
    with pytest.raises(NotOwned, match="not inside"):
        remove_owned_dir(target, root=tree["root"])
    assert tree["sentinel"].read_text() == "precious\n" and tree["root"].is_dir()


def test_owned_dir_outside_root_is_refused(tree):
    with pytest.raises(NotOwned, match="not inside"):
        remove_owned_dir(tree["outside"], root=tree["root"])
    assert (tree["outside"] / "data").exists()


def test_symlink_escaping_root_is_refused(tree):
    link = tree["root"] / "git" / "lib-link"
    link.parent.mkdir(parents=True)
    link.symlink_to(tree["outside"], target_is_directory=True)
    with pytest.raises(NotOwned, match="symbolic link"):
        remove_owned_dir(link, root=tree["root"])
    assert (tree["outside"] / "data").exists() and link.is_symlink()
    # a link higher up the path that leads out of the root: the resolved path is outside
    (tree["root"] / "pip").symlink_to(tree["ws"], target_is_directory=True)
    with pytest.raises(NotOwned, match="not inside"):
        remove_owned_dir(tree["root"] / "pip" / "keep.txt", root=tree["root"])
    assert tree["sentinel"].exists()


def test_dir_without_marker_is_refused(tree):
    where = tree["root"] / "git" / "lib-abcdef012345"
    where.mkdir(parents=True)
    (where / "user-file").write_text("mine")
    with pytest.raises(NotOwned, match="no .mbx-owned marker"):
        remove_owned_dir(where, root=tree["root"])
    assert (where / "user-file").exists()


def test_marker_that_is_a_link_does_not_count(tree):
    where = tree["root"] / "pip" / "abc"
    where.mkdir(parents=True)
    (where / OWNED_MARKER).symlink_to(tree["sentinel"])
    with pytest.raises(NotOwned, match="no .mbx-owned marker"):
        remove_owned_dir(where, root=tree["root"])
    assert where.exists() and tree["sentinel"].exists()


# Path components a campaign value could smuggle in: dots, separators, absolute paths, links' names.
PARTS = st.lists(
    st.sampled_from(["..", ".", "", "/", "git", "pip", "lib-0123", "x", "..//..", "~", "%2e%2e", "link"]),
    max_size=6,
)


@settings(derandomize=True, max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=PARTS)
def test_fuzz_no_removal_outside_root(tree, parts):
    """Whatever path is built from generated parts, nothing outside the owned root is ever removed, and a
    directory inside it goes only when it holds the marker."""
    root = tree["root"]
    if not (root / "link").exists():
        (root / "link").symlink_to(tree["ws"], target_is_directory=True)
    make_owned_dir(root / "git" / "lib-0123")
    target = Path(str(root) + "/" + "/".join(parts))
    resolved = target.resolve()
    inside = resolved != root.resolve() and root.resolve() in resolved.parents
    try:
        remove_owned_dir(target, root=root)
        removed = True
    except NotOwned:
        removed = False
    assert tree["sentinel"].exists() and (tree["outside"] / "data").exists() and root.is_dir()
    if removed:
        assert inside and not target.is_symlink() and not os.path.lexists(resolved)
