"""Login-side environment fingerprint written into launch.json (the trainer adds GPU details in env.json)."""

from __future__ import annotations

import functools
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=1)
def project_git_sha() -> str | None:
    """Commit of the mbx checkout (with '+dirty' when it has uncommitted changes), or None outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


@functools.lru_cache(maxsize=1)
def mbx_version() -> str:
    try:
        return metadata.version("mbx")
    except metadata.PackageNotFoundError:
        return "unknown"


def login_fingerprint(campaign: Any = None) -> dict[str, Any]:
    """What the submitting side knows: mbx version and commit, host, python, container image."""
    container = getattr(getattr(campaign, "container", None), "image", None)
    return {
        "mbx_version": mbx_version(),
        "git_sha": project_git_sha(),
        "submit_host": socket.gethostname(),
        "python": platform.python_version(),
        "container_image": container,
    }
