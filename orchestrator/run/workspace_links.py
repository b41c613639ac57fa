"""The workspace's folders are real directories: a symbolic link where mbx writes (a campaign's folder, a cell's,
an attempt's, the report's and its files, the run store mbx.sqlite, W&B's wandb/, the locks .lock) is refused,
naming it, where it points and what to do instead; mbx never writes through one (nor reads the store through one)."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.errors import UsageError

# <workspace>/<campaign>/.lock and <workspace>/.lock (orchestrator/run/lock.py takes them)
LOCK_FILE = ".lock"
REPORT_DIR = "report"  # <workspace>/<campaign>/report: the report's default folder


def _dir_links(folder: Path) -> list[Path]:
    """The entries of `folder` that are symbolic links to directories (or dangling: they may become one)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return [Path(e.path) for e in entries if e.is_symlink() and (e.is_dir() or not os.path.exists(e.path))]


def links_in_campaign(campaign_dir: Path) -> list[Path]:
    """Links where mbx writes a campaign: the campaign's folder itself, its cells' and report's folders (its
    entries), its lock file, and its attempts' folders (its cells' entries)."""
    campaign_dir = Path(campaign_dir)
    if campaign_dir.is_symlink():
        return [campaign_dir]
    if not campaign_dir.is_dir():
        return []
    found = _dir_links(campaign_dir)
    if (campaign_dir / LOCK_FILE).is_symlink() and campaign_dir / LOCK_FILE not in found:
        found.append(campaign_dir / LOCK_FILE)
    for entry in os.scandir(campaign_dir):
        if entry.is_dir(follow_symlinks=False):
            found += _dir_links(Path(entry.path))
    found += _report_links(campaign_dir / REPORT_DIR)
    return list(dict.fromkeys(found))


def _report_links(report: Path) -> list[Path]:
    """Every link in the report's folder and its folders (cells/, assets/, compare/): a page or a summary.md there
    would be replaced by a file, silently."""
    if report.is_symlink() or not report.is_dir():
        return []
    folders = [report, *(Path(e.path) for e in os.scandir(report) if e.is_dir(follow_symlinks=False))]
    return [Path(e.path) for folder in folders for e in os.scandir(folder) if e.is_symlink()]


def _in_report(link: Path, campaign: str) -> bool:
    """Whether `link` is an entry of the campaign's report folder or of one of its folders."""
    parents = [p.name for p in link.parents[:3]]
    return parents[:2] == [REPORT_DIR, campaign] or parents[1:3] == [REPORT_DIR, campaign]


NOT_THROUGH = "mbx neither reads nor writes through links inside the workspace"
# Files and folders of the workspace itself that mbx writes: where mbx keeps what (completing "a symbolic link
# where ..."), and what to do instead. A link there is refused as a campaign's folder is.
WORKSPACE_ENTRIES = {
    "mbx.sqlite": f"mbx keeps the workspace's run store; {NOT_THROUGH}: move the link away and put the store "
    "itself there (or give --workspace the folder that holds it with its campaigns)",
    "wandb": f"mbx keeps W&B's offline runs of the workspace; {NOT_THROUGH}: move the link away (to keep the "
    "runs on another disk, set the campaign's wandb.dir: they go under <wandb.dir>/wandb/)",
    LOCK_FILE: f"mbx keeps the workspace's lock (a store rebuild against the campaigns); {NOT_THROUGH}: remove "
    "the link (mbx makes the lock file itself)",
}
CAMPAIGN_LOCK = (
    f"mbx keeps the campaign's lock (one orchestrator at a time); {NOT_THROUGH}: remove the link (mbx makes the "
    "lock file itself)"
)


def links_in_workspace(workspace: Path) -> list[Path]:
    """The run store (mbx.sqlite) and W&B folder (wandb/) of `workspace` where they are symbolic links."""
    return [Path(workspace) / name for name in WORKSPACE_ENTRIES if (Path(workspace) / name).is_symlink()]


def refuse_links(campaign_dir: Path) -> None:
    """UsageError naming each link (and its target) in the folders mbx writes for a campaign, and in the
    workspace's own store and W&B folder."""
    campaign_dir = Path(campaign_dir)
    problems = [_refusal(link, campaign_dir.name) for link in links_in_campaign(campaign_dir)]
    problems += [_refusal(link) for link in links_in_workspace(campaign_dir.parent)]
    if problems:
        raise UsageError(problems)


def refuse_workspace_links(workspace: Path) -> None:
    """UsageError naming the workspace's store, W&B folder or lock, or a campaign's lock, where it is a link (`mbx
    store rebuild` writes them all)."""
    problems = [_refusal(link) for link in links_in_workspace(workspace)]
    problems += [_refusal(lock, lock.parent.name) for lock in sorted(Path(workspace).glob(f"*/{LOCK_FILE}"))
                 if lock.is_symlink()]  # fmt: skip
    if problems:
        raise UsageError(problems)


def link_refused(link: Path, campaign: str | None = None) -> UsageError:
    """The refusal of one link found while opening it (`campaign`: the campaign whose entry it is; None: the
    workspace's own), for a link made after the checks above."""
    return UsageError([_refusal(Path(link), campaign)])


def _refusal(link: Path, campaign: str | None = None) -> str:
    """`<link>: a symbolic link (to <target>) where ...`, with what to do for that place."""
    start = f"{link}: a symbolic link (to {os.readlink(link)}) where "
    if campaign is None:
        return start + WORKSPACE_ENTRIES.get(link.name, f"mbx writes the workspace; {NOT_THROUGH}: remove it")
    if link.name == LOCK_FILE and link.parent.name == campaign:
        return start + CAMPAIGN_LOCK
    if _in_report(link, campaign):
        return (start + f"mbx writes the campaign's report; {NOT_THROUGH}, nor replaces them: move the link away, or "
                f"write the report elsewhere with `mbx report {campaign} --out DIR`")  # fmt: skip
    if link.name == REPORT_DIR and link.parent.name == campaign:  # the report can go anywhere with --out
        return (start + f"mbx writes the campaign's report; {NOT_THROUGH}: "
                f"move the link away, or write the report there with `mbx report {campaign} --out "
                f"{os.path.realpath(link)}`")  # fmt: skip
    return (start + f"mbx writes the campaign; {NOT_THROUGH}: move the link "
            "away and put a real directory in its place (the folder it points to, moved back)")  # fmt: skip
