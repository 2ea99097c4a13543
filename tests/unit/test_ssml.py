"""The SSML subset: what each element turns into, and every way a document is refused."""

from __future__ import annotations

import pytest

from predictor import ssml
from predictor.errors import BadRequest
from predictor.ssml import Break, Span


def test_text_breaks_and_rates_come_out_in_reading_order():
    parts = ssml.parse(
        '<speak version="1.1" xml:lang="en-US">Hello <break time="500ms"/> world.'
        '<prosody rate="slow">Slowly <prosody rate="50%">slower</prosody></prosody> again</speak>'
    )

    assert parts == [
        Span("Hello"),
        Break(0.5),
        Span("world."),
        Span("Slowly", 0.75),
        Span("slower", 0.375),
        Span("again"),
    ]


@pytest.mark.parametrize(
    ("element", "seconds"),
    [
        ('<break time="1.5s"/>', 1.5),
        ('<break time="250ms"/>', 0.25),
        ('<break strength="strong"/>', ssml.BREAK_STRENGTHS["strong"]),
        ("<break/>", ssml.BREAK_STRENGTHS["medium"]),
        ('<break strength="weak" time="2s"/>', 2.0),  # time wins
    ],
)
def test_a_break_is_its_time_else_its_strength(element, seconds):
    assert ssml.parse(f"<speak>a{element}b</speak>") == [Span("a"), Break(seconds), Span("b")]


def test_sub_speaks_its_alias_and_say_as_spells_or_reads_a_number():
    parts = ssml.parse(
        '<speak><sub alias="World Wide Web">WWW</sub>, <say-as interpret-as="characters">SSML</say-as>'
        ' for <say-as interpret-as="cardinal">1,024</say-as> &amp; more</speak>'
    )

    assert parts == [Span("World Wide Web , S S M L for 1024 & more")]


def test_paragraphs_and_sentences_are_spans_of_their_own():
    parts = ssml.parse("<speak><p><s>One</s><s>Two</s></p><p>Three</p></speak>")

    assert parts == [Span("One"), Span("Two"), Span("Three")]


def test_only_input_that_starts_with_speak_is_ssml():
    assert ssml.is_ssml("  <speak>Hi</speak>")
    assert ssml.is_ssml('<?xml version="1.0"?><speak>Hi</speak>')
    assert ssml.parse('<?xml version="1.0"?>\n<speak>Hi</speak>') == [Span("Hi")]
    assert not ssml.is_ssml("1 < 2 and <b>bold</b>")


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ("<speak><audio src='x.wav'/></speak>", "<audio>"),
        ('<speak><prosody pitch="high">x</prosody></speak>', "'pitch'"),
        ("<speak>unclosed", "line 1"),
        ("<speak>\n\n<p>x</s></speak>", "line 3"),
        ('<!DOCTYPE speak [<!ENTITY a "aaaa">]><speak>&a;</speak>', "DTD"),
        ("<speak>&undefined;</speak>", "undefined entity"),
        ('<speak><break time="soon"/></speak>', "300ms or 1.5s"),
        ('<speak><break time="11s"/></speak>', "longer than 10 s"),
        ('<speak><break strength="huge"/></speak>', "x-strong"),
        ('<speak><prosody rate="quick">x</prosody></speak>', "80%"),
        ('<speak><prosody rate="20%">x</prosody></speak>', "range is [0.25, 4]"),
        ('<speak><say-as interpret-as="date">1/2</say-as></speak>', "interpret-as='date'"),
        ('<speak><say-as interpret-as="cardinal">many</say-as></speak>', "not a number"),
        ("<speak><sub>x</sub></speak>", "no alias"),
        ("<p>not speak</p>", "root element is <p>"),
        ("<speak><?php echo 1 ?></speak>", "processing instruction"),
        ("<speak>" + "<s>" * 17 + "x" + "</s>" * 17 + "</speak>", "deeper than 16"),
        ("<speak>" + "<break/>" * 2001 + "</speak>", "more than 2000 elements"),
    ],
)
def test_what_the_subset_does_not_hold_is_a_bad_request_naming_it(document, named):
    with pytest.raises(BadRequest) as refused:
        ssml.parse(document)

    assert named in str(refused.value)
