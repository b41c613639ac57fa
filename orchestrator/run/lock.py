"""One orchestrator per campaign, no campaign during a store rebuild: flocks on <campaign>/.lock and <workspace>/.lock."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import IO, ClassVar

from orchestrator.errors import RunError

LOCK_FILE = ".lock"  # <workspace>/<campaign>/.lock (one orchestrator) and <workspace>/.lock (rebuild vs campaigns)


def _holder(handle: IO[str]) -> str:
    handle.seek(0)
    return handle.read().strip() or "another process"


def _flock(path: Path, mode: int) -> IO[str] | None:
    """`path` opened and flocked (`mode` without LOCK_NB); None when another open file holds it."""
    handle = path.open("a+")
    try:
        fcntl.flock(handle, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _sign(handle: IO[str], what: str) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(f"{what} pid {os.getpid()}")
    handle.flush()


def _release(handles: list[IO[str]]) -> None:
    for handle in reversed(handles):
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


class CampaignLock:
    """Held while a campaign is run or resumed; released by the OS even on SIGKILL. Re-entrant within one thread
    (a search holds it across its rungs while each rung's run takes it again); other threads and processes are
    refused. It also holds the workspace's lock shared, so no campaign runs while `mbx store rebuild` holds it."""

    _held: ClassVar[dict[tuple[int, Path], tuple[list[IO[str]], int]]] = {}
    _guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK_FILE
        self._key: tuple[int, Path] | None = None

    def __enter__(self) -> CampaignLock:
        self._key = (threading.get_ident(), self.path.parent.resolve() / LOCK_FILE)
        with self._guard:
            if self._key in self._held:
                handles, depth = self._held[self._key]
                self._held[self._key] = (handles, depth + 1)
                return self
            self._held[self._key] = (self._acquire(), 1)
        return self

    def _acquire(self) -> list[IO[str]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = _flock(self.path, fcntl.LOCK_EX)
        if handle is None:
            with self.path.open() as busy:
                holder = _holder(busy)
            raise RunError(
                f"campaign {self.path.parent.name!r} is already being run by {holder} (lock {self.path}); "
                "wait for it, or stop it with `mbx campaign cancel`"
            )
        _sign(handle, "mbx")
        workspace_lock = self.path.parent.parent / LOCK_FILE
        shared = _flock(workspace_lock, fcntl.LOCK_SH)
        if shared is None:
            _release([handle])
            with workspace_lock.open() as busy:
                holder = _holder(busy)
            raise RunError(
                f"workspace {workspace_lock.parent} is locked by {holder} (lock {workspace_lock}): no campaign "
                "may start while its run store is rebuilt; wait for `mbx store rebuild` to finish"
            )
        return [handle, shared]

    def __exit__(self, *exc: object) -> None:
        assert self._key is not None, "CampaignLock exited without being entered"
        with self._guard:
            handles, depth = self._held[self._key]
            if depth > 1:
                self._held[self._key] = (handles, depth - 1)
                return
            del self._held[self._key]
        _release(handles)


class WorkspaceLock:
    """Held by `mbx store rebuild`: the workspace's lock exclusively and every campaign's lock, so the store is not
    replaced under a running campaign and none starts until the rebuild ends. Refused, naming the campaign, while
    any campaign of the workspace is run, resumed or re-judged."""

    def __init__(self, workspace: Path):
        self.workspace = Path(workspace)
        self._handles: list[IO[str]] = []

    def __enter__(self) -> WorkspaceLock:
        path = self.workspace / LOCK_FILE
        whole = _flock(path, fcntl.LOCK_EX)
        if whole is None:
            raise self._busy(path)
        self._handles.append(whole)
        try:
            for lock in sorted(self.workspace.glob(f"*/{LOCK_FILE}")):
                handle = _flock(lock, fcntl.LOCK_EX) if lock.is_file() else None
                if handle is None and lock.is_file():
                    raise self._busy(path)
                if handle is not None:
                    self._handles.append(handle)
        except BaseException:
            _release(self._handles)
            self._handles = []
            raise
        _sign(whole, "mbx store rebuild")
        return self

    def _busy(self, path: Path) -> RunError:
        """Why the workspace cannot be locked: the first campaign being run, else whoever holds the workspace."""
        for lock in sorted(self.workspace.glob(f"*/{LOCK_FILE}")):
            if not lock.is_file() or str(lock) in {h.name for h in self._handles}:
                continue
            probe = _flock(lock, fcntl.LOCK_EX)
            if probe is not None:
                _release([probe])
                continue
            with lock.open() as busy:
                holder = _holder(busy)
            return RunError(
                f"campaign {lock.parent.name!r} is being run by {holder} (lock {lock}): the run store of "
                f"{self.workspace} cannot be rebuilt while a campaign runs; wait for it, or stop it with "
                f"`mbx campaign cancel {lock.parent.name}`"
            )
        return RunError(f"workspace {self.workspace} is in use by another mbx command (lock {path}); wait for it")

    def __exit__(self, *exc: object) -> None:
        _release(self._handles)
        self._handles = []
