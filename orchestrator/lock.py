"""One orchestrator per campaign: an exclusive flock on <workspace>/<campaign>/.lock, taken before any write."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import IO, ClassVar

from orchestrator.errors import RunError


class CampaignLock:
    """Held while a campaign is run or resumed; released by the OS even on SIGKILL. Re-entrant within one thread
    (a search holds it across its rungs while each rung's run takes it again); other threads and processes are
    refused."""

    _held: ClassVar[dict[tuple[int, Path], tuple[IO[str], int]]] = {}
    _guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, directory: Path):
        self.path = Path(directory) / ".lock"
        self._key: tuple[int, Path] | None = None

    def __enter__(self) -> CampaignLock:
        self._key = (threading.get_ident(), self.path.parent.resolve() / ".lock")
        with self._guard:
            if self._key in self._held:
                handle, depth = self._held[self._key]
                self._held[self._key] = (handle, depth + 1)
                return self
            self._held[self._key] = (self._acquire(), 1)
        return self

    def _acquire(self) -> IO[str]:
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
        return handle

    def __exit__(self, *exc: object) -> None:
        assert self._key is not None, "CampaignLock exited without being entered"
        with self._guard:
            handle, depth = self._held[self._key]
            if depth > 1:
                self._held[self._key] = (handle, depth - 1)
                return
            del self._held[self._key]
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
