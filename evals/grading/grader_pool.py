"""The math-verify worker pool: a per-item time limit enforced from outside, warm workers.

The per-item time limit (default 5 s) is enforced from outside: the parent hands each worker at
most two items at a time and kills and replaces a worker whose current item runs past its
deadline (verdict False, reason "timeout"; the item queued behind it goes to another worker).
math-verify's own ``signal.alarm`` timeouts stay on inside the workers as a cheaper first line,
but are not relied on: a computation stuck in C code (a huge integer power, say) never returns
to the interpreter to receive the signal.

Processes: one *zygote*, a plain subprocess (``python -E -s -c "...grader_worker.zygote(fd)"``: it
never re-imports the caller's ``__main__`` and is safe to start from a multi-threaded parent),
imports math-verify once and forks the workers, so a worker starts in milliseconds; after the
first kill it warms math-verify's parsers up between requests, so that later replacements start
warm (a cold start is not delayed by a warm-up it may never need). Workers live for the whole process
(reused across calls), die with the zygote, and are capped in address space
(``ENTROPYRL_GRADER_MEM_GB``, default 4; 0 = no cap) so that a pathological answer cannot eat the
machine's memory. ``ENTROPYRL_GRADER_WARMUP=0`` skips the zygote's warm-up.

Model text is never executed: the only parser of model text is math-verify's LaTeX parser
(``LatexExtractionConfig`` only, so no Python expression parser ever sees it).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import wait as mp_wait
from typing import Callable, Sequence

from ...core.helper_process import spawn_socket_helper

__all__ = ["GradingPool", "run_pool", "shutdown_pool", "cpu_count", "start_pool"]


# the zygote imports this package and math-verify only (core/helper_process.spawn_socket_helper)
_ZYGOTE_ENTRY = "entropyrl.evals.grading.grader_worker:zygote"


class GradingPoolError(RuntimeError):
    """The grading processes cannot go on (they do not start, or their zygote died twice in a row):
    the caller's to say in one line (``entropyrl grade``), or to count as a failed call (a reward)."""


class _Zygote:
    """A plain subprocess running ``_zygote`` (never re-imports the caller's ``__main__``; safe
    to start from a multi-threaded parent) that forks warm workers."""

    def __init__(self):
        self.proc, self.ctl = spawn_socket_helper(_ZYGOTE_ENTRY, warnings=False)
        self.ready = False
        self.warm_asked = False

    def spawn(self) -> tuple[int, int]:
        """A new worker: ``(pid, socket fd)``."""
        import socket

        if not self.ready:
            self.ctl.settimeout(WORKER_START_TIMEOUT)
            try:
                got = self.ctl.recv(1)
            except OSError:
                got = b""
            if got != b"R":
                raise GradingPoolError(
                    "the grading process failed to start (is math-verify installed "
                    f"for {sys.executable}?); exit code {self.proc.poll()}"
                )
            self.ctl.settimeout(None)
            self.ready = True
        self.ctl.settimeout(SPAWN_TIMEOUT)  # a stuck or stopped zygote must not hold the grader for ever
        try:
            self.ctl.sendall(b"s")
            msg, fds, _, _ = socket.recv_fds(self.ctl, 64, 1)
        except OSError as exc:  # socket.timeout is an OSError
            raise GradingPoolError(
                f"the grading process did not answer ({type(exc).__name__}; exit code {self.proc.poll()})"
            ) from None
        finally:
            self.ctl.settimeout(None)
        if not msg or not fds:
            raise GradingPoolError(f"the grading process died (exit code {self.proc.poll()})")
        return int(msg.decode()), fds[0]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def warm_up(self) -> None:
        """Ask the zygote to warm math-verify up while the pool is idle (once; later asks are no-ops)."""
        if self.ready and not self.warm_asked:
            self.warm_asked = True
            try:
                self.ctl.sendall(b"w")
            except OSError:
                pass

    def kill(self) -> None:
        """End a zygote that stopped answering (SIGKILL also ends a stopped process)."""
        try:
            self.ctl.close()
        except OSError:
            pass
        self.proc.kill()
        self.proc.wait(timeout=5)

    def close(self) -> None:
        try:
            self.ctl.close()
        except OSError:
            pass
        if not self.ready:  # started early, never used: no worker to wait for
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


class _Worker:
    """One forked grading process and our end of its socket."""

    def __init__(self, zygote: _Zygote):
        from multiprocessing.connection import Connection

        self.pid, fd = zygote.spawn()
        self.conn = Connection(fd)
        self.ready = False
        self.started = time.monotonic()
        self.queue: deque[int] = deque()  # item indices sent, in the order the worker takes them
        self.deadline = math.inf  # for the item at the head of the queue

    def stop(self, kill: bool) -> None:
        """Close our end (an idle worker exits on EOF); ``kill``: SIGKILL it too (a stuck worker)."""
        import signal

        try:
            self.conn.close()
        except OSError:
            pass
        if kill:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


WORKER_START_TIMEOUT = 60.0
SPAWN_TIMEOUT = 30.0  # seconds for a warm zygote to fork a worker (it takes milliseconds)
QUEUE_DEPTH = 2  # items handed to a worker at once (one running, one waiting)


def _hung_up(conn) -> bool:
    """Whether the worker behind ``conn`` already exited (then its pid must not be signalled)."""
    try:
        if conn.poll(0):
            conn.recv_bytes()
    except (EOFError, OSError):
        return True
    return False


class GradingPool:
    """Worker processes that run math-verify, with a per-item deadline enforced by the parent."""

    def __init__(self, workers: int | None = None):
        self.size = max(1, workers or cpu_count())
        self._zygote: _Zygote | None = None
        self._workers: list[_Worker] = []
        self.timeouts = 0  # items killed at their deadline since the pool started
        self.restarts = 0

    def _new_worker(self) -> _Worker:
        """A worker forked by the zygote; a zygote that died or stopped answering since the last
        one is replaced once (a second failure is the caller's: the grading cannot go on)."""
        if self._zygote is None or not self._zygote.alive():
            if self._zygote is not None:
                self._zygote.close()
            self._zygote = _Zygote()
        try:
            return _Worker(self._zygote)
        except GradingPoolError:
            if not self._zygote.ready:  # it never started: a new one would fail the same way
                raise
            self._zygote.kill()
            self._zygote = _Zygote()
            return _Worker(self._zygote)

    def _ensure(self, wanted: int) -> None:
        while len(self._workers) < min(wanted, self.size):
            self._workers.append(self._new_worker())

    def _replace(self, w: _Worker, kill: bool = True) -> None:
        w.stop(kill=kill)
        self._workers[self._workers.index(w)] = self._new_worker()
        self.restarts += 1
        self._zygote.warm_up()  # a worker was killed: later replacements should start warm

    def run(self, items: Sequence[tuple[str, str]], timeout: float, on_done: Callable[[int, bool, str], None]) -> None:  # noqa: C901 - one scheduling loop: queue, deadline and replacement decisions share its state
        """Grade ``(pred, gold)`` items with math-verify; ``on_done(index, verdict, reason)``.

        Each worker holds up to ``QUEUE_DEPTH`` items so that it never waits for the parent to be
        scheduled; it works through them in order. An item's ``timeout`` seconds start when the
        parent sees the worker take it up (the previous result arrived, or it was sent to an idle
        worker). A timed-out or dead worker's queued items go back to the pending queue."""
        if not items:
            return
        inner = max(1, int(math.ceil(timeout)) - 1)  # math-verify's own (signal) limit, whole seconds
        self._ensure(len(items))
        pending = deque(range(len(items)))

        def requeue(w: _Worker) -> None:
            while len(w.queue) > 1:
                pending.appendleft(w.queue.pop())

        while True:
            for w in list(self._workers):
                while w.ready and len(w.queue) < QUEUE_DEPTH and pending:
                    idx = pending.popleft()
                    pred, gold = items[idx]
                    try:
                        w.conn.send_bytes(json.dumps([idx, pred, gold, inner]).encode())
                    except (OSError, ValueError):  # dead worker: its items go elsewhere
                        pending.appendleft(idx)
                        if w.queue:
                            requeue(w)
                            pending.appendleft(w.queue.popleft())
                        self._replace(w, kill=False)
                        break
                    if not w.queue:
                        w.deadline = time.monotonic() + timeout
                    w.queue.append(idx)
            busy = [w for w in self._workers if w.queue]
            if not busy and not pending:
                return
            waiting = [w for w in self._workers if w.queue or not w.ready]
            deadlines = [w.deadline for w in busy] or [w.started + WORKER_START_TIMEOUT for w in waiting]
            ready = mp_wait([w.conn for w in waiting], timeout=max(0.0, min(deadlines) - time.monotonic()))
            for w in [w for w in waiting if w.conn in ready]:
                while True:
                    try:
                        msg = json.loads(w.conn.recv_bytes())
                    except (EOFError, OSError, ValueError):
                        msg = None
                    if msg is None:  # the worker died (already gone: no kill)
                        requeue(w)
                        head = w.queue[0] if w.queue else None
                        self._replace(w, kill=False)
                        if head is not None:
                            on_done(head, False, "worker_died")
                        break
                    if msg == "ready":
                        w.ready = True
                    else:
                        idx, ok = msg
                        w.queue.popleft()
                        if w.queue:
                            w.deadline = time.monotonic() + timeout
                        on_done(idx, bool(ok), "math_verify_match" if ok else "math_verify_mismatch")
                    if not w.conn.poll(0):
                        break
            now = time.monotonic()
            for w in list(self._workers):
                if w.queue and now >= w.deadline:
                    requeue(w)
                    head = w.queue[0]
                    self.timeouts += 1
                    self._replace(w, kill=not _hung_up(w.conn))  # kill: the only reliable way to stop it
                    on_done(head, False, "timeout")
                elif not w.ready and now - w.started > WORKER_START_TIMEOUT:
                    raise GradingPoolError(f"a grading worker did not start within {WORKER_START_TIMEOUT:.0f} s")

    def close(self) -> None:
        for w in self._workers:
            w.stop(kill=bool(w.queue))
        self._workers = []
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


_POOL: GradingPool | None = None
_POOL_LOCK = threading.Lock()


def _pool(workers: int | None) -> GradingPool:
    global _POOL
    size = max(1, workers or cpu_count())
    if _POOL is None or _POOL.size != size:
        if _POOL is not None:
            _POOL.close()
        _POOL = GradingPool(size)
    return _POOL


def shutdown_pool() -> None:
    """Stop the shared worker processes (also done at interpreter exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()
            _POOL = None


atexit.register(shutdown_pool)


def start_pool(workers: int | None = None) -> None:
    """Start the zygote now: it imports and warms math-verify in the background while the
    caller extracts answers and runs the fast path (a one-shot ``entropyrl grade`` starts cold)."""
    with _POOL_LOCK:
        pool = _pool(workers)
        if pool._zygote is None:
            pool._zygote = _Zygote()


def run_pool(
    items: Sequence[tuple[str, str]], workers: int | None, timeout: float, on_done: Callable[[int, bool, str], None]
) -> None:
    """``GradingPool.run`` on the shared pool of ``workers`` processes (None = CPUs available)."""
    with _POOL_LOCK:
        _pool(workers).run(items, float(timeout), on_done)
