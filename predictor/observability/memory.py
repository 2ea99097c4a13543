"""This process's memory as the kernel counts it (what a pod's memory limit is enforced on), and
giving freed heap back to it.

glibc's malloc keeps freed memory in its arenas (one per thread that allocated, up to 8 per core) for
reuse, so a process that once held a long request's audio and activations stays that large while
idle: resident memory only grows, and a pod sized on its idle figure is OOM-killed on its peak.
``release`` asks glibc to return what is free (``malloc_trim(0)``: the top of every arena and the
free pages inside them). Pages given back are faulted in again by the next request that uses them, so
``release_grown`` trims only once resident memory has grown enough since the last trim to be worth it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from functools import cache

log = logging.getLogger("predictor.memory")

_PAGE = os.sysconf("SC_PAGE_SIZE")


@cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None  # not glibc (musl, macOS): nothing to trim this way
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release() -> bool:
    """Return free heap memory to the kernel; whether anything was released (False: nothing, or not glibc)."""
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))


# Resident bytes right after the last release_grown trim (the process's, whichever thread trimmed).
_after_last_trim: int | None = None


def release_grown(min_growth: int) -> bool:
    """``release`` if resident memory has grown by more than ``min_growth`` bytes since the last time
    this trimmed (always the first time); whether it trimmed."""
    global _after_last_trim
    if _after_last_trim is not None and resident_bytes() - _after_last_trim <= min_growth:
        return False
    release()
    _after_last_trim = resident_bytes()
    return True


def resident_bytes() -> int:
    """Resident set size now, bytes (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def peak_resident_bytes() -> int:
    """The largest resident set size this process has had, bytes (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0
