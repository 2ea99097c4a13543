"""Open-loop load: requests sent on a fixed schedule whatever the server answers (as independent
clients arrive), each outcome recorded; and resident memory sampled from /proc meanwhile.

Closed-loop clients (send, wait, send) slow down with the server and can never overload it; an
overload test needs arrivals that do not.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import psutil


@dataclass(frozen=True)
class Outcome:
    sent_at: float  # seconds since the load started
    kind: str  # what the body was ("short", "max", ...), from the caller
    status: int | str  # HTTP status, or the transport error's class name
    seconds: float
    retry_after: str | None


def open_loop(
    url: str,
    body: Callable[[int], tuple[str, dict[str, Any]]],
    rate: float,
    duration_s: float,
    timeout_s: float = 120.0,
) -> list[Outcome]:
    """POST ``body(i)`` (a kind and a JSON body) to ``url`` at ``rate`` per second for ``duration_s``."""
    count = math.ceil(rate * duration_s)
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    with httpx.Client(timeout=timeout_s, limits=limits) as client, ThreadPoolExecutor(256) as pool:
        start = time.monotonic()

        def send(i: int) -> None:
            kind, payload = body(i)
            sent = time.monotonic()
            try:
                response = client.post(url, json=payload)
                status: int | str = response.status_code
                retry_after = response.headers.get("retry-after")
            except httpx.TransportError as exc:
                status, retry_after = type(exc).__name__, None
            with lock:
                outcomes.append(Outcome(sent - start, kind, status, time.monotonic() - sent, retry_after))

        for i in range(count):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(send, i)
    return sorted(outcomes, key=lambda o: o.sent_at)


class ResidentSampler:
    """Samples a process's resident memory (bytes) every ``interval_s`` on a thread until stopped."""

    def __init__(self, pid: int, interval_s: float = 1.0):
        self._process = psutil.Process(pid)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.samples: list[tuple[float, int]] = []  # (seconds since start, bytes)
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rss = self._process.memory_info().rss
            except psutil.Error:
                return
            self.samples.append((time.monotonic() - self._start, rss))
            self._stop.wait(self._interval_s)

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def drift_after(self, settle_s: float) -> int:
        """Largest resident size after ``settle_s`` minus the size at ``settle_s``, bytes."""
        later = [rss for t, rss in self.samples if t >= settle_s]
        return max(later) - later[0] if later else 0


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) by nearest rank; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
