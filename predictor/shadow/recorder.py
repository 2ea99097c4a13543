"""Shadow records: one compact line per synthesis request, so a canary can be judged against stable.

A canary that receives mirrored traffic (Istio `mirror`, nginx `mirror`) has its responses thrown
away; the only way to compare it with stable is for both revisions to write down what they did,
keyed by a request id both saw. Every HTTP response (and gRPC call) therefore carries
`x-request-id` (the caller's, or a fresh uuid4) and `x-tts-revision`, and, when SHADOW_SINK is set,
each synthesis request leaves a record:

    {"v": 1, "id": "…", "revision": "…", "route": "/v2/models/{model_name}/infer", "status": 200,
     "ts": 1764500000.123, "latency_s": 0.41, "audio_s": 2.3, "sample_rate": 22050, "items": 1,
     "text_sha256": "…", "mcep": [[c0 … c12] × 32],
     "mos_p808": 3.98, "mos_sig": 3.43, "mos_bak": 4.16, "mos_ovrl": 3.21}

The text itself never leaves the pod (privacy): its sha256 is enough to check both revisions were
asked the same thing. `mcep` is the audio's fingerprint: a 13-coefficient mel cepstrum pooled to 32
time slices (see `fingerprint`), from which `compare` computes a mel-cepstral distortion. The
`mos_*` fields are DNSMOS estimates (see `predictor.audio.quality`) for a sampled share of requests
(SHADOW_MOS_SAMPLE), null otherwise. The sample is chosen by a hash of the request id, so stable and
canary, fed the same mirrored ids, score the same requests and `compare` can pair them.

The request path only captures references to the audio and puts one item on a bounded queue
(`put_nowait`); the fingerprint, JSON and the sink's I/O run on one background thread. A full queue
drops the record (counted in tts_shadow_records_total{outcome="dropped"}) rather than slow a request.
A MOS estimate costs far more than a fingerprint (one core for ~0.5-1 s per clip), so it is computed only while
the queue is at most a quarter full: when the thread is behind, the record goes out without it
(tts_shadow_mos_total{outcome="behind"}) rather than hold up the records queued after it.
Records leave in batches (SHADOW_BATCH_RECORDS or SHADOW_FLUSH_S, whichever comes first), each batch
one object under a unique key (a PUT is atomic: a reader sees a whole batch or none); `close()`
writes the tail, so SIGTERM loses nothing."""

from __future__ import annotations

import hashlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from predictor.audio import quality
from predictor.audio.fingerprint import FINGERPRINT_MAX_SECONDS, fingerprint
from predictor.config import ConfigError, Settings
from predictor.errors import StorageError
from predictor.observability import metrics
from predictor.shadow.sinks import Sink, open_sink

log = logging.getLogger("predictor.shadow")


RECORD_VERSION = 1  # the mos_* fields were added without a bump: readers treat them as optional
MOS_FIELDS = ("mos_p808", "mos_sig", "mos_bak", "mos_ovrl")
# The queue depth, as a share of its size, above which the thread counts as behind and skips MOS.
MOS_BEHIND_SHARE = 0.25


def text_sha256(texts: Sequence[str]) -> str:
    # Record separator between items: ["ab", "c"] and ["a", "bc"] must not hash alike.
    return hashlib.sha256("\x1e".join(texts).encode("utf-8")).hexdigest()


def mos_sampled(request_id: str, share: float) -> bool:
    """Whether this request's record carries a MOS estimate: the same answer in every revision."""
    if share <= 0:
        return False
    h = int.from_bytes(hashlib.sha256(request_id.encode("utf-8")).digest()[:8], "big")
    return h < share * 2**64


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
        mos_sample: float = 0.0,
        estimator: Callable[[], quality.Estimator] = quality.shared_estimator,
    ):
        """`mos_sample`: share of requests scored; `estimator` gives the (shared) MOS estimator,
        called on the background thread the first time a record is scored."""
        self.revision = revision
        self._mos_sample = mos_sample
        self._estimator_factory: Callable[[], quality.Estimator] | None = estimator
        self._estimator: quality.Estimator | None = None
        self._mos_behind_at = int(queue_size * MOS_BEHIND_SHARE)
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
            **dict.fromkeys(MOS_FIELDS),
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
                audio = np.concatenate(c.audio)
                mcep = fingerprint(audio, c.sample_rate)  # [FRAMES, N_CEPS]
                record["mcep"] = np.round(mcep, 3).tolist()
                if p.status < 400 and mos_sampled(p.request_id, self._mos_sample):
                    record.update(self._mos(audio, c.sample_rate))
        return orjson.dumps(record) + b"\n"

    def _mos(self, audio: np.ndarray, sample_rate: int) -> dict[str, float]:
        """The record's mos_* fields, or nothing when behind, unscorable or unavailable."""
        if self._queue.qsize() > self._mos_behind_at:
            metrics.SHADOW_MOS.labels("behind").inc()
            return {}
        estimator = self._mos_estimator()
        if estimator is None:
            return {}
        try:
            mos = estimator.estimate(audio, sample_rate)
        except Exception:  # a failing estimate must not cost the record itself
            log.exception("shadow records: the MOS estimate failed")
            mos = None
        if mos is None:
            metrics.SHADOW_MOS.labels("unscored").inc()
            return {}
        metrics.SHADOW_MOS.labels("scored").inc()
        return {
            "mos_p808": round(mos.p808, 4),
            "mos_sig": round(mos.sig, 4),
            "mos_bak": round(mos.bak, 4),
            "mos_ovrl": round(mos.ovrl, 4),
        }

    def _mos_estimator(self) -> quality.Estimator | None:
        if self._estimator is None and self._estimator_factory is not None:
            try:
                self._estimator = self._estimator_factory()
            except Exception as exc:  # models missing or unloadable: records go on without MOS
                log.error("shadow records: MOS estimates off, the estimator cannot load: %s", exc)
                self._estimator_factory = None
        return self._estimator

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


def from_settings(settings: Settings) -> Recorder | None:
    """The recorder SHADOW_SINK asks for (None when unset); a bad sink or missing MOS models is a
    ConfigError at start, not a surprise on the first request."""
    try:
        sink = open_sink(settings.shadow_sink, settings.revision_name, settings.s3_read_timeout_s)
    except (StorageError, OSError) as exc:  # OSError: a local directory that cannot be created
        raise ConfigError(f"invalid configuration: SHADOW_SINK: {exc}") from None
    if sink is None:
        return None
    if settings.shadow_mos_sample > 0:
        try:
            quality.model_files()  # a path check; the sessions load on the records' thread when first needed
        except quality.QualityUnavailable as exc:
            raise ConfigError(f"invalid configuration: SHADOW_MOS_SAMPLE: {exc} (or set it to 0)") from None
    log.info(
        "shadow records on",
        extra={
            "sink": settings.shadow_sink,
            "revision": settings.revision_name,
            "mos_sample": settings.shadow_mos_sample,
        },
    )
    return Recorder(
        sink,
        settings.revision_name,
        batch_records=settings.shadow_batch_records,
        flush_s=settings.shadow_flush_s,
        queue_size=settings.shadow_queue,
        mos_sample=settings.shadow_mos_sample,
    )
