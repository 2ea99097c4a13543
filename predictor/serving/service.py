"""The synthesis service every route shares: validation, readiness, one engine thread, drain.

Routes (v2 REST/gRPC, v1, CloudEvents) decode their own wire format into texts + SynthesisParams and
call `TTSService.synthesize`. The engine runs on a single dedicated thread behind a bounded
queue (batcher.py): engine calls are serialized (a GPU runs one graph at a time anyway), the event
loop never blocks on synthesis, so liveness answers during a long request, and overload is refused
at once rather than queued without bound.

The drain counts requests, not engine calls: the REST middleware, the gRPC interceptor and Triton's
stream handler (per streamed request) admit each synthesis request (`TTSService.admit`) for its whole
life — every segment of a stream, an event's upload and completion record — and a request admitted
before SIGTERM is served to its end, while one arriving after is refused. Counting engine calls cut
streams off between two segments.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np

from predictor import text as text_prep
from predictor.config import Settings
from predictor.engine.base import Engine, StreamWindows, SynthesisParams
from predictor.engine.words import Word
from predictor.errors import BadRequest, NothingToSpeak, NotReady, PayloadTooLarge
from predictor.observability import metrics, tracing
from predictor.serving.batcher import Batcher, Worker
from predictor.serving.limits import check_blank, check_count, check_length
from predictor.shadow import recorder as records

log = logging.getLogger("predictor.service")


@dataclass(frozen=True)
class SynthesisResult:
    audio: list[np.ndarray]  # one float32 mono array per text, in [-1, 1]
    sample_rate: int
    engine_seconds: float
    # Each text's words, in samples of its audio, where timestamps were asked for (serving/pipeline.py).
    words: list[list[Word]] | None = None

    @property
    def audio_seconds(self) -> float:
        return sum(len(a) for a in self.audio) / self.sample_rate


@dataclass(eq=False)
class Admission:
    """One request counted by the drain, from its first byte in to its last byte out."""

    service: TTSService
    request_id: str
    route: str
    started: float = field(default_factory=time.monotonic)
    # What the request has already passed, so each check runs once per request however many engine
    # calls it makes (a speech request makes one per segment).
    ready_checked: bool = False
    params_checked: SynthesisParams | None = None
    work_checked: bool = False


# The admission of the request this task serves; copied into the tasks it starts (a stream's body,
# an event's shielded upload), so they are served as the request that started them.
_ADMISSION: ContextVar[Admission | None] = ContextVar("tts_admission", default=None)


class TTSService:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.engine: Engine | None = None
        self._ready = False
        self._draining = False
        self._in_flight = 0  # engine calls, for direct callers that were never admitted
        self._admitted: set[Admission] = set()
        self._answered = 0  # requests admitted and finished since start
        self._idle = asyncio.Condition()
        self._batcher: Batcher | None = None

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready and not self._draining

    def _worker(self, e: Engine) -> Worker:
        sizes = StreamWindows(self.settings.stream_first_window_frames, self.settings.stream_window_frames)
        return Worker(
            e.synthesize_checked,
            # A stream's later segment starts while its earlier audio plays: no short first window.
            run_stream=lambda text, params, following: e.stream_checked(
                text, params, sizes.following() if following else sizes
            ),
            run_aligned=e.align_checked,
        )

    def mark_ready(self, engine: Engine, more_engines: Sequence[Engine] = ()) -> None:
        """Serve from ``engine`` (and, one worker each, ``more_engines``: copies of it). With a solo
        worker (Settings.solo_worker) ``engine`` serves every call until add_workers makes it the solo one."""
        settings = self.settings
        first, *more = map(self._worker, [engine, *more_engines])
        self._batcher = Batcher(
            first.run_batch,
            run_stream=first.run_stream,
            run_aligned=first.run_aligned,
            more_workers=more,
            max_batch_size=settings.batch_size,
            max_delay_s=settings.max_batch_delay_ms / 1000,
            max_queue=settings.max_queue,
            timeout_s=settings.request_timeout_s,
            trim_when_idle=settings.memory_trim,
        )
        self.engine = engine
        self._ready = True
        metrics.READY.set(1)

    def add_workers(self, engines: Sequence[Engine]) -> None:
        """The workers' copies, made after ready (any thread): from now on ``engine`` is the solo
        worker and these run the calls that overlap."""
        assert self._batcher is not None, "add_workers before mark_ready"
        self._batcher.add_workers([self._worker(e) for e in engines])

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests, wait for admitted ones; True if they all finished in time.

        On timeout, logs the requests still running (ids, routes, seconds) before they are cut off.
        """
        self._draining = True
        metrics.READY.set(0)
        async with self._idle:
            try:
                await asyncio.wait_for(self._idle.wait_for(self._idle_now), timeout_s)
                return True
            except TimeoutError:
                now = time.monotonic()
                running = [
                    {"request_id": a.request_id, "route": a.route, "running_s": round(now - a.started, 3)}
                    for a in sorted(self._admitted, key=lambda a: a.started)
                ]
                log.warning(
                    "drain timed out after DRAIN_TIMEOUT_S=%s; cutting off %d request(s): %s",
                    timeout_s,
                    len(running),
                    ", ".join(f"{r['request_id']} {r['route']}" for r in running) or "none",
                    extra={"cut_off": running, "engine_calls": self._in_flight},
                )
                return False

    def _idle_now(self) -> bool:
        return not self._admitted and self._in_flight == 0

    @contextlib.asynccontextmanager
    async def admit(self, request_id: str, route: str) -> AsyncIterator[Admission | None]:
        """Count one request for the drain while the block runs: yields its admission, or None when
        draining (the route then refuses it with 503 / UNAVAILABLE through require_ready)."""
        if self._draining:
            yield None
            return
        admission = Admission(self, request_id, route)
        self._admitted.add(admission)
        if self._batcher is not None:
            self._batcher.hold_trim()
        token = _ADMISSION.set(admission)
        try:
            yield admission
        finally:
            _ADMISSION.reset(token)
            self._admitted.discard(admission)
            self._answered += 1
            if self._batcher is not None and self._idle_now():
                self._batcher.trim_when_idle()
            async with self._idle:
                self._idle.notify_all()

    def idle(self) -> bool:
        """No request admitted, no engine call running (read from any thread)."""
        return self._idle_now()

    @property
    def answered(self) -> int:
        """Requests admitted and finished (answered or failed) since start (read from any thread)."""
        return self._answered

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def admitted(self) -> int:
        return len(self._admitted)

    @property
    def busy(self) -> bool:
        """More requests admitted than the engine workers run at once: one at least is waiting."""
        return len(self._admitted) > self.settings.workers()

    # --- requests --------------------------------------------------------------------------
    @property
    def sample_rate(self) -> int:
        if self.engine is None:
            raise NotReady("model is not loaded yet")
        return self.engine.sample_rate

    @property
    def voices(self) -> list[str]:
        return self.engine.voices if self.engine else []

    def _admission(self) -> Admission | None:
        """The admission of the request this task serves, if this service admitted it."""
        admission = _ADMISSION.get()
        return admission if admission is not None and admission.service is self else None

    def require_ready(self) -> None:
        """The readiness check, once per admitted request (a direct caller is checked on every call)."""
        admission = self._admission()
        if admission is not None and admission.ready_checked:
            return
        # Admitted before the drain began: served to its end.
        if not (self._ready and admission is not None) and not self.ready:
            raise NotReady(
                "model is draining" if self._draining else "model is not ready (cold start in progress)"
            )
        if admission is not None:
            admission.ready_checked = True

    def check(self, texts: Sequence[str], params: SynthesisParams) -> None:
        """Reject bad input before it takes a place in the queue: readiness, the texts, the parameters."""
        self.require_ready()
        if not texts:
            raise BadRequest("no text given: send at least one item")
        check_count(len(texts), self.settings.max_batch_items)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise BadRequest(f"text[{i}] must be a string")
            check_blank(i, text)
            check_length(i, len(text), self.settings.max_text_chars)
            if not text_prep.has_pronounceable(text):
                raise NothingToSpeak(f"text[{i}] has nothing to speak (no phonemes)")
        self._check_params(params)
        admission = self._admission()
        if admission is None or not admission.work_checked:
            # Once per request: the speech route checks its whole input itself, segment count included.
            self.check_work(sum(map(len, texts)), 1, params.length_scale)

    def check_work(
        self, chars: int, engine_calls: int, length_scale: float | None, silence_s: float = 0.0
    ) -> None:
        """Refuse, with 413 before any synthesis, a request that would make more engine calls or more
        audio than one request may (MAX_ENGINE_CALLS, MAX_REQUEST_AUDIO_S); ``silence_s``: SSML breaks."""
        limit = self.settings.max_engine_calls
        if engine_calls > limit:
            raise PayloadTooLarge(
                f"the input makes {engine_calls} engine calls (one per sentence or segment); the limit "
                f"is MAX_ENGINE_CALLS={limit}: join short sentences or split the request"
            )
        scale = length_scale if length_scale is not None else (self.settings.length_scale_default or 1.0)
        seconds = text_prep.spoken_seconds_bound_chars(chars, scale) + silence_s
        if seconds > self.settings.max_request_audio_s:
            breaks = f" and {silence_s:g} s of breaks" if silence_s else ""
            raise PayloadTooLarge(
                f"the input may make up to {seconds:.0f} s of audio ({chars} characters at length_scale "
                f"{scale:g}{breaks}); the limit is MAX_REQUEST_AUDIO_S={self.settings.max_request_audio_s:g}: "
                "split the request"
            )
        admission = self._admission()
        if admission is not None:
            admission.work_checked = True

    def check_params(self, params: SynthesisParams) -> None:
        """Readiness and the parameters (seed, voice), for a route that checks them before any text (the
        speech route, before its first byte); the request's engine calls then skip both."""
        self.require_ready()
        self._check_params(params)

    def _check_params(self, params: SynthesisParams) -> None:
        admission = self._admission()
        if admission is not None and admission.params_checked == params:
            return
        assert self.engine is not None
        if params.seed is not None and not self.engine.supports_seed:
            raise BadRequest(
                f"parameter seed needs an engine that seeds its noise (torch, onnx); ENGINE={self.engine.name} cannot"
            )
        # The voice's one check: the engine's own calls skip it (Engine.synthesize_checked).
        self.engine.check_voice(params.voice)
        if admission is not None:
            admission.params_checked = params

    def _with_defaults(self, params: SynthesisParams) -> SynthesisParams:
        default = self.settings.length_scale_default
        if params.length_scale is None and default is not None:
            params = dataclasses.replace(params, length_scale=default)
        return params

    async def stream(
        self, text: str, params: SynthesisParams, following: bool = False
    ) -> AsyncIterator[tuple[np.ndarray, bool]]:
        """The audio of one text as (float32 piece, last) per decoder window, as each is decoded.

        Admission, queue, timeout and drain as for synthesize: the stream takes one place in the queue
        and holds the engine thread window after window. Closing the iterator early (a client that
        hung up) stops the engine at the next window. A text with nothing to speak yields one empty
        last piece rather than failing mid-stream.
        """
        params = self._with_defaults(params)
        self.check([text], params)
        assert self._batcher is not None and self.engine is not None
        sample_rate = self.engine.sample_rate
        pieces: asyncio.Queue[tuple[np.ndarray, bool] | None] = asyncio.Queue()
        spoken: list[np.ndarray] = []
        async with self._engine_call():
            future = self._batcher.submit(
                [text], params, on_piece=lambda a, last: pieces.put_nowait((a, last)), following=following
            )
            try:
                # Resolves after every piece was queued (same loop, FIFO): None marks the end.
                future.add_done_callback(lambda _: pieces.put_nowait(None))
                while (piece := await pieces.get()) is not None:
                    spoken.append(piece[0])
                    yield piece
                _, engine_seconds = future.result()  # the engine's error, if it failed
            finally:
                if not future.done():
                    future.cancel()
        audio = np.concatenate(spoken) if spoken else np.zeros(0, dtype=np.float32)
        self._observe([text], [audio], sample_rate, engine_seconds)

    async def synthesize(
        self, texts: Sequence[str], params: SynthesisParams, partial: bool = False, following: bool = False
    ) -> SynthesisResult:
        """The audio of each text, in one engine call through the queue. ``partial``: a text the engine
        reads as nothing comes back empty instead of failing the call (the pipeline's segments).
        ``following``: a later call of a request already served once (Batcher.submit)."""
        result, _ = await self._synthesize(texts, params, False, partial, following)
        return result

    async def synthesize_aligned(
        self, texts: Sequence[str], params: SynthesisParams, partial: bool = False, following: bool = False
    ) -> tuple[SynthesisResult, list[list[Word]]]:
        """The audio of each text, as synthesize, with when each of its written words is spoken in it
        (samples, engine/words.py)."""
        result, said = await self._synthesize(texts, params, True, partial, following)
        assert said is not None
        return result, said

    async def _synthesize(
        self, texts: Sequence[str], params: SynthesisParams, aligned: bool, partial: bool, following: bool
    ) -> tuple[SynthesisResult, list[list[Word]] | None]:
        """One engine call through the queue; ``aligned``: with each text's words' times too."""
        params = self._with_defaults(params)
        self.check(texts, params)
        assert self._batcher is not None and self.engine is not None
        said: list[list[Word]] | None = None
        async with self._engine_call():
            with tracing.tracer().start_as_current_span(
                "synthesize", attributes={"tts.items": len(texts)}
            ) as span:
                answered, engine_seconds = await self._batcher.submit(
                    list(texts), params, aligned=aligned, following=following
                )
                if aligned:
                    audio, said = [a for a, _ in answered], [w for _, w in answered]
                else:
                    audio = answered
                result = SynthesisResult(
                    audio=audio, sample_rate=self.engine.sample_rate, engine_seconds=engine_seconds
                )
                span.set_attribute("tts.audio_seconds", result.audio_seconds)
                span.set_attribute("tts.engine_seconds", engine_seconds)
        for i, a in enumerate(audio):
            if len(a) == 0 and not partial:
                raise NothingToSpeak(f"text[{i}] has nothing to speak (no phonemes)")
        self._observe(texts, audio, result.sample_rate, engine_seconds)
        return result, said

    @contextlib.asynccontextmanager
    async def _engine_call(self) -> AsyncIterator[None]:
        """One engine call, unary or streamed alike, counted in tts_in_flight_requests and by the drain
        (which also waits for calls of direct callers that were never admitted)."""
        self._in_flight += 1
        metrics.IN_FLIGHT.inc()
        try:
            yield
        finally:
            self._in_flight -= 1
            metrics.IN_FLIGHT.dec()
            async with self._idle:
                self._idle.notify_all()

    @staticmethod
    def _observe(
        texts: Sequence[str], audio: list[np.ndarray], sample_rate: int, engine_seconds: float
    ) -> None:
        """A finished engine call's audio into this request's shadow record (if any) and the metrics."""
        records.capture(texts, audio, sample_rate)
        seconds = sum(len(a) for a in audio) / sample_rate
        metrics.SYNTHESIS_SECONDS.observe(engine_seconds)
        metrics.AUDIO_SECONDS.observe(seconds)
        if seconds > 0:
            metrics.REAL_TIME_FACTOR.observe(engine_seconds / seconds)
