"""Crash-safe file writes: a file appears whole or not at all, and a rename is made durable."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Iterator


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename, a new file) durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a folder; the rename is still atomic
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """``with atomic_path(p) as tmp:`` write ``tmp`` (a file beside ``p``); on success it is fsync'd
    and renamed onto ``p``; on any failure (a full disk, a signal) it is removed and ``p`` keeps its
    old content. A writer that needs a file type from the name (matplotlib) must be told it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # umask permissions; the name cut so that a name the file system takes still fits with the suffix
    tmp = path.parent / f".{path.name[:200]}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a crash leaves either the old or the new file, never half."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def atomic_write_lines(path: Path, lines) -> None:
    """``atomic_write_text`` for an iterable of lines (each written with a trailing newline)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (same device and inode: through ``..``, a symlink or a hard
    link); False when either does not exist."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
