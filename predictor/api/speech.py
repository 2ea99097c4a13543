"""`POST /v1/audio/speech`, shaped like OpenAI's speech API, streaming audio window by window.

The input is normalized and cut into segments of at most MAX_SEGMENT_CHARS (sentences, then clauses)
before anything is synthesized (off the event loop when it is long), so that a request making more
engine calls or more audio than one request may (MAX_ENGINE_CALLS, MAX_REQUEST_AUDIO_S) is refused
with 413 first; segments go through the shared queue one after another. Without streaming each segment is synthesized
whole and the file is sent at the end. With `stream: true` (or any `stream_format`) each segment is
decoded in windows of latent frames (engine/windows.py), and every window leaves as soon as it is
decoded: the first audio of a long sentence waits for a fraction of it, not for all of it. Segments
are joined with a short crossfade either way. `stream_format: "sse"` wraps the encoded chunks in
OpenAI's server-sent events (`speech.audio.delta` with base64 audio, then `speech.audio.done`).

Memory stays bounded by a segment, not by the text: a 50,000-character chapter streams like a
sentence. A client that hangs up cancels what is left: the engine stops at the next window, and later
segments are never queued.

An ``input`` that starts with ``<speak`` is SSML (predictor/ssml.py: breaks, prosody rate, sub,
say-as, p and s): each span is segmented as plain text at its own pace, and a ``<break>`` is exact
silence between crossfaded runs (neither faded into nor shortened). Other text with ``<`` in it stays
plain text.

OpenAI's model and voice names are accepted as aliases (MODEL_ALIASES, VOICE_ALIASES), so clients
written for OpenAI work unchanged.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator

import numpy as np
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from predictor import ssml
from predictor.api.handlers import validation_problems
from predictor.audio import codecs
from predictor.config import Settings
from predictor.engine.base import SEED_LIMIT, SynthesisParams
from predictor.engine.words import TIMESTAMPS, Word, in_seconds
from predictor.errors import BadRequest
from predictor.observability import metrics
from predictor.serving import pipeline
from predictor.serving.offload import off_loop
from predictor.serving.service import TTSService

# OpenAI's documented range for `speed`; our length_scale is its inverse.
SPEED_RANGE = (0.25, 4.0)
STREAM_FORMATS = ("audio", "sse")
SSE_MEDIA_TYPE = "text/event-stream"


class VoiceId(BaseModel):
    """OpenAI's object form of a voice: {"id": "..."}."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str


class SpeechRequest(BaseModel):
    # Strict: the API is typed, so `speed: true` or `stream: "yes"` is a mistake to name, not to coerce
    # (an integer speed is still a number).
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    input: str
    voice: str | VoiceId | None = None
    response_format: str = "mp3"  # OpenAI's default
    speed: float = Field(1.0, ge=SPEED_RANGE[0], le=SPEED_RANGE[1], allow_inf_nan=False)
    stream: bool = False
    stream_format: str | None = None  # OpenAI's: "audio" (raw bytes) or "sse"; either one streams
    # OpenAI's style prompt for its newer models; a VITS voice has nothing it could condition on,
    # so it is accepted (clients send it by habit) and has no effect.
    instructions: str | None = None
    # Ours: "word" adds each word's start and end (seconds) to SSE (a speech.audio.timestamps event
    # before each segment's audio) or to a JSON answer (Accept: application/json).
    timestamps: str | None = None
    # Ours: the noise seed, as v2's parameter seed (engine/noise.py): the same audio every time, and
    # the same as v2, v1 and CloudEvents give for this text and seed.
    seed: int | None = Field(None, ge=0, le=SEED_LIMIT - 1)


JSON_MEDIA_TYPE = "application/json"


def router(service: TTSService, settings: Settings) -> APIRouter:
    routes = APIRouter()

    @routes.post("/v1/audio/speech")
    async def speech(request: Request) -> Response:
        service.require_ready()
        try:
            body = SpeechRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            raise BadRequest(f"invalid speech request: {validation_problems(exc.errors())}") from None
        models = [settings.model_name, *settings.model_aliases, *service.voices]
        if body.model not in models:
            raise BadRequest(f"unknown model {body.model!r}; this server accepts {', '.join(models)}")
        # The cheap checks first: counting characters is C, normalizing and segmenting are Python.
        if len(body.input) > settings.max_stream_text_chars:
            raise BadRequest(
                f"input has {len(body.input)} characters; the limit is MAX_STREAM_TEXT_CHARS={settings.max_stream_text_chars}"
            )
        if not body.input.strip():
            raise BadRequest("input is empty")
        if body.stream_format is not None and body.stream_format not in STREAM_FORMATS:
            raise BadRequest(
                f"unknown stream_format {body.stream_format!r}; accepted: {', '.join(STREAM_FORMATS)}"
            )
        if body.timestamps is not None:
            _check_timestamps(body, request.headers.get("accept", ""))
        fmt = codecs.get_format(body.response_format).name
        voice = _voice(body.voice, service, settings)
        params = SynthesisParams(length_scale=1.0 / body.speed, voice=voice, seed=body.seed)
        service.check_params(params)  # before any byte is sent: a stream cannot turn into a 400 later
        started = time.monotonic()
        segments = await off_loop(
            len(body.input),
            pipeline.prepare,
            body.input,
            params,
            settings.max_segment_chars,
            service.sample_rate,
            ssml.is_ssml(body.input),
        )
        pipeline.check(service, [segments], params, what="input")

        def first_audio() -> None:
            metrics.FIRST_PACKET_SECONDS.observe(time.monotonic() - started)

        words: list[Word] | None = [] if body.timestamps is not None else None
        if not (body.stream or body.stream_format is not None):
            pieces = pipeline.whole(service, segments, settings.crossfade_ms, first_audio, words=words)
            whole = np.concatenate([piece async for piece in pieces])
            work = codecs.encode_us(fmt, len(whole), service.sample_rate)
            encoded = await off_loop(work, codecs.encode, whole, service.sample_rate, fmt)
            if words is None:
                return Response(encoded, media_type=codecs.FORMATS[fmt].media_type)
            answer = {
                "audio": base64.b64encode(encoded).decode("ascii"),
                "format": fmt,
                "sample_rate": codecs.output_sample_rate(codecs.FORMATS[fmt], service.sample_rate),
                "audio_seconds": round(len(whole) / service.sample_rate, 4),
                "words": in_seconds(words, service.sample_rate),
            }
            return Response(orjson.dumps(answer), media_type=JSON_MEDIA_TYPE)
        # Built here, not in the generator: a format that cannot stream is a 400, not a broken stream.
        encoder = codecs.StreamEncoder(fmt, service.sample_rate)
        if words is not None:
            # Timestamps are known per segment once it is synthesized: segments are sent whole.
            timed = pipeline.whole(service, segments, settings.crossfade_ms, first_audio, words=words)
            first = await anext(timed)
            events = _events(_encoded(_prepend(first, timed), encoder), words, service.sample_rate)
            return StreamingResponse(events, media_type=SSE_MEDIA_TYPE, headers={"cache-control": "no-cache"})
        windows = pipeline.windows(service, segments, settings.crossfade_ms, first_audio)
        # The first piece before the first byte: a 400 (nothing to speak) or 503 can still be one.
        first = await anext(windows)
        chunks = _encoded(_prepend(first, windows), encoder)
        if body.stream_format == "sse":
            return StreamingResponse(
                _events(chunks), media_type=SSE_MEDIA_TYPE, headers={"cache-control": "no-cache"}
            )
        return StreamingResponse(chunks, media_type=encoder.media_type)

    return routes


def _voice(voice: str | VoiceId | None, service: TTSService, settings: Settings) -> str | None:
    """The model's voice a request names: one of its own, or an alias ("" = the default voice)."""
    name = voice.id if isinstance(voice, VoiceId) else voice
    if name is None or name in service.voices:
        return name
    if name in settings.voice_aliases:
        return settings.voice_aliases[name] or None
    names = [*service.voices, *settings.voice_aliases]
    raise BadRequest(f"unknown voice {name!r}; this server accepts {', '.join(names)}")


async def _prepend(first: np.ndarray, rest: AsyncIterator[np.ndarray]) -> AsyncIterator[np.ndarray]:
    yield first
    async for piece in rest:
        yield piece


async def _encoded(pieces: AsyncIterator[np.ndarray], encoder: codecs.StreamEncoder) -> AsyncIterator[bytes]:
    head = encoder.header()
    try:
        async for piece in pieces:
            # Off the loop as the whole file's encode is (a window is up to 2 s of audio: milliseconds
            # of mp3 or opus work), on the one request worker, so chunks are encoded in order.
            work = codecs.encode_us(encoder.format, len(piece), encoder.sample_rate)
            chunk = head + await off_loop(work, encoder.encode_chunk, piece)
            head = b""
            if chunk:
                yield chunk
        tail = head + encoder.finish()
    finally:
        encoder.close()
    if tail:
        yield tail


def _check_timestamps(body: SpeechRequest, accept: str) -> None:
    """Timestamps need an answer that can carry them: SSE, or JSON the client asked for."""
    if body.timestamps not in TIMESTAMPS:
        raise BadRequest(f"unknown timestamps {body.timestamps!r}; accepted: {', '.join(TIMESTAMPS)}")
    if body.stream_format == "sse":
        return
    if body.stream or body.stream_format is not None:
        raise BadRequest('timestamps cannot ride on a raw audio stream: use stream_format "sse"')
    if JSON_MEDIA_TYPE not in accept:
        raise BadRequest(
            'timestamps need an answer that can carry them: stream_format "sse", or a JSON answer '
            "(send Accept: application/json)"
        )


def _delta(chunk: bytes) -> bytes:
    return (
        b"data: "
        + orjson.dumps({"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode("ascii")})
        + b"\n\n"
    )


# OpenAI reports token usage; a VITS voice has no tokens to count.
_DONE = (
    b"data: "
    + orjson.dumps(
        {"type": "speech.audio.done", "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}}
    )
    + b"\n\n"
)


async def _events(
    chunks: AsyncIterator[bytes], words: list[Word] | None = None, sample_rate: int = 0
) -> AsyncIterator[bytes]:
    """OpenAI's speech SSE: one speech.audio.delta per encoded chunk, then speech.audio.done. With
    ``words`` (filled by pipeline.whole before it yields each segment, so before that segment's chunk
    is encoded), a speech.audio.timestamps event of the new words goes before the chunk."""
    sent = 0
    async for chunk in chunks:
        if words is not None and len(words) > sent:
            event = {"type": "speech.audio.timestamps", "words": in_seconds(words[sent:], sample_rate)}
            sent = len(words)
            yield b"data: " + orjson.dumps(event) + b"\n\n"
        yield _delta(chunk)
    yield _DONE
