"""One writer per folder: an exclusive ``flock`` on ``<folder>/<name>`` held for a run's (or a
sweep's) whole life.

The kernel drops a ``flock`` when its holder exits, however it exits, so a lock file left by a
dead process is free to take: no pid guessing, no race between two starters (the second one's
non-blocking ``flock`` fails at once). The file holds the holder's host, pid and start time only to
name it in the refusal; it is never deleted (deleting a lock file lets two processes each hold a
lock on a different inode).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError


def make_folder(folder: Path, what: str) -> Path:
    """``mkdir -p`` with one ``error:`` line when it cannot be made (under a file, /proc, read-only...)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{what}={folder} cannot be created ({exc.strerror or exc}): pick a folder you can write to") from None
    return folder


class FolderLock:
    """``with FolderLock(path, "run", hint):`` holds ``path/.lock`` or raises ``UserError`` naming the
    holder; ``hint`` says what to do instead (another output_dir=..., wait)."""

    def __init__(
        self,
        folder: Path,
        what: str = "run",
        hint: str = "wait for it to end or use another folder",
        name: str = ".lock",
        key: str = "output_dir",
    ):
        self.folder, self.what, self.hint, self.key = Path(folder), what, hint, key
        self.path = self.folder / name
        self._fd: int | None = None

    def holder(self) -> dict:
        """What the lock file says about the process that holds (or last held) it."""
        try:
            data = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def acquire(self, record: bool = True) -> FolderLock:
        make_folder(self.folder, self.key)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserError(
                f"{self.key}={self.folder}: cannot create its lock file {self.path} "
                f"({exc.strerror or exc}): pick a folder you can write to"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            held = self.holder()
            since = time.strftime("%H:%M:%S", time.localtime(held["since"])) if held.get("since") else "?"
            raise UserError(
                f"{self.key}={self.folder} is in use by another {self.what} (host "
                f"{held.get('host', '?')}, pid {held.get('pid', '?')}, since {since}): {self.hint}"
            ) from None
        holder = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()})
        try:
            if record:
                os.ftruncate(fd, 0)
                os.pwrite(fd, holder.encode(), 0)
        except OSError:  # a full disk: the lock itself holds, only the holder's name is missing
            pass
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def check_free(self) -> None:
        """Raise the refusal now if another process holds the lock (takes and drops it at once)."""
        if self.path.exists():
            self.acquire(record=False).release()

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


@contextmanager
def build_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` while one cache entry is built, so that concurrent
    builders of the same entry (the jobs of a sweep on a fresh machine) wait for the first one and
    then find its result, instead of each repeating minutes of work. ``on_wait`` is called once when
    the lock is held by another process. The builds stay atomic without it: where the filesystem
    refuses ``flock`` (some network filesystems), building goes on unlocked. Yields whether the
    lock is held (no other builder of the entry can be at work)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        fd = -1
    held = False
    try:
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = True
            except OSError:
                pass
        yield held
    finally:
        if fd >= 0:
            os.close(fd)  # closing drops the lock
