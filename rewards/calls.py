"""Running one reward function on one batch: a time limit, optional worker processes, and the
fallback for what fails.

Outcomes of a call: the values; or a failure reason (``exception``, ``timeout``, ``http_error``)
that gives the whole batch the fallback. A value that is not finite gets the fallback alone
(reason ``non_finite``). A function that returns the wrong number of values, or something that is
not a number, is a programming error: ``UserError`` naming the function and what it returned
(``check_values``: a list of real numbers of the batch's length, never read through a dict's keys
or a string's characters).

``timeout_s`` is a wall-clock deadline for the whole batch. With ``workers: 0`` and a deadline, each
batch runs in a child forked from the trainer's process (``call_in_child``: the function and the
batch's objects are there as they are, nothing is imported again), killed at the deadline, so a
function that overruns leaves nothing running behind it (a thread could not be stopped). State a
function keeps in module globals therefore does not carry over between batches; ``workers >= 1``
keeps warm processes that are killed at the deadline and started afresh for the next batch. With
``timeout_s: null`` the function runs in the trainer's own thread, with no limit.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import multiprocessing as mp
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

from ..core.errors import UserError
from ..core.helper_process import exit_when_parent_gone, ignore_group_stop_signals
from .refs import call_in_worker, warm_worker


class CallFailed(Exception):
    """A batch that gets the fallback: ``reason`` is counted, ``detail`` logged."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@dataclass
class Outcome:
    values: list[float]
    fallbacks: dict[str, int] = field(default_factory=dict)  # reason -> responses given the fallback
    detail: str = ""


def _shown(value) -> str:
    """A short description of what a reward function returned, for an error line."""
    text = repr(value).replace("\n", " ")
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _real(v):
    """``v`` as a float when it is a real number (bool, int, float, numpy scalar), else None."""
    if isinstance(v, (bool, int, float)):
        return float(v)
    if type(v).__module__ == "numpy" and getattr(v, "ndim", None) == 0:
        kind = getattr(getattr(v, "dtype", None), "kind", "")
        return float(v) if kind and kind in "biuf" else None
    return None


def check_values(label: str, values, expected: int) -> list[float]:
    """``values`` as ``expected`` floats, else ``UserError`` naming ``label`` and what it returned.

    The contract: a list or tuple (or a one-dimensional numpy array / torch tensor) of real numbers,
    one per response, in the batch's order. Booleans count as 1.0 / 0.0 (a verifier's verdict).
    A dict (even keyed by position), a string, a set, a generator, a nested list, a string or None
    among the values is refused, not read through its keys or characters. Non-finite numbers pass
    here and get the fallback (``finite_or_fallback``)."""
    want = f"return a list of {expected} real numbers, one per response"
    out = values
    if type(values).__module__.split(".")[0] in ("numpy", "torch") and hasattr(values, "tolist"):
        if getattr(values, "ndim", None) != 1:
            raise UserError(f"{label} returned {type(values).__name__} of shape {tuple(values.shape)}: {want}")
        out = values.tolist()
    elif not isinstance(values, (list, tuple)):
        raise UserError(f"{label} returned {_shown(values)}, not a list: {want}")
    if len(out) != expected:
        raise UserError(f"{label} returned {len(out)} values for {expected} responses: {want}")
    floats = []
    for i, v in enumerate(out):
        f = _real(v)
        if f is None:
            raise UserError(f"{label} returned a {type(values).__name__} whose item {i} is {_shown(v)}: {want}")
        floats.append(f)
    return floats


def finite_or_fallback(values: list[float], fallback: float) -> tuple[list[float], int]:
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    for i in bad:
        values[i] = fallback
    return values, len(bad)


def call_in_thread(fn: Callable, kwargs: dict, timeout: float | None):
    """``fn(**kwargs)`` in this thread (``timeout`` None, or no ``fork`` on this platform: then in a
    daemon thread abandoned past the limit)."""
    if timeout is None:
        try:
            return fn(**kwargs)
        except Exception as exc:  # noqa: BLE001 - the user's code: any failure is a fallback
            raise CallFailed("exception", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    box: dict = {}

    def target():
        try:
            box["values"] = fn(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - the user's code: any failure is a fallback
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True, name="entropyrl-reward")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise CallFailed("timeout", f"no answer within {timeout:g} s")
    if "error" in box:
        exc = box["error"]
        raise CallFailed("exception", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return box["values"]


def _child(fn: Callable, kwargs: dict, conn) -> None:
    """In the forked child: one call, its values (or its error) sent back, then exit at once."""
    try:
        try:
            conn.send(("values", fn(**kwargs)))
        except BaseException as exc:  # noqa: BLE001 - the user's code (or values that do not pickle)
            conn.send(("error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
        conn.close()
    finally:
        os._exit(0)  # no atexit handlers, no finalizers of the parent's objects


def call_in_child(fn: Callable, kwargs: dict, timeout: float | None):
    """``fn(**kwargs)`` in a child forked from this process, killed at ``timeout`` seconds (a
    wall-clock deadline for the batch): an overrunning function leaves nothing running."""
    if timeout is None or "fork" not in mp.get_all_start_methods():
        return call_in_thread(fn, kwargs, timeout)
    deadline = time.monotonic() + float(timeout)
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(fn, kwargs, send), name="entropyrl-reward")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child only runs fn
        proc.start()
    send.close()
    try:
        if not receive.poll(max(0.0, deadline - time.monotonic())):
            raise CallFailed("timeout", f"no answer within {timeout:g} s (its process killed)")
        try:
            kind, value = receive.recv()
        except (EOFError, OSError):
            proc.join(1.0)
            raise CallFailed("exception", f"the reward's process ended without an answer (exit code {proc.exitcode})") from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        receive.close()
    if kind == "error":
        raise CallFailed("exception", value)
    return value


def _helper_process_setup() -> None:
    """Initializer of a reward worker process. A stop signal sent to the whole process group (Ctrl-C,
    ``timeout``, ``scancel``) is the trainer's to handle at its step boundary: a worker that died of
    it would give the step in progress the fallback reward. Ignoring it, the worker instead ends
    when its parent is gone (checked every second), so it never outlives the trainer."""
    ignore_group_stop_signals()
    exit_when_parent_gone(poll_s=1.0)


class WorkerPool:
    """``workers`` spawned processes for one reward function; killed and replaced after a timeout."""

    def __init__(self, ref: str, workers: int):
        self.ref, self.workers = ref, int(workers)
        self.pool: cf.ProcessPoolExecutor | None = None

    def _start(self) -> cf.ProcessPoolExecutor:
        """The pool, started and warm: each process has imported the function (outside the time
        limit, which is for the function, not for a process starting)."""
        if self.pool is None:
            self.pool = cf.ProcessPoolExecutor(
                self.workers, mp_context=mp.get_context("spawn"), initializer=_helper_process_setup
            )
            try:
                for fut in [self.pool.submit(warm_worker, self.ref) for _ in range(self.workers)]:
                    fut.result(timeout=300)
            except Exception as exc:  # noqa: BLE001 - the reference resolved here but not there
                self.kill()
                raise UserError(
                    f"reward function {self.ref}: cannot be loaded in a reward.workers process "
                    f"({type(exc).__name__}: {exc}); make it importable there, or use reward.workers=0"
                ) from None
        return self.pool

    def call(self, kwargs: dict, n: int, timeout: float | None, label: str) -> list:
        """The batch split into ``workers`` contiguous parts, one per process."""
        size = -(-n // self.workers)
        parts = [(s, min(s + size, n)) for s in range(0, n, size)]
        pool = self._start()
        futures = [pool.submit(call_in_worker, self.ref, {k: v[a:b] for k, v in kwargs.items()}) for a, b in parts]
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list = []
        try:
            for (a, b), fut in zip(parts, futures):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                out.extend(check_values(label, fut.result(timeout=left), b - a))
        except cf.TimeoutError:
            self.kill()
            raise CallFailed("timeout", f"no answer within {timeout:g} s (worker processes killed)") from None
        except UserError:
            raise
        except cf.process.BrokenProcessPool as exc:
            self.kill()
            raise CallFailed("exception", f"a worker process died ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - raised by the user's function in the worker
            raise CallFailed("exception", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
        return out

    def kill(self) -> None:
        pool, self.pool = self.pool, None
        if pool is None:
            return
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            if proc.is_alive():
                proc.kill()  # only the processes this pool started
        pool.shutdown(wait=False, cancel_futures=True)


def run_call(label: str, call: Callable[[], list], n: int, fallback: float) -> Outcome:
    """Outcome of ``call()`` (which raises ``CallFailed`` for a fallback batch)."""
    try:
        values = check_values(label, call(), n)
    except CallFailed as failed:
        return Outcome([float(fallback)] * n, {failed.reason: n}, failed.detail)
    values, bad = finite_or_fallback(values, float(fallback))
    return Outcome(values, {"non_finite": bad} if bad else {}, f"{bad} non-finite values" if bad else "")


__all__ = ["CallFailed", "Outcome", "WorkerPool", "check_values", "run_call", "call_in_thread", "call_in_child"]
