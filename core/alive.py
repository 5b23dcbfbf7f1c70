"""A sign of life for a long step that reports nothing itself (reading and tokenising a large data
file, a library call that takes minutes): a line every ``every_s`` seconds while it runs."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["still_working"]


@contextmanager
def still_working(log: Callable[[str], None], what: str, every_s: float = 30.0) -> Iterator[None]:
    """While the block runs, ``log("<what>: still working, <N> s")`` every ``every_s`` seconds from a
    daemon thread; nothing when the block ends sooner. The block itself is not touched."""
    done = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not done.wait(every_s):
            log(f"{what}: still working, {time.monotonic() - started:.0f} s")

    thread = threading.Thread(target=beat, name="still-working", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
