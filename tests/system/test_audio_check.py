"""The audio check the protocol, speech, event and CLI tests use (testing/audio.py) can fail:
white noise of the same length and level, and another sentence, do not pass as the expected speech."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.audio import codecs
from testing.audio import NotTheSpeech, check_encoded, check_samples

SENTENCE = "The quick brown fox jumps over the lazy dog."
OTHER = "A different sentence is spoken here, quite unlike it."
FORMATS = ["wav", "pcm", "flac", "mp3", "opus"]


@pytest.fixture(scope="module")
def expected(reference) -> np.ndarray:
    return reference.speak(SENTENCE)


def white_noise_like(audio: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(12)
    return (rng.standard_normal(len(audio)) * audio.std()).astype(np.float32)


def same_length(audio: np.ndarray, length: int) -> np.ndarray:
    return audio[:length] if len(audio) >= length else np.pad(audio, (0, length - len(audio)))


def test_the_engines_own_audio_passes_in_every_format(expected):
    match = check_samples(expected.copy(), expected)

    assert match.max_error == 0 and match.correlation > 0.999999
    for fmt in FORMATS:
        check_encoded(codecs.encode(expected, 22050, fmt), fmt, expected, 22050)


def test_white_noise_of_the_same_length_and_level_fails(expected):
    noise = white_noise_like(expected)

    with pytest.raises(NotTheSpeech, match="error"):
        check_samples(noise, expected)
    for fmt in FORMATS:
        with pytest.raises(NotTheSpeech):
            check_encoded(codecs.encode(noise, 22050, fmt), fmt, expected, 22050)


def test_another_sentence_fails_even_cut_to_the_same_length(reference, expected):
    other = reference.speak(OTHER)
    trimmed = same_length(other, len(expected))

    with pytest.raises(NotTheSpeech, match="samples served"):
        check_samples(other, expected)
    with pytest.raises(NotTheSpeech, match="correlation"):
        check_samples(trimmed, expected)
    for fmt in FORMATS:
        with pytest.raises(NotTheSpeech):
            check_encoded(codecs.encode(trimmed, 22050, fmt), fmt, expected, 22050)


def test_a_lossy_file_half_a_second_short_fails_on_length(expected):
    short = expected[: len(expected) - 11025]

    with pytest.raises(NotTheSpeech, match="s expected"):
        check_encoded(codecs.encode(short, 22050, "mp3"), "mp3", expected, 22050)


def test_faint_noise_within_the_error_bound_fails_on_correlation(expected):
    # Expected audio so quiet that noise stays within the error bound: a bound on error alone would pass.
    faint = expected * np.float32(5e-4 / float(np.abs(expected).max()))
    noise = white_noise_like(faint)

    assert float(np.abs(noise - faint).max()) < 1e-3
    with pytest.raises(NotTheSpeech, match="correlation"):
        check_samples(noise, faint)
