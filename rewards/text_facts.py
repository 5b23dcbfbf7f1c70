"""The text facts of a batch's responses (``evals.reflection.response_facts``: each response's
reflection-word spans, repetition score and length), computed in worker processes while the reward
runs, so that the trainer only adds them up and maps the spans onto tokens.

``TextFactsPool(workers)``: ``workers`` processes, started at the first batch; ``submit`` hands
each one a contiguous part of the batch and returns at once; the returned ``PendingFacts.result()``
waits for the parts. ``workers: 0`` computes them in the caller's process, when the result is asked
for. A worker that fails (killed, or unable to start) gives its part to the caller's process and
the pool is started afresh for the next batch, up to ``MAX_FAILURES`` times, then left off: the
facts are diagnostics, never a reason to stop a run.

A worker is a plain subprocess (``python -E -s -c "...serve(fd)"``) that talks over a socket pair:
it never re-imports the caller's ``__main__`` (a training script without a main guard is not run
again) and is safe to start from a multi-threaded parent. Every wait on it is bounded: a worker
that died is seen at once (its end of the socket closes), and one that is stuck or stopped (a
paused process, a full machine) answers within ``WAIT_SECONDS`` or is taken as failed (the socket's
send and receive time limits), so the trainer never waits on it for ever.
"""

from __future__ import annotations

import socket
import struct
import subprocess
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Callable, Sequence

from ..core.helper_process import ignore_group_stop_signals, spawn_socket_helper
from ..evals.reflection import ReflectionMatcher, ResponseFacts, matcher_for, response_facts

__all__ = ["TextFactsSpec", "TextFactsPool", "PendingFacts", "serve"]

MAX_FAILURES = 3
#: Longest wait, in seconds, for a worker to take a part or answer it (far above what a part takes).
WAIT_SECONDS = 120.0

_WORKER_ENTRY = "entropyrl.rewards.text_facts:serve"  # started by core/helper_process.spawn_socket_helper


@dataclass(frozen=True)
class TextFactsSpec:
    """What to find in each response: the reflection words (``matcher``, disabled for an empty
    list), the ``n`` of the repetition score, and how many processes find it (0: the caller's)."""

    matcher: ReflectionMatcher
    repetition_n: int = 4
    workers: int = 1


def serve(fd: int) -> None:
    """A worker's loop on socket ``fd``: reads ``(texts, words, n)``, answers their ``ResponseFacts``
    (or the error's text); ends when the parent closes its end (also when the parent dies).
    A stop signal to the process group (Ctrl-C, ``timeout``, a scheduler) is the trainer's to handle
    at a step boundary; this worker ignores it so that the step in progress keeps its helpers."""
    ignore_group_stop_signals()
    conn = Connection(fd)
    while True:
        try:
            texts, words, n = conn.recv()
        except (EOFError, OSError):
            return
        try:
            out = response_facts(texts, matcher_for(tuple(words)), n)
        except Exception as exc:  # noqa: BLE001 - said to the parent, which computes the part itself
            out = f"{type(exc).__name__}: {exc}"
        try:
            conn.send(out)
        except OSError:
            return


class _Worker:
    """One worker process and our end of its socket."""

    def __init__(self):
        self.proc, ours = spawn_socket_helper(_WORKER_ENTRY)
        limit = struct.pack("ll", int(WAIT_SECONDS), int((WAIT_SECONDS % 1) * 1e6))  # a timeval
        for option in (socket.SO_SNDTIMEO, socket.SO_RCVTIMEO):  # a blocked send or receive fails after it
            ours.setsockopt(socket.SOL_SOCKET, option, limit)
        self.conn = Connection(ours.detach())

    def stop(self) -> None:
        self.conn.close()  # an idle worker ends on EOF
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class PendingFacts:
    """The facts of one submitted batch, on their way: ``parts`` are ``(worker or None, texts)``
    in the batch's order (None: computed here when asked for)."""

    def __init__(self, owner: TextFactsPool, spec: TextFactsSpec, parts: list[tuple[_Worker | None, list[str]]]):
        self.owner, self.spec, self.parts = owner, spec, parts
        self.facts: ResponseFacts | None = None

    def result(self) -> ResponseFacts:
        if self.facts is None:
            out = []
            for worker, texts in self.parts:
                got = None
                if worker is not None:
                    try:
                        got = worker.conn.recv()
                    except BlockingIOError:  # the receive time limit: stuck or stopped, not dead
                        got = f"no answer within {WAIT_SECONDS:g} s (the worker is stuck or stopped)"
                    except (EOFError, OSError) as exc:
                        got = f"the worker ended ({type(exc).__name__}, exit code {worker.proc.poll()})"
                    if isinstance(got, str):
                        self.owner.failed(got)
                if not isinstance(got, ResponseFacts):
                    got = response_facts(texts, self.spec.matcher, self.spec.repetition_n)
                out.append(got)
            self.facts = ResponseFacts.concat(out)
            if self.owner.open is self:
                self.owner.open = None
        return self.facts


class TextFactsPool:
    """Worker processes that compute ``response_facts`` beside the reward."""

    def __init__(self, workers: int, log: Callable[[str], None] = print):
        self.workers, self.log = max(0, int(workers)), log
        self._procs: list[_Worker] = []
        self.failures = 0
        self.restart = False  # a worker failed: the next batch starts them afresh
        self.open: PendingFacts | None = None  # a batch whose answers are still in the sockets

    def start(self) -> None:
        """Start the processes now (they import numpy and this package while the caller goes on)."""
        while len(self._procs) < self.workers:
            try:
                self._procs.append(_Worker())
            except OSError as exc:
                self.failed(f"{type(exc).__name__}: {exc}")
                self.workers = len(self._procs)  # as many as could start
                return

    def submit(self, texts: Sequence[str], spec: TextFactsSpec) -> PendingFacts:
        """Hand ``texts`` over; ``.result()`` of the answer is their ``ResponseFacts``, in order."""
        texts = list(texts)
        if self.open is not None:  # never collected (its reward failed): read it, or the workers' sends block
            self.open.result()
        if self.restart:
            self.close()
            self.restart = False
        self.start()
        if not self._procs or not texts:
            return PendingFacts(self, spec, [(None, texts)])
        size = -(-len(texts) // len(self._procs))
        parts: list[tuple[_Worker | None, list[str]]] = []
        for worker, a in zip(self._procs, range(0, len(texts), size)):
            part = texts[a : a + size]
            try:
                worker.conn.send((part, spec.matcher.words, spec.repetition_n))
            except OSError as exc:  # a worker that died or never started: this part is computed here
                self.failed(f"the worker ended ({type(exc).__name__}, exit code {worker.proc.poll()})")
                worker = None
            parts.append((worker, part))
        self.open = PendingFacts(self, spec, parts)
        return self.open

    def failed(self, detail: str) -> None:
        """A part the pool could not do (computed by the caller): said once; the workers are started
        afresh for the next batch, or no more after ``MAX_FAILURES``."""
        self.failures += 1
        if self.failures == 1:
            self.log(f"warning: a text-metrics worker failed ({detail}); its responses' text metrics ran in this process")
        if self.failures >= MAX_FAILURES:
            self.workers = 0
        self.restart = True

    def close(self) -> None:
        procs, self._procs = self._procs, []
        for w in procs:
            w.stop()
