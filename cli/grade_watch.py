"""How ``entropyrl grade`` shows it is alive (a heartbeat line into a log) and what it keeps when it
stops before the end: the lines graded so far, moved from the unfinished output to
``<out>.partial.jsonl``; the output itself is only ever written whole."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from ..core.errors import UserError


def partial_path(target: Path) -> Path:
    """Where the lines graded before a stop are kept: ``<target>`` with ``.partial.jsonl``."""
    return target.with_name(target.name.removesuffix(".jsonl") + ".partial.jsonl")


class GradingInterrupted(KeyboardInterrupt):
    """A stop signal during grading: ``graded`` lines were graded, kept in ``kept`` (None: none were)."""

    def __init__(self, graded: int, kept: Path | None):
        super().__init__(graded, kept)
        self.graded, self.kept = graded, kept


@contextmanager
def kept_when_stopped(tmp: Path, target: Path, sink, graded: Callable[[], int]) -> Iterator[None]:
    """Grading that stops before the end (a stop signal, a grading pool that broke) keeps the lines
    graded so far: they move from the unfinished output to ``partial_path(target)`` and the error
    says where. ``target`` itself is only ever written whole."""
    try:
        yield
    except (KeyboardInterrupt, UserError) as exc:
        kept, count = None, graded()
        if count:
            sink.flush()
            kept = partial_path(target)
            os.replace(tmp, kept)
        if isinstance(exc, KeyboardInterrupt):
            raise GradingInterrupted(count, kept) from None
        if kept is None:
            raise
        raise UserError(f"{exc}; the {count} line(s) graded before are kept in {kept}") from None


class Heartbeat:
    """With no terminal (stderr to a log file, where the bar does not draw): a line every ``every_s``
    seconds with the lines graded so far and the rate, so that long grading shows it is alive."""

    def __init__(self, err, file: Path, every_s: float):
        self.err, self.file, self.every_s = err, file, every_s
        self.done, self.start = 0, time.monotonic()
        self.last = self.start

    def advance(self, k: int) -> None:
        self.done += k
        now = time.monotonic()
        if self.err.is_terminal or now - self.last < self.every_s:
            return
        self.last = now
        rate = self.done / max(now - self.start, 1e-9)
        self.err.print(f"grading {self.file}: {self.done} line(s) graded, {rate:.1f}/s", markup=False, highlight=False)
