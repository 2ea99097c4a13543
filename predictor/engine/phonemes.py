"""Text -> phoneme ids, through the voice's espeak-ng voice and phoneme id map.

espeak-ng (as bundled by piper-tts) keeps global state (the current voice), so every call holds one
process-wide lock. Sentences are returned separately: engines synthesize them one by one or as a batch.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence

from piper.phoneme_ids import phonemes_to_ids
from piper.phonemize_espeak import EspeakPhonemizer

_lock = threading.Lock()
# What separates words in espeak-ng's phonemes: the space, and punctuation, which it keeps as written.
WORD_BREAKS = frozenset(" ,.;:!?¡¿—…()\"'-")
_phonemizer: EspeakPhonemizer | None = None


def _espeak() -> EspeakPhonemizer:
    global _phonemizer
    if _phonemizer is None:
        _phonemizer = EspeakPhonemizer()
    return _phonemizer


def prepare() -> None:
    """Load espeak-ng's data now, so the first request does not pay for it."""
    with _lock:
        _espeak()


def sentence_ids(text: str, espeak_voice: str, id_map: Mapping[str, Sequence[int]]) -> list[list[int]]:
    """Phoneme ids per sentence, with BOS/EOS and the pad between phonemes as the voice was trained."""
    with _lock:
        sentences = _espeak().phonemize(espeak_voice, text)
    return [phonemes_to_ids(phonemes, id_map) for phonemes in sentences if phonemes]


@functools.lru_cache(maxsize=16384)
def word_count(word: str, espeak_voice: str) -> int:
    """How many phoneme words espeak-ng makes of ``word`` alone ("42": forty two, 2; "-": 0), for
    engine/words.py; cached, as words repeat."""
    with _lock:
        sentences = _espeak().phonemize(espeak_voice, word)
    count = 0
    for sentence in sentences:
        in_word = False
        for phoneme in sentence:
            if phoneme in WORD_BREAKS:
                in_word = False
            elif not in_word:
                count += 1
                in_word = True
    return count
