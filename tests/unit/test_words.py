"""Word timestamps from phoneme durations (engine/words.py): the spans of phoneme words and how written
words share them, on hand-made id sequences."""

from __future__ import annotations

import numpy as np

from predictor.engine.words import Sentence, _groups, _phoneme_words

# Piper's layout: BOS, pad, then each phoneme followed by a pad, then EOS.
ID_MAP = {"^": [1], "$": [2], "_": [0], " ": [3], ",": [4], ".": [5], "a": [10], "b": [11], "c": [12]}
HOP = 256


def _sentence(phonemes: str, frames: list[int]) -> Sentence:
    ids = [1, 0]
    for p in phonemes:
        ids += [ID_MAP[p][0], 0]
    ids.append(2)
    assert len(frames) == len(ids)
    return Sentence(ids, np.asarray(frames, dtype=np.int64))


def test_a_phoneme_word_runs_from_its_first_phoneme_to_the_pad_after_its_last():
    # ^ _ a _ b _ ␣ _ c _ . _ $
    sentence = _sentence("ab c.", [1, 2, 3, 1, 4, 1, 5, 2, 6, 1, 7, 1, 3])

    spans = _phoneme_words([sentence], HOP, ID_MAP)

    assert spans == [(3 * HOP, 12 * HOP), (19 * HOP, 26 * HOP)]


def test_phoneme_words_of_later_sentences_start_after_the_earlier_sentences_audio():
    first = _sentence("a", [2, 0, 3, 1, 2])
    second = _sentence("b", [1, 1, 4, 2, 1])

    spans = _phoneme_words([first, second], HOP, ID_MAP)

    assert spans == [(2 * HOP, 6 * HOP), ((8 + 2) * HOP, (8 + 8) * HOP)]


def test_written_words_take_their_own_counts_when_they_add_up():
    assert _groups([1, 2, 0, 1], 4) == [(0, 1), (1, 3), (3, 3), (3, 4)]


def test_written_words_share_in_proportion_when_the_counts_do_not_add_up():
    groups = _groups([1, 1, 2], 8)

    assert groups[0][0] == 0 and groups[-1][1] == 8
    assert all(a <= b for a, b in groups)
    assert all(groups[i][1] == groups[i + 1][0] for i in range(len(groups) - 1))
