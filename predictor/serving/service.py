"""The synthesis service every route shares: validation, readiness, one engine thread, drain.

Routes (v2 REST/gRPC, v1, CloudEvents) decode their own wire format into texts + SynthesisParams and
call `TTSService.synthesize`. The engine runs on a single dedicated thread behind a bounded
queue (batcher.py): engine calls are serialized (a GPU runs one graph at a time anyway), the event
loop never blocks on synthesis, so liveness answers during a long request, and overload is refused
at once rather than queued without bound.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from predictor import text as text_prep
from predictor.config import Settings
from predictor.engine.base import Engine, SynthesisParams
from predictor.errors import BadRequest, NothingToSpeak, NotReady
from predictor.observability import metrics, tracing
from predictor.serving.batcher import Batcher
from predictor.shadow import recorder as records

log = logging.getLogger("predictor.service")


@dataclass(frozen=True)
class SynthesisResult:
    audio: list[np.ndarray]  # one float32 mono array per text, in [-1, 1]
    sample_rate: int
    engine_seconds: float

    @property
    def audio_seconds(self) -> float:
        return sum(len(a) for a in self.audio) / self.sample_rate


class TTSService:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.engine: Engine | None = None
        self._ready = False
        self._draining = False
        self._in_flight = 0
        self._idle = asyncio.Condition()
        self._batcher: Batcher | None = None

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready and not self._draining

    def mark_ready(self, engine: Engine) -> None:
        settings = self.settings
        # Measured: on CPU a batch loses throughput (bench `engines`); on a GPU it fills the card.
        auto = 16 if settings.device.startswith("cuda") else 1
        self._batcher = Batcher(
            engine.synthesize,
            max_batch_size=settings.max_batch_size or auto,
            max_delay_s=settings.max_batch_delay_ms / 1000,
            max_queue=settings.max_queue,
            timeout_s=settings.request_timeout_s,
        )
        self.engine = engine
        self._ready = True
        metrics.READY.set(1)

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new work, wait for in-flight requests; True if they all finished in time."""
        self._draining = True
        metrics.READY.set(0)
        async with self._idle:
            try:
                await asyncio.wait_for(self._idle.wait_for(lambda: self._in_flight == 0), timeout_s)
                return True
            except TimeoutError:
                log.warning("drain timed out", extra={"in_flight": self._in_flight})
                return False

    # --- requests --------------------------------------------------------------------------
    @property
    def sample_rate(self) -> int:
        if self.engine is None:
            raise NotReady("model is not loaded yet")
        return self.engine.sample_rate

    @property
    def voices(self) -> list[str]:
        return self.engine.voices if self.engine else []

    def require_ready(self) -> None:
        if not self.ready:
            raise NotReady(
                "model is draining" if self._draining else "model is not ready (cold start in progress)"
            )

    def check(self, texts: Sequence[str], params: SynthesisParams) -> None:
        """Reject bad input before it takes a place in the queue."""
        self.require_ready()
        if not texts:
            raise BadRequest("no text given: send at least one item")
        if len(texts) > self.settings.max_batch_items:
            raise BadRequest(
                f"{len(texts)} texts in one request; the limit is MAX_BATCH_ITEMS={self.settings.max_batch_items}"
            )
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise BadRequest(f"text[{i}] must be a string")
            if not text.strip():
                raise BadRequest(f"text[{i}] is empty or whitespace only")
            if len(text) > self.settings.max_text_chars:
                raise BadRequest(
                    f"text[{i}] has {len(text)} characters; the limit is MAX_TEXT_CHARS={self.settings.max_text_chars}"
                )
            if not text_prep.has_pronounceable(text):
                raise NothingToSpeak(f"text[{i}] has nothing to speak (no phonemes)")
        self.check_params(params)

    def check_params(self, params: SynthesisParams) -> None:
        self.require_ready()
        assert self.engine is not None
        if params.seed is not None and not self.engine.supports_seed:
            raise BadRequest(
                f"parameter seed needs ENGINE=torch; ENGINE={self.engine.name} cannot seed its noise"
            )
        self.engine.check_voice(params.voice)

    async def synthesize(self, texts: Sequence[str], params: SynthesisParams) -> SynthesisResult:
        if params.length_scale is None and self.settings.default_length_scale:
            params = dataclasses.replace(params, length_scale=self.settings.default_length_scale)
        self.check(texts, params)
        assert self._batcher is not None and self.engine is not None
        self._in_flight += 1
        metrics.IN_FLIGHT.inc()
        try:
            with tracing.tracer().start_as_current_span(
                "synthesize", attributes={"tts.items": len(texts)}
            ) as span:
                audio, engine_seconds = await self._batcher.submit(list(texts), params)
                result = SynthesisResult(
                    audio=audio, sample_rate=self.engine.sample_rate, engine_seconds=engine_seconds
                )
                span.set_attribute("tts.audio_seconds", result.audio_seconds)
                span.set_attribute("tts.engine_seconds", engine_seconds)
        finally:
            self._in_flight -= 1
            metrics.IN_FLIGHT.dec()
            async with self._idle:
                self._idle.notify_all()
        for i, a in enumerate(audio):
            if len(a) == 0:
                raise NothingToSpeak(f"text[{i}] has nothing to speak (no phonemes)")
        records.capture(texts, audio, result.sample_rate)  # for this request's shadow record, if any
        metrics.SYNTHESIS_SECONDS.observe(engine_seconds)
        metrics.AUDIO_SECONDS.observe(result.audio_seconds)
        if result.audio_seconds > 0:
            metrics.REAL_TIME_FACTOR.observe(engine_seconds / result.audio_seconds)
        return result
