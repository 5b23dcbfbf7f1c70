"""Crash-safe file writes (a file appears whole or not at all, a rename is made durable), and whether a
folder or a file can be written at a path, asked before any work."""

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


def _first_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            return p
    return Path(".")


def folder_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be (or become) a writable folder, or None when it can."""
    p = Path(os.path.expanduser(str(path))).absolute()
    if p.exists() and not p.is_dir():
        return f"{p} is a file, not a folder"
    base = _first_existing(p)
    if not base.is_dir():
        return f"{p} lies under {base}, which is a file, not a folder"
    if p.parts[1:2] in (("proc",), ("sys",)):  # the kernel's own files: root may "write", mkdir fails
        return f"{p} lies under /{p.parts[1]}, the kernel's pseudo file system, where no folder can be made"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{base} is not writable"
    return None


def file_problem(path: str | Path) -> str | None:
    """Why a file cannot be written at ``path`` (a folder there, a parent that is a file, no
    permission), or None when it can."""
    p = Path(os.path.expanduser(str(path))).absolute()
    long = _name_too_long(p)
    if long:
        return long
    if p.is_dir():
        return f"{p} is a folder, not a file"
    if p.exists():
        return None if os.access(p, os.W_OK) else f"{p} is not writable"
    base = _first_existing(p.parent)
    if not base.is_dir():
        return f"{p} lies under {base}, which is a file, not a folder"
    return None if os.access(base, os.W_OK | os.X_OK) else f"{base} is not writable"


def _name_too_long(p: Path) -> str | None:
    """A part of ``p`` longer than its file system takes (NAME_MAX bytes, usually 255), said before
    minutes of work rather than when the file is written."""
    limit = 255
    for folder in reversed(p.parents):  # "/", "/a", "/a/b", ...: the deepest existing folder's limit
        try:
            if not folder.is_dir():
                break
            limit = os.pathconf(folder, "PC_NAME_MAX")
        except (OSError, ValueError):  # a part too long to even look up ends the walk
            break
    for part in p.parts[1:]:
        size = len(part.encode("utf-8", errors="surrogateescape"))
        if size > limit:
            return f"the name {part[:24]}... is {size} bytes, over the {limit} this file system takes"
    return None
