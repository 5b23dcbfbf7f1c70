"""Whether an exception is an allocation that failed for want of memory, in any layer (training,
evaluation), without importing torch.

torch reports exhaustion three ways: ``torch.OutOfMemoryError`` (CUDA and other accelerators), a
``RuntimeError`` from the CPU allocator (``DefaultCPUAllocator: can't allocate memory``), and
Python's ``MemoryError``. Each caller turns it into its own one line naming the knobs of its
command (``trainers/run/oom.py`` for a training step, ``evals/runner.py`` for ``entropyrl eval``).
"""

from __future__ import annotations

import sys

__all__ = ["OOM_WORDS", "is_out_of_memory", "memory_kind"]

#: Words of the CPU allocator's and the accelerators' out-of-memory messages (lower case).
OOM_WORDS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def _is_accelerator_oom(exc: BaseException) -> bool:
    """``exc`` is torch's accelerator out-of-memory error. torch is looked up, not imported: a
    process that never loaded it cannot have raised it (and ``core`` stays free of torch)."""
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return oom is not None and isinstance(exc, oom)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed for want of memory."""
    if isinstance(exc, MemoryError) or _is_accelerator_oom(exc):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc).lower() for w in OOM_WORDS)


def memory_kind(exc: BaseException) -> str:
    """What ran out, in words: the accelerator's memory (``torch.OutOfMemoryError``, or a runtime
    error that names CUDA), else the host's (the CPU allocator, ``MemoryError``)."""
    if _is_accelerator_oom(exc) or (isinstance(exc, RuntimeError) and "cuda" in str(exc).lower()):
        return "GPU memory"
    return "host memory (RAM)"
