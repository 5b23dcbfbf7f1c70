"""Ending a training run on a signal, cleanly.

SIGINT (Ctrl-C), SIGTERM (what SLURM, Kubernetes and ``timeout`` send), SIGUSR1 and SIGUSR2 all
mean "stop": the first one lets the current step finish, then the trainer saves a checkpoint at
that step boundary (the only place the model, optimizer and RNG agree), writes ``summary.json``,
ends the MLflow run as KILLED and says how to resume. A second signal stops at once (the step in
progress is lost; summary and MLflow status are still written). What must not be cut in half,
a checkpoint being written and those last words (``finishing(what)``), a second signal waits for,
saying so; a third exits immediately.

One stop often arrives more than once: ``timeout`` signals its command and then the command's
whole process group, ``scancel`` and ``kill -- -PGID`` reach every process of a group, a launcher
such as torchrun forwards what it receives to ranks that already got it. Whether two deliveries
are coalesced depends on the kernel's timing, so a repeat of a signal within ``REPEAT_WINDOW_S``
of the one before counts as the same request; only a later one escalates. Without this a single
``timeout`` could throw away every step since the last checkpoint.

A signal that some other layer already handles in this process (submitit's preemption handler in
a sweep job: it checkpoints and requeues the job itself) is left to it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Callable

from ..parallel import distributed

REPEAT_WINDOW_S = 1.0  # a repeat of a stop signal sooner than this is the same stop, delivered twice
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2") if hasattr(signal, n))


class RunInterrupted(KeyboardInterrupt):
    """Training stopped on a signal; ``exit_code`` follows the shell convention 128 + signal number."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message or f"stopped by {signal_name(signum)}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _is_ours_to_take(handler) -> bool:
    """Default, ignored or Python's Ctrl-C handler: take it. Another Python handler: leave it."""
    return handler in (signal.SIG_DFL, signal.SIG_IGN, None, signal.default_int_handler)


class StopSignals:
    """``with StopSignals(log) as stop: ... if stop.requested: ...`` (see the module doc).

    Installs its handlers only in the main thread (signals are delivered there) and restores the
    previous ones on exit."""

    def __init__(self, log: Callable[[str], None] = print):
        self.log = log
        self.requested: int | None = None  # the first stop signal received
        self.count = 0
        self._last_at: float | None = None  # time.monotonic() of the last signal counted
        self._previous: dict[int, object] = {}
        self._finishing: str | None = None  # what a second signal waits for (``finishing``), or None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in STOP_SIGNALS:
            previous = signal.getsignal(sig)
            if _is_ours_to_take(previous):
                self._previous[sig] = previous
                signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> bool:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        return False

    def _handle(self, signum: int, _frame) -> None:
        now = time.monotonic()
        if self._last_at is not None and now - self._last_at < REPEAT_WINDOW_S:
            return  # the same stop delivered twice (process group + direct, or forwarded): not an escalation
        self._last_at = now
        self.count += 1
        if self.count == 1:
            self.requested = signum
            self.log(
                f"received {signal_name(signum)}: stopping after the current step (checkpoint, summary, "
                f"MLflow run KILLED); send it again (a second or more later) to stop at once"
            )
            return
        if self.count == 2:
            if self._finishing is not None:
                self.log(
                    f"received {signal_name(signum)} again: finishing {self._finishing} first; a third signal exits without it"
                )
                return
            raise RunInterrupted(signum, f"stopped at once by a second signal ({signal_name(signum)})")
        os._exit(128 + signum)

    @contextlib.contextmanager
    def finishing(self, what: str = "the summary and MLflow status (a few seconds)"):
        """A block a second signal waits for (``what`` it finishes, as the line it logs says): a
        checkpoint being written, the run's last words. Nested blocks keep the outer one's name."""
        outer = self._finishing
        self._finishing = what if outer is None else outer
        try:
            yield
        finally:
            self._finishing = outer

    def agreed(self, dist=None) -> bool:
        """Whether to stop now; with several processes, every rank stops at the same step."""
        local = self.requested is not None
        if dist is None or getattr(dist, "world_size", 1) <= 1:
            return local

        return float(distributed.max_across(1.0 if local else 0.0, dist)) > 0


@contextlib.contextmanager
def stop_during_setup():
    """Before the first step there is nothing to save at a step boundary: a stop signal (taken as
    ``StopSignals`` takes them) ends the set-up at once as ``RunInterrupted`` with ``during_setup``
    set, so the caller's cleanup runs and it can say so (SIGTERM's default ended the process with no
    word, its run folder left holding only its lock; an inherited ignored SIGINT was ignored). In the
    main thread only; the previous handlers come back on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _stop(signum, _frame):
        stopped = RunInterrupted(signum)
        stopped.during_setup = True
        raise stopped

    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    taken = [sig for sig, handler in previous.items() if _is_ours_to_take(handler)]
    for sig in taken:
        signal.signal(sig, _stop)
    try:
        yield
    finally:
        for sig in taken:
            signal.signal(sig, previous[sig] if previous[sig] is not None else signal.SIG_DFL)


def setup_stopped_message(stopped: RunInterrupted, output_dir) -> str:
    """The line of a run stopped during its set-up: nothing trained, and what became of its folder."""
    where = f"{output_dir} removed" if not os.path.exists(output_dir) else f"{output_dir} kept as it was"
    return f"{stopped} during set-up, before the first step: nothing trained ({where})"
