"""``trim_heap``: freed C-heap pages go back to the operating system, and the call never raises."""

from __future__ import annotations

import ctypes
import platform

import pytest

from entropyrl.core.heap import trim_heap


def _resident_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_freed_heap_memory_goes_back():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(100_000) for _ in range(400)]  # 40 MB in blocks below malloc's mmap threshold
    for block in blocks:
        ctypes.memset(block, 1, 100_000)  # touched: resident
    for block in blocks[:-1]:  # the last one stays, so the freed pages are not only the heap's top
        libc.free(block)
    before = _resident_kb()
    assert trim_heap() is True
    assert before - _resident_kb() > 20_000  # most of the 40 MB left the process
    libc.free(blocks[-1])


def test_it_answers_a_bool_whatever_the_c_library():
    assert trim_heap() in (True, False)
