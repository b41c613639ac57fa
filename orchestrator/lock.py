"""One orchestrator per campaign: an exclusive flock on <workspace>/<campaign>/.lock, taken before any write."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from orchestrator.errors import RunError


class CampaignLock:
    """Held while a campaign is run or resumed; released by the OS even on SIGKILL."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / ".lock"
        self._handle: IO[str] | None = None

    def __enter__(self) -> CampaignLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise RunError(
                f"campaign {self.path.parent.name!r} is already being run by {holder} (lock {self.path}); "
                "wait for it, or stop it with `mbx campaign cancel`"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"mbx pid {os.getpid()}")
        handle.flush()
        self._handle = handle
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None
