"""What the trainer and its rollout worker share across the process boundary: the weights in shared
memory with their version (``WeightChannel``), the trainer's stop request (``StopFlag``), and the
items of the queue between them (``StaleBatch``, ``WorkerFailed``).

Nothing here needs the other side to finish what it started: the stop flag and the version counters
are shared numbers without a lock, and the weights' lock is taken in short polls that look at the
other process (``_acquire``), with a bound. See ``trainers/async_rollout.py`` for the design.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

__all__ = ["StaleBatch", "StopFlag", "WeightChannel", "WorkerFailed"]

_POLL_S = 0.5  # how often a blocked side looks at the stop flag and at the other process
# the longest the worker waits for the weights' lock while the trainer is alive (the holder copies
# the weights, seconds even for a large model): past it the run ends instead of hanging; the
# trainer's own wait is bounded by stall_limit_s
_LOCK_BOUND_S = 600.0


class StopFlag:
    """The trainer's request that the worker stop: one shared byte, set once, read without a lock.
    Not a ``multiprocessing.Event``, whose ``set`` waits for every process sleeping in ``wait`` to
    wake: a worker killed while it waits at the staleness gate never does, and the trainer's
    shutdown would block for ever."""

    def __init__(self, ctx):
        self._flag = ctx.Value("b", 0, lock=False)

    def set(self) -> None:
        self._flag.value = 1

    def is_set(self) -> bool:
        return bool(self._flag.value)

    def wait(self, timeout: float) -> bool:
        """Sleep ``timeout`` seconds unless the flag is already set; returns whether it is set."""
        if not self.is_set():
            time.sleep(timeout)
        return self.is_set()


def _acquire(lock, alive, bound_s: float = _LOCK_BOUND_S) -> bool:
    """Take ``lock`` (shared with one other process), looking every ``_POLL_S`` at whether that
    process is still ``alive()``: False, not taken, when it is gone (it may have died holding the
    lock, which then is never released) or after ``bound_s`` seconds."""
    deadline = time.monotonic() + bound_s
    while not lock.acquire(timeout=_POLL_S):
        if not alive() or time.monotonic() > deadline:
            return False
    return True


def _always() -> bool:
    return True


@dataclass
class StaleBatch:
    """What the worker sends for one step: ``collected`` as ``collect_rollouts`` returns it
    (``(StepBatch or None, metrics)``), ``version`` the training steps applied to the weights that
    generated it, ``behaviour_entropy`` the mean token entropy of its responses under those
    weights, ``idle_s`` / ``cycle_s`` the worker's time blocked (waiting for weights, or on a full
    queue with the batch before) and its wall time since the batch before was ready."""

    step: int
    version: int
    collected: tuple
    behaviour_entropy: float
    idle_s: float
    cycle_s: float


@dataclass
class WorkerFailed:
    """What a worker that raised sends before it exits: ``step`` it was producing, the error text."""

    step: int
    error: str


class WeightChannel:
    """The trainer's weights in shared memory, with the version they are at (training steps), and
    the version the worker last loaded (-1: none yet). ``state``: whole tensors by name
    (``distributed.full_weights`` of the policy)."""

    def __init__(self, state: dict[str, torch.Tensor], version: int, ctx):
        self.tensors = {k: v.detach().to("cpu", copy=True).share_memory_() for k, v in state.items()}
        # one writer each (the trainer's version, the worker's loaded): no lock, which a process
        # killed while holding it would keep for ever
        self.version = ctx.Value("q", int(version), lock=False)
        self.loaded = ctx.Value("q", -1, lock=False)
        self.lock = ctx.Lock()  # the tensors: never read while half copied

    def publish(self, state: dict[str, torch.Tensor], version: int, alive=_always, bound_s: float = _LOCK_BOUND_S) -> bool:
        """Copy ``state`` in and set the version (the trainer, after a training step). False,
        nothing published, when the lock could not be taken: the worker is gone (``alive()``
        false) or held it past ``bound_s`` seconds."""
        if not _acquire(self.lock, alive, bound_s):
            return False
        try:
            for key, shared in self.tensors.items():
                shared.copy_(state[key].detach())
            self.version.value = int(version)
        finally:
            self.lock.release()
        return True

    def load_into(self, model: torch.nn.Module, alive=_always) -> int | None:
        """Copy the published weights into ``model`` (the worker); returns their version, None when
        the lock could not be taken (the trainer, ``alive()``, is gone or held it past the bound)."""
        if not _acquire(self.lock, alive):
            return None
        try:
            model.load_state_dict(self.tensors)
            self.loaded.value = int(self.version.value)
            return int(self.version.value)
        finally:
            self.lock.release()
