"""Text normalization, segmentation and crossfade joining (predictor.text): pure functions, no server."""

from __future__ import annotations

import inspect
import math
import random
import time
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from predictor.audio.crossfade import CrossfadeJoiner, join
from predictor.text import MAX_COMBINING_RUN, has_pronounceable, iter_segments, normalize, split_segments

SAMPLE_RATE = 22050
FADE_MS = 50.0
FADE_SAMPLES = round(SAMPLE_RATE * FADE_MS / 1000)

ENGLISH = "Dr. Smith paid $3.50 for tea. It was, frankly, too much! Was it? Yes… it was."
CJK = "你好。今天天气很好！我们去公园散步，好吗？"
MIXED = "Hello world. 你好，世界。Numbers like 3.14 stay whole; so does e.g. this one!\nNew line here"
LONG_SENTENCE = "When the rain stopped, the children ran outside, shouting, laughing, and splashing in every puddle they could find, until dark."
VERY_LONG_WORD = "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3


def _no_whitespace(text: str) -> str:
    return "".join(text.split())


def _assert_valid_segments(text: str, segments: list[str], max_chars: int) -> None:
    assert all(0 < len(segment) <= max_chars for segment in segments), segments
    assert all(segment.strip() for segment in segments), segments
    assert "".join(_no_whitespace(segment) for segment in segments) == _no_whitespace(text)


# --- normalize ---------------------------------------------------------------------------------------


def test_normalize_maps_curly_quotes_and_apostrophes_to_ascii():
    assert normalize("\u201cDon\u2019t,\u201d she said, \u2018fine\u2019.") == "\"Don't,\" she said, 'fine'."


def test_normalize_turns_a_dash_between_words_into_a_comma_pause():
    assert (
        normalize("It was late\u2014very late \u2013 and dark -- truly.")
        == "It was late, very late, and dark, truly."
    )


def test_normalize_keeps_numeric_ranges_and_hyphenated_words():
    assert (
        normalize("Pages 10\u201320 of a well-known book; 5 - 3 = 2.")
        == "Pages 10-20 of a well-known book; 5 - 3 = 2."
    )


def test_normalize_drops_a_dash_at_the_start_of_a_line():
    assert normalize("\u2014 Who is there?\n\u2014 Me.") == "Who is there?\nMe."


def test_normalize_replaces_control_characters_with_spaces_and_collapses_whitespace():
    assert normalize("  one\x00two\x07 \t\tthree\u00a0 four  ") == "one two three four"


def test_normalize_keeps_one_newline_per_line_break():
    assert (
        normalize("First line.  \r\n\r\n\n   Second\tline.\u2028Third.")
        == "First line.\nSecond line.\nThird."
    )


def test_normalize_removes_invisible_characters_inside_words():
    assert normalize("in\u00advisible\u200b\ufeff") == "invisible"


def test_normalize_composes_to_nfc():
    assert normalize("cafe\u0301") == "caf\u00e9"


def test_normalize_leaves_cjk_text_untouched():
    assert normalize(CJK) == CJK
    assert normalize("日本語のテキスト——そのまま。") == "日本語のテキスト——そのまま。"


# --- split_segments ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [ENGLISH, CJK, MIXED, LONG_SENTENCE, VERY_LONG_WORD],
    ids=["english", "cjk", "mixed", "long-sentence", "long-word"],
)
@pytest.mark.parametrize("max_chars", [1, 7, 30, 200])
def test_segments_fit_max_chars_and_keep_every_character(text, max_chars):
    normalized = normalize(text)

    segments = split_segments(normalized, max_chars)

    _assert_valid_segments(normalized, segments, max_chars)


@pytest.mark.parametrize("text", ["", "   \n\t ", "...", " ?! \n — ... 。！"])
def test_text_with_nothing_to_pronounce_yields_no_segments(text):
    assert split_segments(normalize(text), 50) == []


def test_each_sentence_is_its_own_segment():
    # An ellipsis followed by a space ends a sentence, like any other terminator.
    expected = [
        "Dr. Smith paid $3.50 for tea.",
        "It was, frankly, too much!",
        "Was it?",
        "Yes\u2026",
        "it was.",
    ]

    assert split_segments(ENGLISH, 200) == expected


def test_decimals_and_abbreviations_do_not_end_a_sentence():
    assert split_segments("Dr. Smith paid $3.50.", 200) == ["Dr. Smith paid $3.50."]
    assert split_segments(
        "Mrs. Jones vs. Mr. Brown, e.g. at St. Mary's, i.e. here, etc. and pi is 3.14159 today.", 200
    ) == ["Mrs. Jones vs. Mr. Brown, e.g. at St. Mary's, i.e. here, etc. and pi is 3.14159 today."]


def test_terminator_runs_and_closing_quotes_stay_with_their_sentence():
    assert split_segments('Really?! "Yes." Fine... ok', 200) == ["Really?!", '"Yes."', "Fine...", "ok"]


def test_cjk_terminators_split_without_spaces():
    assert split_segments("你好。今天天气很好！", 200) == ["你好。", "今天天气很好！"]


def test_line_breaks_split_segments():
    assert split_segments("Title\n\nFirst paragraph\nsecond line", 200) == [
        "Title",
        "First paragraph",
        "second line",
    ]


def test_long_sentence_is_cut_after_clause_marks_and_packed_greedily():
    segments = split_segments(LONG_SENTENCE, 60)

    assert segments == [
        "When the rain stopped, the children ran outside, shouting,",
        "laughing, and splashing in every puddle they could find,",
        "until dark.",
    ]


def test_clause_without_marks_is_cut_at_spaces():
    text = "one two three four five six seven eight nine ten"

    assert split_segments(text, 15) == ["one two three", "four five six", "seven eight", "nine ten"]


def test_word_longer_than_max_chars_is_cut_hard():
    assert split_segments("abcdefghij", 4) == ["abcd", "efgh", "ij"]


def test_cjk_long_sentence_is_cut_at_cjk_clause_marks():
    assert split_segments("我们去公园散步，然后去吃饭，好吗？", 8) == [
        "我们去公园散步，",
        "然后去吃饭，",
        "好吗？",
    ]


def test_punctuation_only_piece_joins_its_neighbour():
    assert split_segments("Hello. ... World.", 200) == ["Hello. ...", "World."]


def test_sentences_are_not_merged_even_when_they_would_fit():
    assert split_segments("Hi. Yo. Ok.", 200) == ["Hi.", "Yo.", "Ok."]


def test_max_chars_below_one_is_rejected():
    with pytest.raises(ValueError, match="max_chars must be at least 1"):
        iter_segments("text", 0)


_RANDOM_ALPHABET = [
    *"abcdefXYZ0123",
    *"     ",
    *".,;:!?…-\"'",
    *"你好世界。，！？、",
    *["\n", "\n\n", "\t", "é", "3.5", "Dr.", "e.g."],
]


def _random_text(rng: random.Random) -> str:
    pieces = [rng.choice(_RANDOM_ALPHABET) for _ in range(rng.randint(0, 120))]
    if rng.random() < 0.2:
        pieces.insert(rng.randint(0, len(pieces)), "w" * rng.randint(1, 80))
    return "".join(pieces)


def test_random_texts_give_valid_segments_without_losing_characters():
    rng = random.Random(20240607)
    for _ in range(400):
        normalized = normalize(_random_text(rng))
        max_chars = rng.randint(1, 60)

        segments = split_segments(normalized, max_chars)

        if any(ch.isalnum() for ch in normalized):
            _assert_valid_segments(normalized, segments, max_chars)
        else:
            assert all(0 < len(segment) <= max_chars and segment.strip() for segment in segments)


def test_long_text_splits_lazily_and_quickly():
    text = (normalize(" ".join([ENGLISH, CJK, LONG_SENTENCE])) + "\n") * 250
    assert len(text) >= 50_000
    max_chars = 120

    started = time.perf_counter()
    segments = iter_segments(text, max_chars)
    first = next(segments)
    rest = list(segments)
    elapsed = time.perf_counter() - started

    assert inspect.isgenerator(iter_segments(text, max_chars))
    assert first == "Dr. Smith paid $3.50 for tea."
    _assert_valid_segments(text, [first, *rest], max_chars)
    assert elapsed < 1.0


def test_split_and_iter_segments_both_cut_mixed_text_by_the_rules():
    # Worked by hand from the rules: sentences first ("3.14" and "e.g." do not end one), a CJK sentence
    # ends at its full stop, the 52-character sentence is cut at its clause mark, then at the last space
    # that fits 20 characters; a line break ends a segment.
    expected = [
        "Hello world.",
        "你好，世界。",
        "Numbers like 3.14",
        "stay whole;",
        "so does e.g. this",
        "one!",
        "New line here",
    ]

    assert split_segments(MIXED, 20) == expected
    assert list(iter_segments(MIXED, 20)) == expected


# --- crossfade joining -------------------------------------------------------------------------------


def _sine(length: int, frequency: float = 440.0) -> np.ndarray:
    return np.sin(2 * np.pi * frequency * np.arange(length) / SAMPLE_RATE).astype(np.float32)


def test_join_of_constant_segments_stays_constant_across_the_join():
    segments = [np.full(5000, 0.5, dtype=np.float32), np.full(4000, 0.5, dtype=np.float32)]

    joined = join(segments, SAMPLE_RATE, FADE_MS)

    np.testing.assert_allclose(joined, 0.5, atol=1e-3)


def test_join_of_a_sine_split_at_a_zero_crossing_has_no_jump():
    period = SAMPLE_RATE // 441  # 50 samples: a 441 Hz sine crosses zero at every multiple of 50
    sine = _sine(200 * period, frequency=SAMPLE_RATE / period)
    split = 100 * period
    max_step_inside = np.abs(np.diff(sine)).max()

    joined = join([sine[:split], sine[split:]], SAMPLE_RATE, FADE_MS)

    around_join = joined[split - FADE_SAMPLES - 10 : split + 10]
    assert np.abs(np.diff(around_join)).max() <= 1.5 * max_step_inside


def test_joined_length_is_total_minus_one_fade_per_join():
    lengths = [3000, 5000, 2500, 4000]
    segments = [np.zeros(length, dtype=np.float32) for length in lengths]

    joined = join(segments, SAMPLE_RATE, FADE_MS)

    assert len(joined) == sum(lengths) - (len(lengths) - 1) * FADE_SAMPLES


def test_streaming_push_and_finish_equal_join_exactly():
    rng = np.random.default_rng(7)
    segments = [rng.standard_normal(length).astype(np.float32) for length in (4000, 700, 3000, 10, 2500)]
    joiner = CrossfadeJoiner(SAMPLE_RATE, FADE_MS)

    streamed = np.concatenate([joiner.push(segment) for segment in segments] + [joiner.finish()])

    np.testing.assert_array_equal(streamed, join(segments, SAMPLE_RATE, FADE_MS))
    assert streamed.dtype == np.float32


def test_push_holds_back_exactly_one_fade():
    joiner = CrossfadeJoiner(SAMPLE_RATE, FADE_MS)

    emitted = joiner.push(np.ones(3000, dtype=np.float32))

    assert len(emitted) == 3000 - FADE_SAMPLES
    assert len(joiner.finish()) == FADE_SAMPLES


def test_segment_shorter_than_the_fade_shortens_the_crossfade():
    short = np.full(100, 0.5, dtype=np.float32)
    segments = [np.full(3000, 0.5, dtype=np.float32), short, np.full(3000, 0.5, dtype=np.float32)]

    joined = join(segments, SAMPLE_RATE, FADE_MS)

    # The first join overlaps all 100 samples of the short segment, the second the 100 samples held.
    assert len(joined) == 3000 + 100 + 3000 - 100 - 100
    np.testing.assert_allclose(joined, 0.5, atol=1e-3)


def test_join_of_one_segment_returns_it_and_of_none_returns_empty():
    segment = _sine(1000)

    np.testing.assert_array_equal(join([segment], SAMPLE_RATE, FADE_MS), segment)
    assert join([], SAMPLE_RATE, FADE_MS).size == 0


def test_joiner_rejects_multichannel_audio():
    with pytest.raises(ValueError, match="expected mono 1-D audio"):
        CrossfadeJoiner(SAMPLE_RATE).push(np.zeros((2, 100), dtype=np.float32))


# --- combining marks: a letter with its marks is one unit ----------------------------------------

ACCENT = "\u0301"  # combining acute accent


@pytest.mark.parametrize("marks", [2_000, 49_999])
def test_a_letter_under_thousands_of_accents_is_one_short_segment_found_quickly(marks):
    # The attack from issue 25: 2 KB of accents was 1,701 one-character segments, one engine call each.
    started = time.perf_counter()
    normalized = normalize("a" + ACCENT * marks)
    segments = split_segments(normalized, 300)
    elapsed = time.perf_counter() - started

    assert normalized == "\u00e1" + ACCENT * MAX_COMBINING_RUN  # NFC composes the first accent: á
    assert segments == [normalized]
    assert elapsed < 0.5


def test_combining_marks_alone_are_nothing_to_speak():
    assert not has_pronounceable(normalize(ACCENT * 40))
    assert split_segments(normalize(ACCENT * 40), 300) == []


@pytest.mark.parametrize(
    "text",
    ["नमस्ते दुनिया", "Tiếng Việt có dấu", "e\u0301te\u0301 a\u0300 Paris", "שָׁלוֹם עוֹלָם"],
    ids=["hindi", "vietnamese", "decomposed-french", "hebrew-points"],
)
def test_ordinary_combining_marks_are_kept(text):
    assert normalize(text) == unicodedata.normalize("NFC", text)


def test_segments_never_separate_a_letter_from_its_marks():
    word = ("e" + ACCENT * 3) * 40  # 160 characters, no space to cut at: hard cuts only
    segments = split_segments(normalize(f"{word} {word}"), 50)

    assert all(not unicodedata.combining(segment[0]) for segment in segments)
    assert "".join(segments).replace(" ", "") == normalize(word + word)
    assert len(segments) <= 2 * math.ceil(len(word) * 2 / 50)


def _clean_one_char_at_a_time(text: str) -> str:
    """The rules of normalize's cleaning step, one character at a time: the reference the fast path
    (str.translate and regular expressions) must agree with."""
    out, marks = [], 0
    # Invisible characters go first: marks they separated are one run (else they would beat the cap).
    for ch in (c for c in text if c not in "\u00ad\u200b\u2060\ufeff"):
        marks = marks + 1 if unicodedata.combining(ch) else 0
        if marks > MAX_COMBINING_RUN:
            continue
        category = unicodedata.category(ch)
        out.append(" " if (category == "Cc" and not ch.isspace()) or category == "Cs" else ch)
    return "".join(out)


_ALPHABET = st.sampled_from(
    [*"ab -—–\t\n\r\x00\x07\x85\u2028.,", "\u0301", "\u0308", "\u00ad", "\ufeff", "\ud800", "é", "你", "ß"]
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(_ALPHABET | st.just("\u0301" * 31), max_size=80).map("".join))
def test_normalize_cleans_as_the_one_character_at_a_time_rules_say(text):
    from predictor.text import _clean

    assert _clean(text) == _clean_one_char_at_a_time(text)
