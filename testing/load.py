"""Open-loop load: requests sent on a fixed schedule whatever the server answers (as independent
clients arrive), each outcome recorded; and resident memory sampled from /proc meanwhile.

Closed-loop clients (send, wait, send) slow down with the server and can never overload it; an
overload test needs arrivals that do not.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from testing.bodies import v2_request
from testing.predictor import metric

# About four million characters: a v2 body just under MAX_REQUEST_BYTES' default (4 MiB).
HUGE_TEXT = "a " * 1_900_000

MiB = 1024 * 1024


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


@dataclass
class OverloadReport:
    """What ``overload`` saw: capacity measured first, then the outcomes of ``factor`` times it."""

    short_s: float  # one short request alone, seconds (best of three)
    long_s: float  # one maximum-size request alone, seconds
    capacity_rps: float  # requests per second of the mix, one at a time
    rate_rps: float
    statuses: Counter[int | str] = field(default_factory=Counter)
    refused_without_retry_after: int = 0
    admitted_p50_s: float = math.nan
    admitted_p99_s: float = math.nan
    drift_bytes: int = 0  # resident memory growth after the settle time
    synthesized: int = 0  # segments the engine ran while the load lasted (tts_batch_size_sum)
    answered: Counter[str] = field(default_factory=Counter)  # 200s by kind ("short", "max")
    rss_samples: list[tuple[float, int]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "short_s": round(self.short_s, 3),
            "long_s": round(self.long_s, 3),
            "capacity_rps": round(self.capacity_rps, 3),
            "rate_rps": round(self.rate_rps, 3),
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "refused_without_retry_after": self.refused_without_retry_after,
            "admitted_p50_s": round(self.admitted_p50_s, 3),
            "admitted_p99_s": round(self.admitted_p99_s, 3),
            "drift_mib": round(self.drift_bytes / MiB, 1),
            "synthesized": self.synthesized,
        }


def overload(
    url: str,
    pid: int,
    short: str,
    long: str,
    *,
    duration_s: float,
    settle_s: float,
    factor: float = 4.0,
    long_every: int = 8,
) -> OverloadReport:
    """``factor`` times the predictor's capacity at ``url`` for ``duration_s``: one request in
    ``long_every`` carries ``long`` (a maximum-size text), the others ``short``. Capacity is measured
    first on the same predictor, one request at a time."""
    infer = url + "/v2/models/tts/infer"

    def alone(text: str) -> float:
        start = time.monotonic()
        response = httpx.post(infer, json=v2_request(text), timeout=600)
        response.raise_for_status()
        return time.monotonic() - start

    alone(long)  # the first maximum-size request pays for its allocations once
    short_s = min(alone(short) for _ in range(3))
    long_s = alone(long)
    capacity = long_every / ((long_every - 1) * short_s + long_s)
    report = OverloadReport(short_s, long_s, capacity, factor * capacity)

    def body(i: int) -> tuple[str, dict[str, Any]]:
        return ("max", v2_request(long)) if i % long_every == long_every - 1 else ("short", v2_request(short))

    sampler = ResidentSampler(pid, interval_s=0.5)
    synthesized_before = metric(url, "tts_batch_size_sum")
    outcomes = open_loop(infer, body, report.rate_rps, duration_s)
    report.synthesized = int(metric(url, "tts_batch_size_sum") - synthesized_before)
    sampler.stop()
    report.statuses = Counter(o.status for o in outcomes)
    report.answered = Counter(o.kind for o in outcomes if o.status == 200)
    report.refused_without_retry_after = sum(
        1 for o in outcomes if o.status == 503 and not (o.retry_after or "").isdigit()
    )
    admitted = [o.seconds for o in outcomes if o.status == 200]
    report.admitted_p50_s = percentile(admitted, 0.5)
    report.admitted_p99_s = percentile(admitted, 0.99)
    report.drift_bytes = sampler.drift_after(settle_s)
    report.rss_samples = sampler.samples
    return report


@contextlib.contextmanager
def largest_bodies(
    url: str, grpc_target: str, max_text_chars: int, max_batch_items: int = 64
) -> Iterator[list[str]]:
    """While the block runs, three senders keep the predictor at ``url`` reading the largest bodies its
    limits admit, each sender one request after another: a v2 REST text of about four million
    characters (under MAX_REQUEST_BYTES, over MAX_TEXT_CHARS: read, parsed, then refused),
    ``max_batch_items`` texts of ``max_text_chars`` each (normalized, then refused for their audio or
    engine calls, or synthesized where the limits allow), and the four-million-character text over gRPC
    ModelInfer. Yields the list of unexpected errors (anything but an answer or a gRPC refusal).

    The REST bodies are encoded once, so the senders spend their time on the wire, not on the GIL of
    the process that probes beside them."""
    import numpy as np
    import tritonclient.grpc as triton_grpc
    from tritonclient.utils import InferenceServerException

    infer = url + "/v2/models/tts/infer"
    bodies = [
        json.dumps(v2_request(HUGE_TEXT)).encode(),
        json.dumps(v2_request(*(["word " * (max_text_chars // 5)] * max_batch_items))).encode(),
    ]
    grpc_client = triton_grpc.InferenceServerClient(grpc_target)
    grpc_input = triton_grpc.InferInput("text", [1], "BYTES")
    grpc_input.set_data_from_numpy(np.array([HUGE_TEXT.encode()], dtype=object))
    stop = threading.Event()
    errors: list[str] = []

    def rest(body: bytes) -> Callable[[], object]:
        headers = {"content-type": "application/json"}
        return lambda: httpx.post(infer, content=body, headers=headers, timeout=120)

    def grpc() -> object:
        try:
            return grpc_client.infer("tts", [grpc_input])
        except InferenceServerException:
            return None  # the refusal itself

    def keep_sending(send: Callable[[], object]) -> None:
        while not stop.is_set():
            try:
                send()
            except Exception as exc:
                errors.append(repr(exc))

    threads = [threading.Thread(target=keep_sending, args=(s,)) for s in (*map(rest, bodies), grpc)]
    for t in threads:
        t.start()
    try:
        yield errors
    finally:
        stop.set()
        for t in threads:
            t.join(120)
        grpc_client.close()
