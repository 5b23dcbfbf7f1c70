"""The trainer's bounded waits on its rollout worker. A dead worker is noticed within a second; a
live one that sends nothing (stopped by SIGSTOP, deadlocked, spinning) is given up on after
``stall_limit_s``. The queue is read in a helper thread (``_QueueReader``), since taking a batch can
itself block on the worker, which hands its tensors over through a connection of its own while the
trainer unpickles them. ``exit_cause`` says what a dead worker's exit code means."""

from __future__ import annotations

import queue as queue_errors
import signal
import threading

__all__ = ["FIRST_BATCH_WAIT_S", "STALL_FACTOR", "STALL_FLOOR_S", "exit_cause", "stall_limit_s"]

# a live worker that sends nothing: the trainer's bound on each wait for it (stall_limit_s)
FIRST_BATCH_WAIT_S = 1800.0  # before its first batch: the worker builds its model and warms its engine up
STALL_FACTOR = 10.0  # after it: this many times the slowest batch so far ...
STALL_FLOOR_S = 300.0  # ... and never less (a longer response than any before, a slow shared machine)
_READ_GRACE_S = 0.5  # past a read's own timeout: the unpickling of a batch that arrived


def stall_limit_s(explicit: float | None, slowest_batch_s: float | None) -> tuple[float, str]:
    """``(seconds, how they were set)``: how long the trainer waits on a live rollout worker that
    sends nothing before it ends the run. ``explicit``: ``trainer.worker_stall_s`` (None: derived);
    ``slowest_batch_s``: the longest the worker has generated one batch (None: no batch yet, where
    building the model and warming up the engine come first, so the wait is at least
    ``FIRST_BATCH_WAIT_S``). Derived from what the run measured so a slow model or long responses
    never trip it, while a stall ends in minutes rather than never."""
    if slowest_batch_s is None:
        seconds = max(FIRST_BATCH_WAIT_S, float(explicit or 0.0))
        return seconds, f"the allowance for building the model and its first batch, {seconds:.0f} s"
    if explicit is not None:
        return float(explicit), f"trainer.worker_stall_s={float(explicit):g}"
    seconds = max(STALL_FLOOR_S, STALL_FACTOR * float(slowest_batch_s))
    return (
        seconds,
        f"{STALL_FACTOR:g} x the slowest batch so far ({float(slowest_batch_s):.1f} s), at least {STALL_FLOOR_S:.0f} s",
    )


class _QueueReader:
    """Reads a ``multiprocessing`` queue in a helper thread, so that the trainer's wait for an item
    is bounded even where the read itself blocks: a batch's tensors come through the worker's own
    connection while they are unpickled, which never answers when the worker is stopped, and a
    message cut short by a stopped writer never ends. A read still under way when a ``get`` gives
    up is kept and joined by the next ``get`` (its item is never lost); once the worker is killed
    the blocked read fails and its thread ends."""

    def __init__(self, source):
        self.source = source
        self.thread: threading.Thread | None = None
        self.box: dict = {}

    def get(self, timeout: float):
        """The next item; ``queue.Empty`` when none came within about ``timeout`` seconds (or a read
        is still under way), else the read's own error (``OSError``, ``EOFError``)."""
        if self.thread is None:
            self.box = {}
            self.thread = threading.Thread(target=self._read, args=(self.box, timeout), daemon=True)
            self.thread.start()
        self.thread.join(timeout + _READ_GRACE_S)
        if self.thread.is_alive():
            raise queue_errors.Empty
        self.thread, box = None, self.box
        if "error" in box:
            raise box["error"]
        return box["item"]

    def _read(self, box: dict, timeout: float) -> None:
        try:
            box["item"] = self.source.get(timeout=timeout)
        except BaseException as exc:  # noqa: BLE001  (handed to the caller of get)
            box["error"] = exc


def exit_cause(exitcode: int | None) -> str:
    """What a worker's exit code says: the signal that killed it (negative codes), else a guess."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = "killed, or out of memory?" if -exitcode == signal.SIGKILL else "killed"
        return f"{name}: {why}"
    return "killed, or out of memory?"
