"""Shadow records: one compact line per synthesis request, so a canary can be judged against stable.

A canary that receives mirrored traffic (Istio `mirror`, nginx `mirror`) has its responses thrown
away; the only way to compare it with stable is for both revisions to write down what they did,
keyed by a request id both saw. Every HTTP response (and gRPC call) therefore carries
`x-request-id` (the caller's, or a fresh uuid4) and `x-tts-revision`, and, when SHADOW_SINK is set,
each synthesis request leaves a record:

    {"v": 1, "id": "…", "revision": "…", "route": "/v2/models/{model_name}/infer", "status": 200,
     "ts": 1764500000.123, "latency_s": 0.41, "audio_s": 2.3, "sample_rate": 22050, "items": 1,
     "text_sha256": "…", "mcep": [[c0 … c12] × 32]}

The text itself never leaves the pod (privacy): its sha256 is enough to check both revisions were
asked the same thing. `mcep` is the audio's fingerprint: a 13-coefficient mel cepstrum pooled to 32
time slices (see `fingerprint`), from which `compare` computes a mel-cepstral distortion.

The request path only captures references to the audio and puts one item on a bounded queue
(`put_nowait`); the fingerprint, JSON and the sink's I/O run on one background thread. A full queue
drops the record (counted in tts_shadow_records_total{outcome="dropped"}) rather than slow a request.
Records leave in batches (SHADOW_BATCH_RECORDS or SHADOW_FLUSH_S, whichever comes first), each batch
one object under a unique key (a PUT is atomic: a reader sees a whole batch or none); `close()`
writes the tail, so SIGTERM loses nothing.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import queue
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

from predictor import metrics

log = logging.getLogger("predictor.shadow")

REQUEST_ID_HEADER = "x-request-id"
REVISION_HEADER = "x-tts-revision"
RECORD_VERSION = 1

# --- the audio fingerprint ---------------------------------------------------------------------
# Analysis at 22.05 kHz: 46 ms windows every 11.6 ms, the usual speech front end.
N_FFT = 1024
HOP = 256
N_MELS = 40
N_CEPS = 13  # c0 (level) + 12 shape coefficients: what MCD is conventionally computed over
FRAMES = 32  # time slices after pooling: ~2.5 KB of JSON per record whatever the audio's length
# Audio beyond this is left out of the fingerprint, so a 50,000-character chapter on the speech route
# does not hold an hour of audio in memory until its record is written.
FINGERPRINT_MAX_SECONDS = 60.0
# 10/ln(10) * sqrt(2): turns a Euclidean distance between natural-log cepstra into decibels.
_MCD_DB = 10.0 / math.log(10.0) * math.sqrt(2.0)


@functools.lru_cache(maxsize=4)
def _mel_filters(sample_rate: int) -> np.ndarray:
    """Triangular HTK-mel filters, [N_MELS, N_FFT//2 + 1], each summing to 1 (band means, not sums)."""

    def mel(f: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    bins = np.fft.rfftfreq(N_FFT, 1.0 / sample_rate)  # [F]
    edges = hz(np.linspace(mel(np.array(0.0)), mel(np.array(sample_rate / 2.0)), N_MELS + 2))  # [N_MELS+2]
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]  # each [N_MELS, 1]
    tri = np.maximum(0.0, np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)))  # [N_MELS, F]
    # The lowest bands are narrower than one FFT bin; give them their nearest bin rather than nothing.
    empty = tri.sum(axis=1) == 0
    tri[empty, np.abs(bins[None, :] - mid[empty]).argmin(axis=1)] = 1.0
    return (tri / tri.sum(axis=1, keepdims=True)).astype(np.float32)


@functools.lru_cache(maxsize=1)
def _dct() -> np.ndarray:
    """DCT-II rows 0..N_CEPS-1 over the mel bands scaled as a real cepstrum, [N_CEPS, N_MELS].

    c_k = (1/M) sum_m x_m cos(pi k (m + 1/2) / M): the inverse DFT of a symmetric log spectrum, the
    scale MCD's dB constant was defined on (an orthonormal DCT would read sqrt(2M) = 9x larger).
    """
    k = np.arange(N_CEPS)[:, None]
    m = np.arange(N_MELS)[None, :]
    return (np.cos(np.pi * k * (m + 0.5) / N_MELS) / N_MELS).astype(np.float32)


def _pool(x: np.ndarray, slices: int) -> np.ndarray:
    """Mean of `x` [n, B] over `slices` contiguous, near-equal runs of rows -> [slices, B].

    Time-normalizing replaces the DTW alignment of a textbook MCD: both revisions spoke the same text,
    so slice i of each covers the same part of the utterance, and a tempo change shows up in the
    duration ratio instead of smearing the spectral distance.
    """
    n = len(x)
    edges = np.linspace(0, n, slices + 1)
    starts = np.floor(edges[:-1]).astype(int)  # [slices]
    ends = np.minimum(n, np.maximum(starts + 1, np.ceil(edges[1:]).astype(int)))  # [slices]; >= 1 row each
    csum = np.concatenate([np.zeros((1, x.shape[1]), x.dtype), np.cumsum(x, axis=0)])  # [n+1, B]
    return (csum[ends] - csum[starts]) / (ends - starts)[:, None]


def fingerprint(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """A time-normalized mel cepstrum of mono float audio, [FRAMES, N_CEPS] float32."""
    x = np.asarray(audio, dtype=np.float32)[: int(FINGERPRINT_MAX_SECONDS * sample_rate)]
    if len(x) < N_FFT:
        x = np.pad(x, (0, N_FFT - len(x)))
    n = 1 + (len(x) - N_FFT) // HOP
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP][:n]  # [n, N_FFT] (a view)
    window = np.hanning(N_FFT).astype(np.float32)
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2  # [n, N_FFT//2+1]
    mel = power @ _mel_filters(sample_rate).T  # [n, N_MELS]
    # Natural log of the amplitude (half the log power), the convention MCD's dB constant assumes.
    # The floor, 60 dB below the loudest band, makes pauses flat: the log of near-silence is noise
    # that would otherwise dominate the distance between two renditions of the same text.
    floor = max(float(mel.max()), 1e-20) * 1e-6
    log_amp = 0.5 * np.log(np.maximum(mel, floor))  # [n, N_MELS]
    return (_pool(log_amp, FRAMES) @ _dct().T).astype(np.float32)  # [FRAMES, N_CEPS]


def mel_cepstral_distortion(a: np.ndarray, b: np.ndarray) -> float:
    """Mean MCD in dB between two fingerprints [FRAMES, N_CEPS]; c0 (overall level) is left out."""
    diff = (
        np.asarray(a, dtype=np.float64)[:, 1:] - np.asarray(b, dtype=np.float64)[:, 1:]
    )  # [FRAMES, N_CEPS-1]
    return float(np.mean(_MCD_DB * np.sqrt(np.sum(diff**2, axis=1))))


def text_sha256(texts: Sequence[str]) -> str:
    # Record separator between items: ["ab", "c"] and ["a", "bc"] must not hash alike.
    return hashlib.sha256("\x1e".join(texts).encode("utf-8")).hexdigest()


# --- what a request synthesized -------------------------------------------------------------
@dataclass
class Capture:
    """The texts and audio one request synthesized (several calls for the segmented speech route)."""

    texts: list[str] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)
    sample_rate: int = 0
    audio_seconds: float = 0.0
    _kept_samples: int = 0

    def add(self, texts: Sequence[str], audio: Sequence[np.ndarray], sample_rate: int) -> None:
        self.texts.extend(texts)
        self.sample_rate = sample_rate
        limit = int(FINGERPRINT_MAX_SECONDS * sample_rate)
        for a in audio:
            self.audio_seconds += len(a) / sample_rate
            if self._kept_samples < limit:
                self.audio.append(a)  # a reference: the arrays are never written after synthesis
                self._kept_samples += len(a)


# The request being served, set by the HTTP middleware and the gRPC interceptor; the service adds to
# it, so every route that synthesizes (v2 REST/gRPC, v1, CloudEvents, speech) is covered in one place.
_CURRENT: ContextVar[Capture | None] = ContextVar("shadow_capture", default=None)


def begin() -> tuple[Capture, Any]:
    capture = Capture()
    return capture, _CURRENT.set(capture)


def end(token: Any) -> None:
    _CURRENT.reset(token)


def capture(texts: Sequence[str], audio: Sequence[np.ndarray], sample_rate: int) -> None:
    """Note what the current request synthesized; a no-op outside a recorded request."""
    current = _CURRENT.get()
    if current is not None:
        current.add(texts, audio, sample_rate)


def request_id(incoming: str | None) -> str:
    """The caller's id if it is a sane token (it is copied into logs and records), else a fresh uuid4."""
    if (
        incoming
        and len(incoming) <= 200
        and incoming.isascii()
        and incoming.isprintable()
        and " " not in incoming
    ):
        return incoming
    return str(uuid.uuid4())


# --- sinks -----------------------------------------------------------------------------------
class Sink(Protocol):
    def write(self, body: bytes) -> None:
        """Write one batch of JSONL atomically; raise on failure (the recorder retries)."""


class StdoutSink:
    def write(self, body: bytes) -> None:
        sys.stdout.buffer.write(body)
        sys.stdout.buffer.flush()


def _batch_key(revision: str) -> str:
    # Time first, so a listing reads in order; a uuid, so two pods (or two batches in one second) of
    # the same revision never overwrite each other.
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{stamp}-{revision}-{uuid.uuid4().hex[:12]}.jsonl"


class S3Sink:
    def __init__(self, bucket: str, prefix: str, revision: str):
        from predictor import storage

        self._client = storage.s3_client(concurrency=1)
        self._bucket, self._prefix, self._revision = bucket, prefix, revision

    def write(self, body: bytes) -> None:
        from predictor import storage

        key = storage.object_key(self._prefix, _batch_key(self._revision))
        self._client.put_object(Bucket=self._bucket, Key=key, Body=body, ContentType="application/x-ndjson")


class DirSink:
    def __init__(self, root: Path, revision: str):
        self._root, self._revision = root, revision
        root.mkdir(parents=True, exist_ok=True)

    def write(self, body: bytes) -> None:
        from predictor.artifact import atomic_write_bytes

        atomic_write_bytes(self._root / _batch_key(self._revision), body)


def open_sink(uri: str, revision: str) -> Sink | None:
    """The sink SHADOW_SINK names: None (off), stdout, s3://bucket/prefix, or a local directory."""
    if not uri:
        return None
    if uri == "stdout":
        return StdoutSink()
    from predictor import storage

    scheme, root, prefix = storage.parse_uri(uri)
    if scheme == "s3":
        return S3Sink(root, prefix, revision)
    return DirSink(Path(root), revision)


# --- the recorder: request path -> queue -> background thread -> sink ------------------------
@dataclass(frozen=True)
class _Pending:
    request_id: str
    route: str
    status: int
    latency_s: float
    ts: float
    capture: Capture | None


_STOP = object()


class Recorder:
    """Turns finished requests into records on one background thread and writes them in batches."""

    def __init__(
        self,
        sink: Sink,
        revision: str,
        *,
        batch_records: int,
        flush_s: float,
        queue_size: int,
        retries: int = 3,
        backoff_s: float = 0.5,
    ):
        self.revision = revision
        self._sink = sink
        self._batch_records = batch_records
        self._flush_s = flush_s
        self._retries = retries
        self._backoff_s = backoff_s
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="shadow-records", daemon=True)
        self._thread.start()

    def submit(
        self, request_id: str, route: str, status: int, latency_s: float, capture: Capture | None
    ) -> None:
        """Called on the request path: never blocks, drops the record when the queue is full."""
        try:
            self._queue.put_nowait(_Pending(request_id, route, status, latency_s, time.time(), capture))
        except queue.Full:
            metrics.SHADOW_RECORDS.labels("dropped").inc()

    def close(self, timeout_s: float = 30.0) -> None:
        """Write everything queued, then stop the thread (at shutdown, after the servers stopped)."""
        try:
            self._queue.put(_STOP, timeout=timeout_s)  # waits for room: the thread keeps draining
        except queue.Full:
            log.error(
                "shadow records: the writer is stuck (sink unresponsive); %d records lost",
                self._queue.qsize(),
            )
            return
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error(
                "shadow records: the writer did not finish within %.0f s; the tail may be lost", timeout_s
            )

    # --- the background thread ---------------------------------------------------------------
    def _run(self) -> None:
        batch: list[bytes] = []
        deadline = math.inf
        while True:
            try:
                item = self._queue.get(timeout=None if not batch else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                item = None
            if item is _STOP:
                self._flush(batch)
                return
            if item is not None:
                try:
                    batch.append(self._record(item))
                except Exception:
                    log.exception("shadow record for %s could not be built", item.request_id)
                if len(batch) == 1:
                    deadline = time.monotonic() + self._flush_s
            if batch and (len(batch) >= self._batch_records or time.monotonic() >= deadline):
                self._flush(batch)
                batch, deadline = [], math.inf

    def _record(self, p: _Pending) -> bytes:
        record: dict[str, Any] = {
            "v": RECORD_VERSION,
            "id": p.request_id,
            "revision": self.revision,
            "route": p.route,
            "status": p.status,
            "ts": round(p.ts, 3),
            "latency_s": round(p.latency_s, 6),
            "audio_s": None,
            "sample_rate": None,
            "items": 0,
            "text_sha256": None,
            "mcep": None,
        }
        c = p.capture
        if c is not None and c.texts:
            record.update(
                audio_s=round(c.audio_seconds, 4),
                sample_rate=c.sample_rate,
                items=len(c.texts),
                text_sha256=text_sha256(c.texts),
            )
            if c.audio and c.audio_seconds > 0:
                mcep = fingerprint(np.concatenate(c.audio), c.sample_rate)  # [FRAMES, N_CEPS]
                record["mcep"] = np.round(mcep, 3).tolist()
        return orjson.dumps(record) + b"\n"

    def _flush(self, batch: list[bytes]) -> None:
        if not batch:
            return
        body = b"".join(batch)
        for attempt in range(self._retries + 1):
            try:
                self._sink.write(body)
                metrics.SHADOW_RECORDS.labels("written").inc(len(batch))
                return
            except Exception as exc:
                if attempt == self._retries:
                    metrics.SHADOW_RECORDS.labels("lost").inc(len(batch))
                    log.error("shadow records: a batch of %d could not be written: %s", len(batch), exc)
                    return
                time.sleep(self._backoff_s * 2**attempt)


# --- HTTP: ids on every response, a record per synthesis request -----------------------------
class RequestIdentity:
    """Pure ASGI middleware: `x-request-id` and `x-tts-revision` on every response; with a recorder,
    a shadow record for every request to a synthesis route (errors included: compare needs them)."""

    def __init__(self, app, revision: str, recorder: Recorder | None, routes: frozenset[str]):
        self.app = app
        self._revision = revision.encode()
        self._recorder = recorder
        self._routes = routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        incoming = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"")
        rid = request_id(incoming.decode("latin-1"))
        ids = [(b"x-request-id", rid.encode()), (b"x-tts-revision", self._revision)]
        status = 500  # what the client sees if the app raises before answering

        async def send_with_ids(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), *ids]}
            await send(message)

        if self._recorder is None:
            return await self.app(scope, receive, send_with_ids)
        started = time.perf_counter()
        captured, token = begin()
        try:
            await self.app(scope, receive, send_with_ids)
        finally:
            end(token)
            route = getattr(scope.get("route"), "path", None)
            if route in self._routes:
                self._recorder.submit(rid, route, status, time.perf_counter() - started, captured)
