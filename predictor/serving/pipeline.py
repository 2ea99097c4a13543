"""Text to crossfaded PCM in segment-sized engine calls: what the speech route runs for every input, and
the v2 routes (REST, gRPC) and CloudEvents run for SSML.

    text (or SSML) -> normalized segments (and exact silences) -> engine calls through the shared
    queue, whole or by decoder window -> pieces joined with a short crossfade -> the transport

Every segment is known before the first engine call, so a request making more engine calls or more
audio than one request may is refused with 413 first (``check``). A silence (an SSML ``<break>``)
ends one crossfaded run and starts the next: it is exactly its length, neither faded nor shortened.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from predictor import ssml, text
from predictor.audio import crossfade
from predictor.config import Settings
from predictor.engine.base import SynthesisParams
from predictor.engine.words import Word
from predictor.errors import NothingToSpeak
from predictor.serving.service import SynthesisResult, TTSService


@dataclass(frozen=True)
class Segment:
    """Text the engine speaks in one call, with the parameters of its span."""

    text: str
    params: SynthesisParams


@dataclass(frozen=True)
class Silence:
    """An SSML break: exactly this many samples of silence."""

    samples: int


Piece = Segment | Silence


def prepare(
    source: str, params: SynthesisParams, max_segment_chars: int, sample_rate: int, markup: bool
) -> list[Piece]:
    """``source`` normalized and cut into its segments, all of them. ``markup``: ``source`` is SSML
    (predictor/ssml.py), each span's segments at the span's pace and its breaks as silences; a
    document outside the subset is a BadRequest here, before anything is synthesized."""
    if not markup:
        return [Segment(s, params) for s in text.split_segments(text.normalize(source), max_segment_chars)]
    pieces: list[Piece] = []
    base = params.length_scale
    for part in ssml.parse(source):
        if isinstance(part, ssml.Break):
            pieces.append(Silence(round(part.seconds * sample_rate)))
            continue
        # None keeps the voice's own pace: the span's rate then applies to the service's default.
        paced = (
            params
            if part.rate == 1.0
            else dataclasses.replace(params, length_scale=(base or 1.0) / part.rate)
        )
        pieces += [
            Segment(s, paced) for s in text.split_segments(text.normalize(part.text), max_segment_chars)
        ]
    return pieces


def check(service: TTSService, pieces: list[Piece], params: SynthesisParams) -> None:
    """Refuse, before any engine call, what has nothing to speak (400) or would make more engine calls
    or audio than one request may (413): characters count at their span's pace, breaks as their length."""
    spoken = [p for p in pieces if isinstance(p, Segment)]
    if not spoken:
        raise NothingToSpeak("input has nothing to speak (no phonemes)")
    base = params.length_scale or 1.0
    paced = sum(len(s.text) * (s.params.length_scale or base) / base for s in spoken)
    silence_s = sum(p.samples for p in pieces if isinstance(p, Silence)) / service.sample_rate
    service.check_work(round(paced), len(spoken), params.length_scale, silence_s)


async def whole(
    service: TTSService,
    pieces: list[Piece],
    crossfade_ms: float,
    on_first: Callable[[], None] | None = None,
    spent: list[float] | None = None,
    words: list[Word] | None = None,
) -> AsyncIterator[np.ndarray]:
    """Crossfaded PCM, one piece per segment synthesized whole (the last piece holds the tail);
    ``on_first`` is called when the first audio is ready, ``spent`` gets each call's engine seconds.
    ``words``: each segment's words are appended, in samples of the joined audio, before its piece
    is yielded (engine/words.py; a segment starts where the crossfade lays it, its fade-in included)."""
    joiner = crossfade.CrossfadeJoiner(service.sample_rate, crossfade_ms)
    first = True
    # Where the joined audio ends so far (held tail included), and the last segment's length in the
    # current crossfaded run (the joiner holds min(fade, that) to overlap the next segment's head).
    end, previous = 0, 0
    for piece in pieces:
        if isinstance(piece, Silence):
            end, previous = end + piece.samples, 0
            yield np.concatenate([joiner.finish(), np.zeros(piece.samples, dtype=np.float32)])
            continue
        try:
            if words is None:
                result = await service.synthesize([piece.text], piece.params)
            else:
                result, said = await service.synthesize_aligned(piece.text, piece.params)
        except NothingToSpeak:
            # A segment espeak-ng reads as nothing (a lone symbol it skips) is silence, not an error,
            # unless the whole input is: then the first piece below raises before any byte is sent.
            continue
        if spent is not None:
            spent.append(result.engine_seconds)
        n = len(result.audio[0])
        start = end - min(joiner.fade_samples, previous, n)
        end, previous = start + n, n
        if words is not None:
            words += [Word(w.word, start + w.start, start + w.end) for w in said]
        audio = joiner.push(result.audio[0])
        if first and on_first is not None:
            on_first()
        first = False
        yield audio
    if first:
        raise NothingToSpeak("input has nothing to speak (no phonemes)")
    yield joiner.finish()


async def windows(
    service: TTSService, pieces: list[Piece], crossfade_ms: float, on_first: Callable[[], None] | None = None
) -> AsyncIterator[np.ndarray]:
    """Crossfaded PCM, one piece per decoder window as it is decoded (the last piece holds the tail)."""
    joiner = crossfade.CrossfadeJoiner(service.sample_rate, crossfade_ms)
    first = True
    for piece in pieces:
        if isinstance(piece, Silence):
            yield np.concatenate([joiner.finish(), np.zeros(piece.samples, dtype=np.float32)])
            continue
        starts_segment = True
        async for audio, _last in service.stream(piece.text, piece.params):
            out = joiner.push_piece(audio, starts_segment)
            starts_segment = False
            if first and len(out):
                if on_first is not None:
                    on_first()
                first = False
            yield out
    yield joiner.finish()


async def synthesize(
    service: TTSService, texts: list[str], params: SynthesisParams, markup: bool, settings: Settings
) -> SynthesisResult:
    """What v2 (REST, gRPC) and CloudEvents answer: the engine's audio of each text in one call (its
    sentences batched), or, for SSML documents, each made as the speech route makes its audio."""
    if not markup:
        return await service.synthesize(texts, params)
    return await synthesize_markup(service, texts, params, settings.max_segment_chars, settings.crossfade_ms)


async def synthesize_markup(
    service: TTSService,
    documents: list[str],
    params: SynthesisParams,
    max_segment_chars: int,
    crossfade_ms: float,
) -> SynthesisResult:
    """The audio of each SSML document, as the speech route makes it: every document is parsed and
    checked before the first engine call."""
    prepared = [prepare(d, params, max_segment_chars, service.sample_rate, markup=True) for d in documents]
    for pieces in prepared:
        check(service, pieces, params)
    spent: list[float] = []
    audio = [
        np.concatenate([a async for a in whole(service, p, crossfade_ms, spent=spent)]) for p in prepared
    ]
    return SynthesisResult(audio=audio, sample_rate=service.sample_rate, engine_seconds=sum(spent))
