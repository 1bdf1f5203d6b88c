"""Giving freed memory back to the OS: glibc keeps what a process freed in its heap for later ``malloc`` calls."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None under another C library (macOS, musl)."""
    library = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(library), "malloc_trim", None) if library else None


def release_free_memory() -> bool:
    """Return the free pages of every glibc arena to the OS (``malloc_trim(0)``): memory that big temporary arrays
    left in the heap (glibc serves allocations of up to 32 MiB from it once one that size was freed) stops counting
    in the process's RSS. Milliseconds; False where there is no glibc."""
    if (trim := _malloc_trim()) is None:
        return False
    trim(0)
    return True
