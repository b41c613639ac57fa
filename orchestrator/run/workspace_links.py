"""The workspace's folders are real directories: a symbolic link where mbx writes (a campaign's folder, a cell's,
an attempt's, the report's) is refused, naming it and where it points; mbx never writes through one."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.errors import UsageError


def _dir_links(folder: Path) -> list[Path]:
    """The entries of `folder` that are symbolic links to directories (or dangling: they may become one)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return [Path(e.path) for e in entries if e.is_symlink() and (e.is_dir() or not os.path.exists(e.path))]


def links_in_campaign(campaign_dir: Path) -> list[Path]:
    """Links where mbx writes a campaign: the campaign's folder itself, its cells' and report's folders (its
    entries), and its attempts' folders (its cells' entries)."""
    campaign_dir = Path(campaign_dir)
    if campaign_dir.is_symlink():
        return [campaign_dir]
    if not campaign_dir.is_dir():
        return []
    found = _dir_links(campaign_dir)
    for entry in os.scandir(campaign_dir):
        if entry.is_dir(follow_symlinks=False):
            found += _dir_links(Path(entry.path))
    return found


def refuse_links(campaign_dir: Path) -> None:
    """UsageError naming each link (and its target) in the folders mbx writes for a campaign."""
    found = links_in_campaign(campaign_dir)
    if found:
        raise UsageError([f"{link}: a symbolic link (to {os.readlink(link)}) where mbx writes the campaign; mbx does "
                          "not write through links inside the workspace: put a real directory in its place (move "
                          "the link away), or give --workspace the folder it points to" for link in found])  # fmt: skip
