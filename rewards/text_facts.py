"""The text facts of a batch's responses (``evals.reflection.response_facts``: each response's
reflection-word spans, repetition score and length), computed in worker processes while the reward
runs, so that the trainer only adds them up and maps the spans onto tokens.

``TextFactsPool(workers)``: ``workers`` spawned processes, started at the first batch; ``submit``
hands a batch over in contiguous chunks and returns at once; the returned ``PendingFacts.result()``
waits for them. ``workers: 0`` computes them in the caller's process, when the result is asked
for. A pool that fails (a worker killed) gives the batch to the caller's process and is started
afresh for the next batch: the facts are diagnostics, never a reason to stop a run.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
from dataclasses import dataclass
from typing import Callable, Sequence

from ..evals.reflection import ReflectionMatcher, ResponseFacts, response_facts

__all__ = ["TextFactsSpec", "TextFactsPool", "PendingFacts"]

#: responses per task handed to a worker: a worker starts on the first chunk while the next are sent
CHUNK = 256


@dataclass(frozen=True)
class TextFactsSpec:
    """What to find in each response: the reflection words (``matcher``, disabled for an empty
    list), the ``n`` of the repetition score, and how many processes find it (0: the caller's)."""

    matcher: ReflectionMatcher
    repetition_n: int = 4
    workers: int = 1


class PendingFacts:
    """The facts of one submitted batch, on their way."""

    def __init__(self, owner: TextFactsPool, texts: list[str], spec: TextFactsSpec, futures: list[cf.Future]):
        self.owner, self.texts, self.spec, self.futures = owner, texts, spec, futures

    def result(self) -> ResponseFacts:
        try:
            parts = [f.result() for f in self.futures]
        except Exception as exc:  # noqa: BLE001 - a worker died, or its process could not start
            self.owner.failed(f"{type(exc).__name__}: {exc}")
            parts = []
        if len(parts) != len(self.futures) or not self.futures:
            return response_facts(self.texts, self.spec.matcher, self.spec.repetition_n)
        return ResponseFacts.concat(parts)


def _ready() -> None:
    """A task that only makes a worker import this module (its start, outside any batch)."""


class TextFactsPool:
    """Worker processes that compute ``response_facts`` beside the reward."""

    def __init__(self, workers: int, log: Callable[[str], None] = print):
        self.workers, self.log = max(0, int(workers)), log
        self.pool: cf.ProcessPoolExecutor | None = None
        self.failures = 0

    def start(self) -> None:
        """Start the processes now (they import numpy and this package while the caller goes on)."""
        if self.workers and self.pool is None:
            self.pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
            for _ in range(self.workers):
                self.pool.submit(_ready)

    def submit(self, texts: Sequence[str], spec: TextFactsSpec) -> PendingFacts:
        """Hand ``texts`` over; ``.result()`` of the answer is their ``ResponseFacts``, in order."""
        texts = list(texts)
        if not self.workers or not texts:
            return PendingFacts(self, texts, spec, [])
        self.start()
        try:
            futures = [
                self.pool.submit(response_facts, texts[a : a + CHUNK], spec.matcher, spec.repetition_n)
                for a in range(0, len(texts), CHUNK)
            ]
        except Exception as exc:  # noqa: BLE001 - a broken pool refuses new work
            self.failed(f"{type(exc).__name__}: {exc}")
            futures = []
        return PendingFacts(self, texts, spec, futures)

    def failed(self, detail: str) -> None:
        """A batch the pool could not do: said once, the pool dropped (started afresh next time)."""
        if not self.failures:
            self.log(f"warning: the text-metrics worker failed ({detail}); that batch's text metrics ran in this process")
        self.failures += 1
        self.close(wait=False)

    def close(self, wait: bool = True) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=True)
            self.pool = None
