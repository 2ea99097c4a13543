"""Word timestamps from the model's own durations: when each word of a text, as written, is spoken.

The engine says how many frames each phoneme id lasted (engine/base.Sentence); espeak-ng's phonemes
separate words with a space. So the phoneme words of a text, and their times, follow from the ids
alone: a phoneme word runs from its first phoneme's first frame to its last phoneme's last frame
(pauses at spaces and punctuation belong to no word).

Written words (the text split at whitespace, punctuation and numbers as written) are matched to
phoneme words by phonemizing each written word alone: "42" is two phoneme words ("forty two"),
"Dr." one. Where those counts add up to the sentence's (they nearly always do), each written word
gets exactly its phoneme words; where espeak-ng reads a word differently in context, the written
words share the phoneme words in proportion to their counts. Either way every written word appears
once, in order, with start <= end, inside the audio; a word espeak-ng does not speak (a lone "-")
is a zero-length point where it stands.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from predictor.engine import phonemes

# Phonemes that are pauses, not sounds of a word: espeak-ng's word separator and punctuation.
_PAUSES = phonemes.WORD_BREAKS
_MARKERS = ("^", "$", "_")  # BOS, EOS and the pad Piper puts between phonemes


@dataclass(frozen=True)
class Sentence:
    """One sentence as the model spoke it: its phoneme ids (BOS, pads and EOS included) and the ceiled
    frames each lasted; ``frames.sum() * hop_length`` is the sentence's audio, to the sample."""

    ids: list[int]
    frames: np.ndarray  # [T] int64


@dataclass(frozen=True)
class Word:
    word: str
    start: int  # samples into the text's audio
    end: int


# The kinds of timestamps a request may ask for, on every transport.
TIMESTAMPS = ("word",)


def in_seconds(words: Sequence[Word], sample_rate: int) -> list[dict[str, object]]:
    """Words with their start and end in seconds (to 0.1 ms), as every transport answers them."""
    return [
        {"word": w.word, "start": round(w.start / sample_rate, 4), "end": round(w.end / sample_rate, 4)}
        for w in words
    ]


def words(
    text: str,
    sentences: Sequence[Sentence],
    hop_length: int,
    espeak_voice: str,
    id_map: Mapping[str, Sequence[int]],
) -> list[Word]:
    """The written words of ``text`` with the samples at which each starts and ends in its audio
    (the concatenated sentences, as the engine returns them)."""
    spans = _phoneme_words(sentences, hop_length, id_map)
    written = text.split()
    counts = [phonemes.word_count(w, espeak_voice) for w in written]
    groups = _groups(counts, len(spans))
    out = []
    at = 0
    for word, (first, last) in zip(written, groups, strict=True):
        if first < last:
            start, end = spans[first][0], spans[last - 1][1]
        else:
            start = end = at  # nothing of it is spoken: a point where it stands
        out.append(Word(word, start, end))
        at = end
    return out


def _phoneme_words(
    sentences: Sequence[Sentence], hop_length: int, id_map: Mapping[str, Sequence[int]]
) -> list[tuple[int, int]]:
    """(start, end) samples of every phoneme word, in order, across the sentences."""
    pause_ids = {i for p in _PAUSES if p in id_map for i in id_map[p]}
    marker_ids = {i for m in _MARKERS if m in id_map for i in id_map[m]}
    spans: list[tuple[int, int]] = []
    offset = 0
    for sentence in sentences:
        start: int | None = None
        end = 0
        position = offset
        for token, frames in zip(sentence.ids, sentence.frames.tolist(), strict=True):
            length = int(frames) * hop_length
            if token in pause_ids:
                if start is not None:
                    spans.append((start, end))
                    start = None
            elif token not in marker_ids:
                if start is None:
                    start = position
                end = position + length
            elif start is not None and token in id_map.get("_", ()):
                end = position + length  # the pad after a word's phoneme is still that phoneme
            position += length
        if start is not None:
            spans.append((start, end))
        offset = position
    return spans


def _groups(counts: list[int], available: int) -> list[tuple[int, int]]:
    """[first, last) phoneme words of each written word: its own count where the counts add up to
    what was spoken, else in proportion to the counts."""
    total = sum(counts)
    if total == available:
        bounds = [0]
        for c in counts:
            bounds.append(bounds[-1] + c)
    else:
        cumulative = [0]
        for c in counts:
            cumulative.append(cumulative[-1] + c)
        scale = available / total if total else 0.0
        bounds = [round(c * scale) for c in cumulative]
        bounds[-1] = available
    return [(bounds[i], bounds[i + 1]) for i in range(len(counts))]
