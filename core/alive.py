"""A sign of life for a long step that reports nothing itself (reading and tokenising a large data
file, a library call that takes minutes): a line every ``every_s`` seconds while it runs."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["repeating", "still_working"]


@contextmanager
def repeating(fn: Callable[[], None], every_s: float) -> Iterator[None]:
    """``fn()`` called from a daemon thread every ``every_s`` seconds while the block runs (never when
    the block ends sooner); the block itself is not touched."""
    done = threading.Event()

    def run() -> None:
        while not done.wait(every_s):
            fn()

    thread = threading.Thread(target=run, name="still-working", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@contextmanager
def still_working(log: Callable[[str], None], what: str, every_s: float = 30.0) -> Iterator[None]:
    """While the block runs, ``log("<what>: still working, <N> s")`` every ``every_s`` seconds from a
    daemon thread; nothing when the block ends sooner. The block itself is not touched."""
    started = time.monotonic()
    with repeating(lambda: log(f"{what}: still working, {time.monotonic() - started:.0f} s"), every_s):
        yield
