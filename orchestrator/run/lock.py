"""One orchestrator per campaign, no campaign during a store rebuild: flocks on <campaign>/.lock and <workspace>/.lock."""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from pathlib import Path
from typing import IO, ClassVar

from orchestrator.errors import RunError
from orchestrator.run.disk import FULL_ERRNOS, full_disk_error
from orchestrator.run.workspace_links import LOCK_FILE, link_refused, refuse_links, refuse_workspace_links


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lock_holders(path: Path) -> list[int]:
    """The pids /proc/locks names as holding a flock on `path` (Linux; [] elsewhere or when it cannot be read)."""
    try:
        found = path.stat()
        wanted = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino}"
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids = []
    for line in lines:
        fields = line.split()
        if "->" not in fields and len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted:
            pid = int(fields[4]) if fields[4].lstrip("-").isdigit() else -1
            if pid > 0 and pid != os.getpid() and _alive(pid):
                pids.append(pid)
    return pids


def _command_of(pid: int) -> str:
    """`mbx campaign run x.yaml` for an mbx process (its argv after `-m orchestrator` or the mbx script)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return ""
    argv = [a for a in argv if a]
    for i, word in enumerate(argv):
        if word == "orchestrator" and i and argv[i - 1] == "-m" or word.endswith("/mbx") or word == "mbx":
            return " ".join(["mbx", *argv[i + 1 :]])[:200]
    return " ".join(argv)[:200]


def _holder(path: Path) -> str:
    """Who holds the lock now: the live process /proc/locks names, with what signed the file when that is the same
    process (`mbx store rebuild pid 123 (mbx store rebuild -w ws)`); else the signature when its pid still runs;
    else "another process" (never a pid that has ended)."""
    try:
        signature = path.read_text(errors="replace").strip()[:200]
    except OSError:
        signature = ""
    what, _, signed = signature.rpartition(" pid ")
    signed_pid = int(signed) if signed.isdigit() else None
    for pid in _lock_holders(path):
        command = _command_of(pid)
        return f"{what if pid == signed_pid and what else 'process'} pid {pid}" + (f" ({command})" if command else "")
    if signed_pid is not None and _alive(signed_pid):
        return signature
    return "another process"


def _open_no_follow(path: str, flags: int) -> int:
    """open(2) that refuses a symbolic link as the last part of `path` (ELOOP) instead of writing through it."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o644)


def _flock(path: Path, mode: int, campaign: str | None = None) -> IO[str] | None:
    """`path` opened (never through a link: refused naming it, as the campaign `campaign`'s lock or the workspace's)
    and flocked (`mode` without LOCK_NB); None when another open file holds it."""
    try:
        handle = open(path, "a+", opener=_open_no_follow)  # noqa: SIM115 (held until _release)
    except OSError as err:
        if err.errno in FULL_ERRNOS:
            raise full_disk_error(path, "mbx could not make its lock file") from None
        if err.errno == errno.ELOOP and path.is_symlink():
            raise link_refused(path, campaign) from None
        raise
    try:
        fcntl.flock(handle, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _sign(handle: IO[str], what: str) -> None:
    """Write who holds the lock into it (`mbx pid N`), for the message of whoever is refused."""
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{what} pid {os.getpid()}")
        handle.flush()
    except OSError as err:
        if err.errno in FULL_ERRNOS:
            raise full_disk_error(Path(handle.name), "mbx could not sign its lock") from None
        raise


def _release(handles: list[IO[str]]) -> None:
    for handle in reversed(handles):
        fcntl.flock(handle, fcntl.LOCK_UN)
        try:
            handle.close()
        except OSError:  # a signature a full disk did not take: nothing else is lost
            pass


class CampaignLock:
    """Held while a campaign is run or resumed; released by the OS even on SIGKILL. Re-entrant within one thread
    (a search holds it across its rungs while each rung's run takes it again); other threads and processes are
    refused. It also holds the workspace's lock shared, so no campaign runs while `mbx store rebuild` holds it."""

    _held: ClassVar[dict[tuple[int, Path], tuple[list[IO[str]], int]]] = {}
    _guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK_FILE
        self._key: tuple[int, Path] | None = None
        self._made = False  # whether acquiring made the campaign's folder

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
        refuse_links(self.path.parent)  # the campaign's, its cells' and attempts' folders: no link written through
        self._made = not self.path.parent.exists()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            if err.errno in FULL_ERRNOS:
                raise full_disk_error(self.path.parent, "mbx could not make the campaign's folder") from None
            raise
        handle = _flock(self.path, fcntl.LOCK_EX, self.path.parent.name)
        if handle is None:
            holder = _holder(self.path)
            raise RunError(
                f"campaign {self.path.parent.name!r} is already being run by {holder} (lock {self.path}); "
                "wait for it, or stop it with `mbx campaign cancel`"
            )
        workspace_lock = self.path.parent.parent / LOCK_FILE
        try:
            _sign(handle, "mbx")
            shared = _flock(workspace_lock, fcntl.LOCK_SH)
            if shared is None:
                holder = _holder(workspace_lock)
                raise RunError(
                    f"workspace {workspace_lock.parent} is locked by {holder} (lock {workspace_lock}): no "
                    "campaign may start while its run store is rebuilt; wait for `mbx store rebuild` to finish"
                )
        except BaseException:
            self._unmake()
            _release([handle])
            raise
        return [handle, shared]

    def _unmake(self) -> None:
        """The campaign's folder, when this lock made it and it holds nothing but the lock (a run or an ingest
        that a full disk stopped before it wrote anything), removed again while the lock is still held."""
        folder = self.path.parent
        try:
            if self._made and set(os.listdir(folder)) <= {LOCK_FILE} and not self.path.is_symlink():
                self.path.unlink(missing_ok=True)
                folder.rmdir()
        except OSError:  # something came in meanwhile: kept
            pass

    def __exit__(self, *exc: object) -> None:
        assert self._key is not None, "CampaignLock exited without being entered"
        with self._guard:
            handles, depth = self._held[self._key]
            if depth > 1:
                self._held[self._key] = (handles, depth - 1)
                return
            del self._held[self._key]
        if exc[0] is not None:
            self._unmake()
        _release(handles)


class WorkspaceLock:
    """Held by `mbx store rebuild`: the workspace's lock exclusively and every campaign's lock, so the store is not
    replaced under a running campaign and none starts until the rebuild ends. Refused, naming the campaign, while
    any campaign of the workspace is run, resumed or re-judged."""

    def __init__(self, workspace: Path):
        self.workspace = Path(workspace)
        self._handles: list[IO[str]] = []

    def __enter__(self) -> WorkspaceLock:
        refuse_workspace_links(self.workspace)  # the store it rebuilds is no link written through
        path = self.workspace / LOCK_FILE
        whole = _flock(path, fcntl.LOCK_EX)
        if whole is None:
            raise self._busy(path)
        self._handles.append(whole)
        try:
            for lock in sorted(self.workspace.glob(f"*/{LOCK_FILE}")):
                handle = _flock(lock, fcntl.LOCK_EX, lock.parent.name) if lock.is_file() else None
                if handle is None and lock.is_file():
                    raise self._busy(path)
                if handle is not None:
                    self._handles.append(handle)
            for handle in self._handles:  # each lock names the rebuild while it holds it (not the run before)
                _sign(handle, "mbx store rebuild")
        except BaseException:
            _release(self._handles)
            self._handles = []
            raise
        return self

    def _busy(self, path: Path) -> RunError:
        """Why the workspace cannot be locked: the first campaign being run, else whoever holds the workspace."""
        for lock in sorted(self.workspace.glob(f"*/{LOCK_FILE}")):
            if not lock.is_file() or str(lock) in {h.name for h in self._handles}:
                continue
            probe = _flock(lock, fcntl.LOCK_EX, lock.parent.name)
            if probe is not None:
                _release([probe])
                continue
            holder = _holder(lock)
            return RunError(
                f"campaign {lock.parent.name!r} is being run by {holder} (lock {lock}): the run store of "
                f"{self.workspace} cannot be rebuilt while a campaign runs; wait for it, or stop it with "
                f"`mbx campaign cancel {lock.parent.name}`"
            )
        return RunError(f"workspace {self.workspace} is in use by {_holder(path)} (lock {path}); wait for it")

    def __exit__(self, *exc: object) -> None:
        _release(self._handles)
        self._handles = []
