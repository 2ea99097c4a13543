"""Text to crossfaded PCM in segment-sized engine calls: what every transport runs (v2 REST and gRPC,
Triton's ModelStreamInfer, v1, CloudEvents, the speech route), each translating only its wire format.

    text (or SSML) -> normalized segments (and exact silences) -> engine calls through the shared
    queue, whole or by decoder window -> pieces joined with a short crossfade -> the transport

Every segment of every text of a request is known before the first engine call, so a request making
more engine calls or more audio than one request may is refused with 413 first (``check``). A silence
(an SSML ``<break>``) ends one crossfaded run and starts the next: it is exactly its length, neither
faded nor shortened.

A request's segments are numbered through the request, and segment n draws its noise as item n of a
call seeded with the request's seed (engine/noise.py). Whole answers go through the queue in calls of
up to Settings.segments_per_call consecutive segments (sixteen on a GPU, batched; on CPU, twice the
engine's threads, which it runs side by side, or one where it has one thread); streams go window by
window for their first segment and, after it, in such calls no larger than four times what they have
sent (or segment by segment, window by window, where a call carries one). Either way the same text
with the same seed is the same audio on every transport.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from predictor import ssml, text
from predictor.audio import crossfade
from predictor.config import Settings
from predictor.engine import noise
from predictor.engine.base import SynthesisParams
from predictor.engine.words import Word
from predictor.errors import NothingToSpeak
from predictor.serving.limits import check_blank
from predictor.serving.offload import off_loop
from predictor.serving.service import SynthesisResult, TTSService


@dataclass(frozen=True)
class Segment:
    """Text the engine speaks in one call, with the parameters of its span (its seed the segment's own)."""

    text: str
    params: SynthesisParams


@dataclass(frozen=True)
class Silence:
    """An SSML break: exactly this many samples of silence."""

    samples: int


Piece = Segment | Silence


def prepare(
    source: str,
    params: SynthesisParams,
    max_segment_chars: int,
    sample_rate: int,
    markup: bool,
    first: int = 0,
) -> list[Piece]:
    """``source`` normalized and cut into its segments, all of them, numbered from ``first`` (the
    segments of the request's texts before it). ``markup``: ``source`` is SSML (predictor/ssml.py),
    each span's segments at the span's pace and its breaks as silences; a document outside the subset
    is a BadRequest here, before anything is synthesized."""
    if not markup:
        spans: list[ssml.Part] = [ssml.Span(source, 1.0)]
    else:
        spans = ssml.parse(source)
    pieces: list[Piece] = []
    base = params.length_scale
    n = first
    for part in spans:
        if isinstance(part, ssml.Break):
            pieces.append(Silence(round(part.seconds * sample_rate)))
            continue
        # None keeps the voice's own pace: the span's rate then applies to the service's default.
        paced = (
            params
            if part.rate == 1.0
            else dataclasses.replace(params, length_scale=(base or 1.0) / part.rate)
        )
        for s in text.split_segments(text.normalize(part.text), max_segment_chars):
            pieces.append(Segment(s, _item(paced, n)))
            n += 1
    return pieces


def prepare_request(
    service: TTSService, texts: list[str], params: SynthesisParams, markup: bool, settings: Settings
) -> list[list[Piece]]:
    """Every text's pieces, numbered through the request, and checked (``check``) before any engine call."""
    prepared, first = [], 0
    for i, source in enumerate(texts):
        check_blank(i, source)
        pieces = prepare(source, params, settings.max_segment_chars, service.sample_rate, markup, first)
        first += sum(isinstance(p, Segment) for p in pieces)
        prepared.append(pieces)
    check(service, prepared, params)
    return prepared


def check(
    service: TTSService, prepared: list[list[Piece]], params: SynthesisParams, what: str = "text"
) -> None:
    """Refuse, before any engine call, a text with nothing to speak (400, naming ``what``) and a request
    that would make more engine calls or audio than one request may (413): characters count at their
    span's pace, breaks as their length."""
    for i, pieces in enumerate(prepared):
        if not any(isinstance(p, Segment) for p in pieces):
            name = f"{what}[{i}]" if what == "text" or len(prepared) > 1 else what
            raise NothingToSpeak(f"{name} has nothing to speak (no phonemes)")
    spoken = [p for pieces in prepared for p in pieces if isinstance(p, Segment)]
    base = params.length_scale or 1.0
    paced = sum(len(s.text) * (s.params.length_scale or base) / base for s in spoken)
    silence_s = sum(p.samples for ps in prepared for p in ps if isinstance(p, Silence)) / service.sample_rate
    service.check_work(round(paced), len(spoken), params.length_scale, silence_s)


def _item(params: SynthesisParams, n: int) -> SynthesisParams:
    """``params`` for item ``n`` of a call made with them: its seed that item's (engine/noise.py). The
    request's segment n gets the request's params so; segment j after a call's first has its first's
    params so, which is how a call knows its segments are consecutive."""
    if params.seed is None:
        return params
    return dataclasses.replace(params, seed=noise.sentence_seed(params.seed, n, 0))


class _Joined:
    """One text's audio as its pieces arrive: segments crossfaded in runs, breaks as exact silences and,
    with ``words``, each word's start and end in samples of the joined audio (a segment starts where
    the crossfade lays it, its fade-in included)."""

    def __init__(self, sample_rate: int, crossfade_ms: float, words: list[Word] | None):
        self.joiner = crossfade.CrossfadeJoiner(sample_rate, crossfade_ms)
        self.words = words
        self.spoken = False
        # Where the joined audio ends so far (held tail included), and the last segment's length in the
        # current crossfaded run (the joiner holds min(fade, that) to overlap the next segment's head).
        self._end, self._previous = 0, 0

    def silence(self, samples: int) -> np.ndarray:
        self._end, self._previous = self._end + samples, 0
        return np.concatenate([self.joiner.finish(), np.zeros(samples, dtype=np.float32)])

    def segment(self, audio: np.ndarray, said: list[Word] | None) -> np.ndarray:
        n = len(audio)
        start = self._end - min(self.joiner.fade_samples, self._previous, n)
        self._end, self._previous = start + n, n
        if self.words is not None and said is not None:
            self.words += [Word(w.word, start + w.start, start + w.end) for w in said]
        self.spoken = True
        return self.joiner.push(audio)

    def unspoken(self, segment: str) -> None:
        """A segment the engine read as nothing: its words are zero-length points where it stands, as
        a word espeak-ng does not speak is within a segment (engine/words.py)."""
        if self.words is not None:
            self.words += [Word(w, self._end, self._end) for w in segment.split()]

    def take(self, spoken: _Spoken) -> np.ndarray | None:
        """One piece of this text: the audio that is final now (None for a segment read as nothing)."""
        if isinstance(spoken.piece, Silence):
            return self.silence(spoken.piece.samples)
        if spoken.audio is None:
            self.unspoken(spoken.piece.text)
            return None
        return self.segment(spoken.audio, spoken.words)

    def finish(self) -> np.ndarray:
        return self.joiner.finish()


@dataclass(frozen=True)
class _Spoken:
    """A piece of the request with its audio: None for a silence or a segment the engine read as nothing."""

    text: int  # which of the request's texts it belongs to
    piece: Piece
    audio: np.ndarray | None
    words: list[Word] | None
    engine_seconds: float  # of the call that made it, counted once: on the call's first segment


async def _spoken(
    service: TTSService, pieces: list[tuple[int, Piece]], aligned: bool
) -> AsyncIterator[_Spoken]:
    """Each piece in order with its audio: segments through the shared queue in calls of up to
    Settings.segments_per_call consecutive ones of the same span (a call's item j is its first segment
    + j, so its noise is the segment's own), breaks as they are. A segment espeak-ng reads as nothing (a lone
    symbol it skips) comes back as nothing, not as an error: ``check`` has made sure the request has
    something to speak, and a text that ends up with nothing is the caller's 400."""
    limit = service.settings.segments_per_call()
    plain = [p for _, p in pieces]
    i, following = 0, False
    while i < len(pieces):
        t, piece = pieces[i]
        if isinstance(piece, Silence) or not text.has_pronounceable(piece.text):
            yield _Spoken(t, piece, None, None, 0.0)
            i += 1
            continue
        group = pieces[i : i + _group_size(plain, i, limit)]
        i += len(group)
        texts = [s.text for _, s in group if isinstance(s, Segment)]
        said: list[list[Word]] | list[None]
        # The request's later calls are not refused or dropped once its first has run (Batcher.submit).
        if aligned:
            result, said = await service.synthesize_aligned(
                texts, piece.params, partial=True, following=following
            )
        else:
            result, said = (
                await service.synthesize(texts, piece.params, partial=True, following=following),
                [None] * len(texts),
            )
        following = True
        for j, ((owner, segment), audio, words) in enumerate(zip(group, result.audio, said, strict=True)):
            seconds = result.engine_seconds if j == 0 else 0.0
            yield _Spoken(owner, segment, audio if len(audio) else None, words, seconds)


def _group_size(pieces: Sequence[Piece], i: int, limit: int, max_chars: int | None = None) -> int:
    """How many pieces from pieces[i] (a segment with something to speak) go to the engine as one call:
    consecutive segments with something to speak, each item j of the call the first's + j (``_item``),
    at most ``limit``, and past the first at most ``max_chars`` characters in all."""
    first = pieces[i]
    assert isinstance(first, Segment)
    size, chars = 1, len(first.text)
    while size < limit and i + size < len(pieces):
        after = pieces[i + size]
        if not (
            isinstance(after, Segment)
            and text.has_pronounceable(after.text)
            and after.params == _item(first.params, size)
        ):
            break
        if max_chars is not None and chars + len(after.text) > max_chars:
            break
        size, chars = size + 1, chars + len(after.text)
    return size


async def whole(
    service: TTSService,
    pieces: list[Piece],
    crossfade_ms: float,
    on_first: Callable[[], None] | None = None,
    words: list[Word] | None = None,
) -> AsyncIterator[np.ndarray]:
    """One text's crossfaded PCM, a piece per segment synthesized whole (the last piece holds the
    tail); ``on_first`` is called when the first audio is ready. ``words``: each segment's words are
    appended, in samples of the joined audio, before its piece is yielded (engine/words.py)."""
    joined = _Joined(service.sample_rate, crossfade_ms, words)
    async for spoken in _spoken(service, [(0, p) for p in pieces], aligned=words is not None):
        first = not joined.spoken
        audio = joined.take(spoken)
        if audio is None:
            continue
        if first and joined.spoken and on_first is not None:
            on_first()
        yield audio
    if not joined.spoken:
        raise NothingToSpeak("input has nothing to speak (no phonemes)")
    yield joined.finish()


# A stream's later segments go to the engine in calls of up to Settings.segments_per_call (several
# sentences side by side on CPU lanes, a batch on a GPU) of at most this many times the characters
# whose audio it has already sent: a call's work is then a small part of the audio still to play
# (about 2.5 ms of two CPUs a character, 10 ms for each character sent, whose speech lasts about
# 60 ms), so the next audio comes before the last runs out. Decoding them one at a time instead,
# window by window, made a three- or ten-sentence stream take 1.12-1.17x its whole answer once the
# whole answer ran on lanes (bench streaming; docs/benchmarks.md, "Lanes").
STREAM_GROUP_CHARS_PER_SENT = 4


async def windows(
    service: TTSService, pieces: list[Piece], crossfade_ms: float, on_first: Callable[[], None] | None = None
) -> AsyncIterator[np.ndarray]:
    """One text's crossfaded PCM: the first segment a piece per decoder window as it is decoded, the
    later ones a piece per segment as their calls end (one at a time, window by window, where
    Settings.segments_per_call is one); the last piece holds the tail."""
    joiner = crossfade.CrossfadeJoiner(service.sample_rate, crossfade_ms)
    first, following = True, False
    limit = service.settings.segments_per_call()
    sent = 0  # characters of the segments whose audio has been handed on
    i = 0
    while i < len(pieces):
        piece = pieces[i]
        if isinstance(piece, Silence):
            yield np.concatenate([joiner.finish(), np.zeros(piece.samples, dtype=np.float32)])
            i += 1
            continue
        if not text.has_pronounceable(piece.text):
            i += 1
            continue
        if following and limit > 1:
            size = _group_size(pieces, i, limit, STREAM_GROUP_CHARS_PER_SENT * sent)
            group = [p for p in pieces[i : i + size] if isinstance(p, Segment)]
            result = await service.synthesize(
                [s.text for s in group], piece.params, partial=True, following=True
            )
            for audio in result.audio:
                if not len(audio):  # read as nothing, as a whole answer skips it
                    continue
                out = joiner.push_piece(audio, True)
                if first and len(out):
                    if on_first is not None:
                        on_first()
                    first = False
                yield out
            sent += sum(len(s.text) for s in group)
            i += size
            continue
        starts_segment = True
        async for audio, _last in service.stream(piece.text, piece.params, following=following):
            following = True
            out = joiner.push_piece(audio, starts_segment)
            starts_segment = False
            if first and len(out):
                if on_first is not None:
                    on_first()
                first = False
            yield out
        sent += len(piece.text)
        i += 1
    yield joiner.finish()


async def synthesize(
    service: TTSService,
    texts: list[str],
    params: SynthesisParams,
    markup: bool,
    settings: Settings,
    timestamps: bool = False,
) -> SynthesisResult:
    """What v2 (REST, gRPC), v1 and CloudEvents answer: each text's audio, made as the speech route
    makes a whole answer (``markup``: the texts are SSML documents), all checked before the first engine
    call; ``timestamps``: with each text's words too."""
    prepared = await off_loop(sum(map(len, texts)), prepare_request, service, texts, params, markup, settings)
    return await synthesize_prepared(service, prepared, settings.crossfade_ms, timestamps)


async def synthesize_prepared(
    service: TTSService, prepared: list[list[Piece]], crossfade_ms: float, timestamps: bool = False
) -> SynthesisResult:
    """The audio of texts already prepared and checked (prepare_request), in one pass over their pieces."""
    joined = [_Joined(service.sample_rate, crossfade_ms, [] if timestamps else None) for _ in prepared]
    parts: list[list[np.ndarray]] = [[] for _ in prepared]
    spent = 0.0
    flat = [(t, p) for t, pieces in enumerate(prepared) for p in pieces]
    async for spoken in _spoken(service, flat, aligned=timestamps):
        spent += spoken.engine_seconds
        audio = joined[spoken.text].take(spoken)
        if audio is not None:
            parts[spoken.text].append(audio)
    for i, into in enumerate(joined):
        if not into.spoken:
            raise NothingToSpeak(f"text[{i}] has nothing to speak (no phonemes)")
        parts[i].append(into.finish())
    return SynthesisResult(
        audio=[np.concatenate(p) for p in parts],
        sample_rate=service.sample_rate,
        engine_seconds=spent,
        words=[j.words or [] for j in joined] if timestamps else None,
    )
