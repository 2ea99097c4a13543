"""Request CPU work off the event loop: decoding, normalizing and encoding a large request run on one
worker thread, so the loop keeps answering probes and other requests meanwhile.

What is small runs inline: a hop to the worker and back costs more than the work. Measured on 2 CPUs
right after an engine call: a 26-character answer's WAV encode, 0.06-0.2 ms of work, took 0.64 ms of
the request sent there and back, 0.39 ms inline. One worker, not a pool: Python code on several
threads would take turns at the GIL with the event loop, and the loop would wait behind all of them;
behind one, it waits at most a switch interval (5 ms). Large requests queue behind each other there,
which bounds them, not small ones.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# About 4 ms of work, in microseconds: below it, work is done where it stands. A request's bytes or
# characters count a microsecond each (text.normalize runs ~1 us per character in Python, decoding
# about as much), audio to encode what audio.codecs.encode_us says (20 s of WAV, half a second of MP3).
INLINE_WORK_US = 4096

_executor: ThreadPoolExecutor | None = None


def _worker() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="request-cpu")
    return _executor


async def off_loop(size: int, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``: inline when ``size`` (about its microseconds: bytes or characters of the input,
    or ``codecs.encode_us`` of audio) is small, else on the request worker thread, in this task's
    context (its admission and shadow capture go along)."""
    if size <= INLINE_WORK_US:
        return fn(*args)
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_worker(), call)
