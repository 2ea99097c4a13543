"""Text preparation for synthesis: normalization and sentence-sized segments.

A request's text goes through two steps here (audio/crossfade.py joins the audio of the segments):

1. ``normalize`` makes it something espeak-ng reads well (typographic quotes and dashes, control
   characters, whitespace), keeping line breaks because they separate segments.
2. ``iter_segments`` cuts it into sentence-sized segments of at most ``max_chars`` characters, lazily,
   so a long text is synthesized (and streamed) one segment at a time instead of all at once.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

# --- normalization ---------------------------------------------------------------------------------

# Curly quotes become the ASCII ones espeak-ng's rules are written for; both are silent anyway, but
# the ASCII apostrophe is what its dictionaries expect inside words like "don't".
_QUOTE_MAP = str.maketrans(
    {
        "\u2018": "'",  # left single quotation mark
        "\u2019": "'",  # right single quotation mark, the usual typographic apostrophe
        "\u201a": "'",  # single low-9 quotation mark
        "\u201b": "'",  # single high-reversed-9 quotation mark
        "\u201c": '"',  # left double quotation mark
        "\u201d": '"',  # right double quotation mark
        "\u201e": '"',  # double low-9 quotation mark
        "\u201f": '"',  # double high-reversed-9 quotation mark
        "\u00ab": '"',  # left guillemet
        "\u00bb": '"',  # right guillemet
    }
)

# Characters with no glyph that sit inside words (soft hyphen, zero-width space, word joiner, BOM):
# removed outright, since a space would split the word they sit in. ZWJ/ZWNJ are deliberately kept:
# they change how Indic, Persian and emoji text is read.
_INVISIBLE_CHARS = frozenset("\u00ad\u200b\u2060\ufeff")

# Unicode's Stream-Safe Text Format (UAX #15) allows at most 30 combining marks in a row; no script
# needs more, and past that they only multiply work ("a" with 2,000 accents is one letter). Together
# with segmentation never splitting a letter from its marks, a grapheme is at most 31 characters.
MAX_COMBINING_RUN = 30

# The line breaks str.splitlines() knows; every one of them ends a segment.
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
_LINE_BREAK_RUN = re.compile(f"\\s*[{_LINE_BREAKS}]\\s*")
_LINE_BREAK = re.compile(f"[{_LINE_BREAKS}]")
# Whitespace that collapsing changes: a run of two or more, or one that is not a plain space (a single
# space is left alone, so ordinary prose costs no substitution per word).
_SPACE_RUN = re.compile(f"[^\\S{_LINE_BREAKS}]{{2,}}|[^\\S{_LINE_BREAKS} ]")
_LINE_SPAN = re.compile(f"[^{_LINE_BREAKS}]+")

# A dash used as punctuation: the Unicode dashes, two or more hyphens, or a hyphen with spaces on both
# sides (a hyphen touching a word is a compound like "well-known" and is left alone).
_DASH = re.compile(r" ?(?:[\u2013\u2014\u2015]+|-{2,}) ?| - ")
_DASH_CHAR = re.compile("[-\u2013\u2014\u2015]")
# A dash between words is a pause, and a comma is the pause espeak-ng reads most reliably.
_DASH_PAUSE = ", "
# Characters that end a phrase, after which a dash still reads as a pause ("word" — "word").
_PHRASE_CLOSERS = frozenset("\"')]}")
# East Asian widths of CJK characters; dashes next to them are left as written (CJK text is kept intact).
_WIDE_WIDTHS = frozenset("WF")


def normalize(text: str) -> str:
    """Text in the form espeak-ng reads best, with line breaks kept (each one ends a segment).

    NFC composition; control characters (NUL included) and lone surrogates become spaces and invisible in-word characters are removed;
    combining marks past MAX_COMBINING_RUN in a row are dropped;
    curly quotes become ASCII quotes; a dash between words becomes a comma pause (between digits, a
    hyphen: "1990–2000" is a range); runs of spaces become one space, runs of whitespace containing a
    line break become one newline; the ends are stripped. CJK text is not changed.
    """
    text = unicodedata.normalize("NFC", text)
    text = _clean(text)
    text = text.translate(_QUOTE_MAP)
    text = _collapse_whitespace(text)
    if _DASH_CHAR.search(text):  # the search is cheap, _DASH tries at every space
        text = _DASH.sub(_replace_dash, text)
    # Replacing dashes can leave spaces next to line breaks or doubled ones: collapse again.
    return _collapse_whitespace(text)


def _clean(text: str) -> str:
    # str.translate and re run in C: normalizing a request's text holds the GIL (and so the event
    # loop) for microseconds per kilobyte, not the microsecond per character of a Python loop.
    text = text.translate(_CLEAN_TABLE)
    if text.isascii():
        return text
    return _LONG_NON_ASCII_RUN.sub(_cap_combining, text)


# Whitespace controls (tab, newline, ...) are handled with the rest of the whitespace. Any other
# control character becomes a space rather than nothing: it usually separates fields, and gluing its
# neighbours together would invent a word. NUL included: espeak-ng reads C strings, so a NUL would
# silently cut the text short. Lone surrogates (Cs; JSON can carry "\ud800") cannot be encoded as
# UTF-8 for espeak-ng at all. Invisible in-word characters are removed.
_CLEAN_TABLE: dict[int, str | None] = {
    **{c: " " for c in (*range(0x20), *range(0x7F, 0xA0)) if not chr(c).isspace()},
    **dict.fromkeys(range(0xD800, 0xE000), " "),
    **dict.fromkeys(map(ord, _INVISIBLE_CHARS)),
}
# Only a run of more than MAX_COMBINING_RUN characters outside ASCII can hold that many marks in a
# row; the marks are looked at one by one only there.
_LONG_NON_ASCII_RUN = re.compile(f"[^\\x00-\\x7f]{{{MAX_COMBINING_RUN + 1},}}")


def _cap_combining(run: re.Match[str]) -> str:
    out = []
    marks = 0  # combining marks in a row so far
    for ch in run.group():
        if unicodedata.combining(ch):
            marks += 1
            if marks > MAX_COMBINING_RUN:
                continue
        else:
            marks = 0
        out.append(ch)
    return "".join(out)


def _collapse_whitespace(text: str) -> str:
    text = _SPACE_RUN.sub(" ", text)
    if _LINE_BREAK.search(text):
        text = _LINE_BREAK_RUN.sub("\n", text)
    return text.strip()


def _replace_dash(match: re.Match[str]) -> str:
    text = match.string
    before = text[match.start() - 1] if match.start() > 0 else ""
    after = text[match.end()] if match.end() < len(text) else ""
    # At the start or end of a line (a dialogue dash, a trailing dash) there is nothing to pause between.
    if not before or not after or before == "\n" or after == "\n":
        return " "
    if _is_wide(before) or _is_wide(after):
        return match.group()
    if before.isdigit() and after.isdigit():
        # "1990–2000" is a range; "5 - 3" stays the arithmetic it was written as.
        return match.group() if match.group().strip() == "-" else "-"
    if before.isalnum() or before in _PHRASE_CLOSERS:
        return _DASH_PAUSE
    # After other punctuation ("word, — word") that punctuation already makes the pause.
    return " "


def _is_wide(ch: str) -> bool:
    return unicodedata.east_asian_width(ch) in _WIDE_WIDTHS


# --- length bounds ---------------------------------------------------------------------------------

# Seconds of speech per character of text, as an upper bound for ordinary prose: the default voice
# measures about 0.06 s per character at length_scale 1. Text that reads much longer than it is
# written (long digit strings: "1234567" is seven words) can exceed it.
SPOKEN_SECONDS_PER_CHAR_BOUND = 0.1


def spoken_seconds_bound(text: str, length_scale: float = 1.0) -> float:
    """Seconds of audio ``text`` should not exceed at ``length_scale`` (see SPOKEN_SECONDS_PER_CHAR_BOUND)."""
    return spoken_seconds_bound_chars(len(text), length_scale)


def spoken_seconds_bound_chars(chars: int, length_scale: float = 1.0) -> float:
    """``spoken_seconds_bound`` of a text of ``chars`` characters."""
    return chars * SPOKEN_SECONDS_PER_CHAR_BOUND * length_scale


# --- segmentation ----------------------------------------------------------------------------------

# CJK sentence terminators end a sentence whether or not a space follows (CJK uses none).
_CJK_TERMINATORS = frozenset("。！？．｡")
# A run of terminators ("?!", "...", "。") and the closing quotes/brackets that belong to the sentence.
_TERMINATOR_RUN = re.compile("([.!?\u2026。！？．｡]+)[\"')\\]}»」』）】〉》\u201d\u2019]*")
# Clause marks a sentence that is too long is cut after. The ASCII ones only count before whitespace,
# so "1,000" and "10:30" stay whole; CJK ones are never followed by a space.
_ASCII_CLAUSE_MARKS = frozenset(",;:")
_CJK_CLAUSE_MARKS = frozenset("，；：、")
# Words whose period does not end a sentence. Kept small on purpose: a missed sentence end only makes a
# segment longer (espeak-ng still pauses at the period), while a wrong one breaks a sentence's melody.
_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "st", "prof", "jr", "sr", "e.g", "i.e", "etc", "vs"})
# Initials and dotted abbreviations ("J. Smith", "U.S. Army", "a.m."): letters, each but the last
# followed by a period, before the period being judged.
_INITIALISM = re.compile(r"(?:[^\W\d_]\.)*[^\W\d_]")
# Quotes and brackets that may open a word, ignored when matching it against the abbreviations.
_WORD_OPENERS = "\"'([{«「『（【〈《\u201c\u2018"
# No abbreviation (with an opening quote or two) is longer than this; bounding the look-back keeps
# splitting linear on long tokens.
_MAX_WORD_LOOKBACK = 16


def split_segments(text: str, max_chars: int) -> list[str]:
    """``text`` (best ``normalize``d first) as segments of at most ``max_chars`` characters; see ``iter_segments``."""
    return list(iter_segments(text, max_chars))


def iter_segments(text: str, max_chars: int) -> Iterator[str]:
    """Yield ``text``'s segments lazily, each a sentence or part of one, never longer than ``max_chars``.

    Sentences end at terminators (``. ! ? …`` followed by a space or the end of the line, not in
    decimals like 3.14 or after abbreviations like "Dr."; ``。！？．`` anywhere) and at line breaks. Each
    sentence is its own segment. A sentence longer than ``max_chars`` is cut after clause marks
    (``, ; :`` and ``，；：、``), else at spaces, else (a long word, CJK without marks) hard at
    ``max_chars``; its pieces are packed greedily up to ``max_chars``.

    A piece with nothing to pronounce (only punctuation) joins a neighbouring segment when that fits,
    and a text with nothing to pronounce yields no segments. Otherwise every character other than
    whitespace is in exactly one segment, in order: the segments are substrings of ``text``.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be at least 1, got {max_chars}")
    # Not a generator itself, so a bad max_chars fails at the call rather than at the first next().
    return _segments(text, max_chars)


def _segments(text: str, max_chars: int) -> Iterator[str]:
    if not any(_is_pronounceable(ch) for ch in text):
        return
    # Each piece is held until the next one is known, so that a piece with nothing to pronounce (an
    # ellipsis on its own, a trailing "?!") can join its neighbour instead of becoming silent audio.
    held: tuple[int, int] | None = None
    held_pronounceable = False
    for start, end in _pieces(text, max_chars):
        pronounceable = _has_pronounceable(text, start, end)
        if held is not None and end - held[0] <= max_chars and not (held_pronounceable and pronounceable):
            held = (held[0], end)
            held_pronounceable = held_pronounceable or pronounceable
            continue
        if held is not None:
            yield text[held[0] : held[1]]
        held, held_pronounceable = (start, end), pronounceable
    if held is not None:
        yield text[held[0] : held[1]]


def has_pronounceable(text: str) -> bool:
    """Whether ``text`` has anything espeak-ng may read: a text without is refused before synthesis."""
    return any(_is_pronounceable(ch) for ch in text)


def _is_pronounceable(ch: str) -> bool:
    # Symbols count ("$", "%", emoji): espeak-ng reads them. Punctuation and whitespace alone it does
    # not, nor combining marks: a mark is pronounced only with the letter it sits on.
    return not ch.isspace() and unicodedata.category(ch)[0] not in "PM"


def _has_pronounceable(text: str, start: int, end: int) -> bool:
    return any(_is_pronounceable(text[i]) for i in range(start, end))


def _pieces(text: str, max_chars: int) -> Iterator[tuple[int, int]]:
    """(start, end) of every sentence, or piece of a too-long one, stripped and never empty."""
    for line in _LINE_SPAN.finditer(text):
        for start, end in _sentences(text, line.start(), line.end()):
            start, end = _strip(text, start, end)
            if start < end:
                yield from _cut(text, start, end, max_chars)


def _sentences(text: str, line_start: int, line_end: int) -> Iterator[tuple[int, int]]:
    sentence_start = line_start
    for run in _TERMINATOR_RUN.finditer(text, line_start, line_end):
        if _ends_sentence(text, run, line_start, line_end):
            yield sentence_start, run.end()
            sentence_start = run.end()
    if sentence_start < line_end:
        yield sentence_start, line_end


def _ends_sentence(text: str, run: re.Match[str], line_start: int, line_end: int) -> bool:
    terminators = run.group(1)
    after = run.end()
    next_char = text[after] if after < line_end else ""
    if any(ch in _CJK_TERMINATORS for ch in terminators):
        # A fullwidth period between digits is a decimal point, as in "３．１４".
        previous = text[run.start() - 1] if run.start() > line_start else ""
        return not (terminators == "．" and previous.isdigit() and next_char.isdigit())
    # "3.14", "example.com", "Hello.World": an English terminator needs a space after it.
    if next_char and not next_char.isspace():
        return False
    return not (terminators == "." and _is_abbreviation(text, run.start(), line_start))


def _is_abbreviation(text: str, period: int, line_start: int) -> bool:
    """Whether the word ending just before ``text[period]`` (a period) is an abbreviation."""
    start = period
    limit = max(line_start, period - _MAX_WORD_LOOKBACK)
    while start > limit and not text[start - 1].isspace():
        start -= 1
    if start == limit and start > line_start and not text[start - 1].isspace():
        return False  # the word is longer than any abbreviation
    word = text[start:period].lstrip(_WORD_OPENERS)
    return word.lower() in _ABBREVIATIONS or _INITIALISM.fullmatch(word) is not None


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _cut(text: str, start: int, end: int, max_chars: int) -> Iterator[tuple[int, int]]:
    """Cut the stripped sentence text[start:end] into stripped pieces of at most ``max_chars``.

    Greedy: each piece is the longest prefix ending at the best kind of break within ``max_chars``.
    """
    while end - start > max_chars:
        cut = (
            _clause_cut(text, start, max_chars)
            or _space_cut(text, start, max_chars)
            or _hard_cut(text, start, max_chars)
        )
        yield _strip(text, start, cut)
        start, _ = _strip(text, cut, end)
    if start < end:
        yield start, end


def _clause_cut(text: str, start: int, max_chars: int) -> int | None:
    # Only called while the sentence is longer than max_chars, so text[p + 1] always exists. The last
    # mark is wanted (the fullest piece); a mark at `start` itself would make a piece of only that mark.
    for p in range(start + max_chars - 1, start, -1):
        ch = text[p]
        if ch in _CJK_CLAUSE_MARKS or (ch in _ASCII_CLAUSE_MARKS and text[p + 1].isspace()):
            return p + 1
    return None


def _space_cut(text: str, start: int, max_chars: int) -> int | None:
    # A space at start + max_chars is fine: the piece before it is exactly max_chars long.
    for p in range(start + max_chars, start, -1):
        if text[p].isspace():
            return p
    return None


def _hard_cut(text: str, start: int, max_chars: int) -> int:
    cut = start + max_chars
    # Do not separate a combining mark from the letter it modifies, unless the letter is all there is.
    while cut > start + 1 and unicodedata.combining(text[cut]):
        cut -= 1
    return cut
