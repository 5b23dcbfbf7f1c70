"""``trim_heap()``: the C heap's free pages handed back to the operating system.

A training step frees its activations, gradients and temporaries, but the C allocator (glibc's
malloc, which torch's CPU tensors come from) keeps the freed pages in the process for the next
step: resident memory stays at the busiest step's level. At a run's end that memory is no longer
wanted, while the figures about to be drawn (matplotlib and its renderer) need new memory; handing
the free pages back first lets the end of a run reuse them instead of raising the run's peak.
"""

from __future__ import annotations

import ctypes


def trim_heap() -> bool:
    """glibc's ``malloc_trim(0)``: True when it handed memory back; False when nothing was free or
    the C library has no such call (macOS, musl). Never raises; the values in memory are untouched."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
