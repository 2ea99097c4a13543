"""`POST /v1/audio/speech`, shaped like OpenAI's speech API, streaming audio as sentences finish.

The input is normalized and cut into segments of at most MAX_SEGMENT_CHARS (sentences, then clauses);
segments go through the shared queue one after another, each joined to the previous with a short
crossfade and encoded as soon as it is ready. Memory stays bounded by a segment, not by the text:
a 50,000-character chapter streams like a sentence. A client that hangs up cancels what is left
(its queued segment is skipped by the batcher, later ones are never queued).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from predictor import text
from predictor.audio import codecs, crossfade
from predictor.config import Settings
from predictor.engine.base import SynthesisParams
from predictor.errors import BadRequest, NothingToSpeak
from predictor.observability import metrics
from predictor.serving.service import TTSService

# OpenAI's documented range for `speed`; our length_scale is its inverse.
SPEED_RANGE = (0.25, 4.0)


class SpeechRequest(BaseModel):
    # Strict: the API is typed, so `speed: true` or `stream: "yes"` is a mistake to name, not to coerce
    # (an integer speed is still a number).
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    input: str
    voice: str | None = None
    response_format: str = "mp3"  # OpenAI's default
    speed: float = Field(1.0, ge=SPEED_RANGE[0], le=SPEED_RANGE[1])
    stream: bool = False


def router(service: TTSService, settings: Settings) -> APIRouter:
    routes = APIRouter()

    @routes.post("/v1/audio/speech")
    async def speech(request: Request) -> Response:
        service.require_ready()
        try:
            body = SpeechRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:5]
            )
            raise BadRequest(f"invalid speech request: {problems}") from None
        if body.model not in (settings.model_name, *service.voices):
            raise BadRequest(f"unknown model {body.model!r}; this server serves {settings.model_name!r}")
        if not body.input.strip():
            raise BadRequest("input is empty")
        source = text.normalize(body.input)
        if not text.has_pronounceable(source):
            raise NothingToSpeak("input has nothing to speak (no phonemes)")
        if len(body.input) > settings.max_stream_text_chars:
            raise BadRequest(
                f"input has {len(body.input)} characters; the limit is MAX_STREAM_TEXT_CHARS={settings.max_stream_text_chars}"
            )
        fmt = codecs.get_format(body.response_format).name
        params = SynthesisParams(length_scale=1.0 / body.speed, voice=body.voice)
        service.check_params(params)  # before any byte is sent: a stream cannot turn into a 400 later
        pieces = _speech(service, source, params, settings, time.monotonic())
        if body.stream:
            # The first piece before the first byte: a 400 (nothing to speak) or 503 can still be one.
            first = await anext(pieces)
            return StreamingResponse(
                _encoded(_prepend(first, pieces), fmt, service.sample_rate),
                media_type=codecs.FORMATS[fmt].media_type,
            )
        whole = [piece async for piece in pieces]
        return Response(
            codecs.encode(np.concatenate(whole), service.sample_rate, fmt),
            media_type=codecs.FORMATS[fmt].media_type,
        )

    return routes


async def _speech(
    service: TTSService, source: str, params: SynthesisParams, settings: Settings, started: float
) -> AsyncIterator[np.ndarray]:
    """Crossfaded PCM, one piece per segment as it is synthesized (the last piece holds the tail)."""
    joiner = crossfade.CrossfadeJoiner(service.sample_rate, settings.crossfade_ms)
    first = True
    for segment in text.iter_segments(source, settings.max_segment_chars):
        try:
            result = await service.synthesize([segment], params)
        except NothingToSpeak:
            # A segment espeak-ng reads as nothing (a lone symbol it skips) is silence, not an error,
            # unless the whole input is: then the first piece below raises before any byte is sent.
            continue
        piece = joiner.push(result.audio[0])
        if first:
            metrics.FIRST_PACKET_SECONDS.observe(time.monotonic() - started)
            first = False
        yield piece
    if first:
        raise NothingToSpeak("input has nothing to speak (no phonemes)")
    yield joiner.finish()


async def _prepend(first: np.ndarray, rest: AsyncIterator[np.ndarray]) -> AsyncIterator[np.ndarray]:
    yield first
    async for piece in rest:
        yield piece


async def _encoded(pieces: AsyncIterator[np.ndarray], fmt: str, sample_rate: int) -> AsyncIterator[bytes]:
    encoder = codecs.StreamEncoder(fmt, sample_rate)
    head = encoder.header()
    async for piece in pieces:
        chunk = head + encoder.encode_chunk(piece)
        head = b""
        if chunk:
            yield chunk
    tail = head + encoder.finish()
    if tail:
        yield tail
