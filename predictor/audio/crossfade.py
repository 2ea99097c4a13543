"""Joining synthesized segments without clicks: each segment's end overlaps the next one's start, and
audio is emitted as soon as it is final, so a long text streams instead of waiting for its whole audio."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

_MS_PER_SECOND = 1000.0


def _fade_in(length: int) -> np.ndarray:
    """Raised-cosine gain rising from ~0 to ~1; ``1 - _fade_in(n)`` is the matching fade-out.

    The two gains sum to exactly 1 at every sample (unlike equal-power's, whose squares do). For
    correlated material, which is what a join of one voice usually is (the same stationary signal on
    both sides, or near-silence at the ends VITS produces), summing to 1 keeps the level constant, where
    equal-power would bump it by up to 3 dB mid-join. The cosine shape, unlike a linear ramp, starts and
    ends with zero slope, so the gain itself introduces no corner. Sampling at (i + 0.5) / n keeps the
    curve symmetric and spends no sample on a gain of exactly 0 or 1.
    """
    phase = (np.arange(length, dtype=np.float64) + 0.5) / length
    return (0.5 - 0.5 * np.cos(np.pi * phase)).astype(np.float32)


class CrossfadeJoiner:
    """Joins synthesized segments as they arrive, overlapping each join with a raised-cosine crossfade.

    ``push`` returns the audio that is final now: everything except the last ``fade`` samples, held back
    to overlap the head of the next segment. ``finish`` returns what is held. Concatenating every
    ``push`` result and the ``finish`` result gives exactly ``join(segments)``.

    Each join overlaps ``min(fade, held, len(segment))`` samples, ``held`` being ``min(fade, audio so
    far)``: a segment shorter than the fade shortens its fades rather than failing. So the total length
    is ``sum(len(s)) - (n - 1) * fade`` when every segment is at least ``fade`` samples long.
    """

    def __init__(self, sample_rate: int, fade_ms: float = 50.0):
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        if fade_ms < 0:
            raise ValueError(f"fade_ms must not be negative, got {fade_ms}")
        self.sample_rate = sample_rate
        self.fade_samples = round(sample_rate * fade_ms / _MS_PER_SECOND)
        self._held: np.ndarray | None = None
        # push_piece: the start of the current segment, waiting until it can cover the held tail.
        self._head: np.ndarray | None = None

    def push(self, segment: np.ndarray) -> np.ndarray:
        """Add the next segment (mono float audio); return the audio that can be emitted now."""
        audio = _as_mono_float32(segment)
        if self._held is None:
            stream = audio
            ready = np.empty(0, dtype=np.float32)
        else:
            overlap = min(len(self._held), len(audio))
            kept = len(self._held) - overlap
            ready = self._held[:kept]
            gain_in = _fade_in(overlap)
            mixed = self._held[kept:] * (np.float32(1.0) - gain_in) + audio[:overlap] * gain_in
            stream = np.concatenate([mixed, audio[overlap:]])
        split = max(0, len(stream) - self.fade_samples)
        # Copies: the caller may reuse its buffer, and the held tail must outlive this call.
        self._held = stream[split:].copy()
        return np.concatenate([ready, stream[:split]]).astype(np.float32, copy=True)

    def push_piece(self, piece: np.ndarray, starts_segment: bool) -> np.ndarray:
        """Add a piece of a segment (a decoder window); return the audio that can be emitted now.

        Pieces of one segment follow each other without a fade; a piece that starts a segment is
        crossfaded with the previous segment's end, as push would with whole segments. Concatenating
        every result and finish() gives exactly join() of the segments the pieces make up. The head
        of a segment is held back until it is as long as the fade (or its segment ends), since the
        overlap is min(fade, held, segment).
        """
        audio = _as_mono_float32(piece)
        ready = self._mix_head() if starts_segment else np.empty(0, dtype=np.float32)
        if starts_segment and self._held is not None:
            self._head = audio.copy()
        elif self._head is not None:
            self._head = np.concatenate([self._head, audio])
        else:
            return np.concatenate([ready, self._extend(audio)])
        if self._held is not None and len(self._head) >= len(self._held):
            ready = np.concatenate([ready, self._mix_head()])
        return ready

    def _extend(self, audio: np.ndarray) -> np.ndarray:
        """Continue the current segment with `audio`: all but the last fade samples are final."""
        stream = audio if self._held is None else np.concatenate([self._held, audio])
        split = max(0, len(stream) - self.fade_samples)
        self._held = stream[split:].copy()
        return stream[:split].astype(np.float32, copy=True)

    def _mix_head(self) -> np.ndarray:
        """Crossfade the waiting segment head into the held tail (as push does); what is final."""
        head, self._head = self._head, None
        if head is None:
            return np.empty(0, dtype=np.float32)
        return self.push(head)

    def finish(self) -> np.ndarray:
        """Return the held tail, ending this stream; the joiner can then start a new one."""
        ready = self._mix_head()
        held = self._held if self._held is not None else np.empty(0, dtype=np.float32)
        self._held = None
        return np.concatenate([ready, held])


def join(segments: Iterable[np.ndarray], sample_rate: int, fade_ms: float = 50.0) -> np.ndarray:
    """All ``segments`` crossfaded into one array (see ``CrossfadeJoiner`` for the overlap and length)."""
    joiner = CrossfadeJoiner(sample_rate, fade_ms)
    parts = [joiner.push(segment) for segment in segments]
    parts.append(joiner.finish())
    return np.concatenate(parts)


def _as_mono_float32(segment: np.ndarray) -> np.ndarray:
    audio = np.asarray(segment, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"expected mono 1-D audio, got shape {audio.shape}")
    return audio
