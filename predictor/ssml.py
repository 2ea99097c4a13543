"""The SSML subset the speech route reads: what to say, at what rate, and where to be silent.

    <speak>                       the root; version, xml:lang and xmlns are accepted and ignored
      <p>, <s>                    a paragraph or sentence: what it holds is synthesized on its own
      <break time="300ms"|"1.5s" strength="none|x-weak|weak|medium|strong|x-strong"/>
                                  exactly that much silence (time wins over strength)
      <prosody rate="x-slow|slow|medium|fast|x-fast|default|N%">   a span's pace, nested ones multiply
      <sub alias="...">           the alias is spoken instead of the text it holds
      <say-as interpret-as="characters|spell-out|cardinal|number">  letters one by one, or a number

Anything else (another element or attribute, an entity or DTD declaration, malformed XML, deeper than
MAX_DEPTH, more than MAX_ELEMENTS elements) is a BadRequest naming the element, attribute or line,
raised before anything is synthesized. The parser is expat with every declaration refused and no
external entity resolved: the five predefined entities and character references are all it expands,
so an SSML body is never larger once parsed than as sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from xml.parsers import expat

from predictor.errors import BadRequest

MAX_DEPTH = 16  # nesting; real documents use 3-4
MAX_ELEMENTS = 2000  # elements in one document: a break between every word of a long paragraph
MAX_BREAK_S = 10.0  # one break's silence, as Google's and Amazon's TTS cap it

# W3C SSML 1.1's break strengths, in seconds (it leaves the durations to the processor; these are
# the pauses this voice makes at a comma, a sentence end and a paragraph, stretched at both ends).
BREAK_STRENGTHS = {"none": 0.0, "x-weak": 0.1, "weak": 0.25, "medium": 0.4, "strong": 0.75, "x-strong": 1.25}
# Rate keywords as factors of the default pace (SSML leaves them to the processor, too).
RATE_KEYWORDS = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.25, "x-fast": 1.75}
RATE_RANGE = (0.25, 4.0)  # the speech route's own speed range: the product of rates stays inside it
SAY_AS = {"characters": "characters", "spell-out": "characters", "cardinal": "cardinal", "number": "cardinal"}

# Attributes each element may carry; anything else is named in a 400.
_ATTRIBUTES: dict[str, frozenset[str]] = {
    "speak": frozenset({"version", "xml:lang", "xmlns", "xmlns:xsi", "xsi:schemaLocation"}),
    "p": frozenset({"xml:lang"}),
    "s": frozenset({"xml:lang"}),
    "break": frozenset({"time", "strength"}),
    "prosody": frozenset({"rate"}),
    "sub": frozenset({"alias"}),
    "say-as": frozenset({"interpret-as", "format", "detail"}),
}
_TIME = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*")
_PERCENT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*%\s*")
_NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class Span:
    """Text to speak at ``rate`` times the request's pace."""

    text: str
    rate: float = 1.0


@dataclass(frozen=True)
class Break:
    """Exactly ``seconds`` of silence."""

    seconds: float


Part = Span | Break


def is_ssml(source: str) -> bool:
    """Whether a speech input is SSML: it starts (after whitespace) with <speak, or with an XML
    declaration or DOCTYPE, which only a document has; other text with '<' in it stays plain text."""
    return source.lstrip().startswith(("<speak", "<?xml", "<!DOCTYPE"))


def parse(source: str) -> list[Part]:
    """The document's spans and breaks in reading order; adjacent text at one rate is one span, and a
    span ends at every <p>, <s> and <break> boundary."""
    if not source.lstrip().startswith("<"):
        raise BadRequest(
            "invalid SSML: a document starts with <speak> (or an XML declaration), not with text"
        )
    return _Reader().read(source)


class _Reader:
    def __init__(self) -> None:
        self.parts: list[Part] = []
        self.text: list[str] = []
        self.rates: list[float] = [1.0]
        self.stack: list[str] = []
        self.elements = 0
        self.skip = 0  # depth inside a <sub>: its content is replaced by the alias
        self.say_as: str | None = None
        self.say_as_text: list[str] = []
        self.parser = expat.ParserCreate(namespace_separator=None)
        p = self.parser
        p.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        p.StartElementHandler = self._start
        p.EndElementHandler = self._end
        p.CharacterDataHandler = self._chars
        p.StartDoctypeDeclHandler = self._refuse("a DTD (<!DOCTYPE>)")
        p.EntityDeclHandler = self._refuse("an entity declaration")
        p.ElementDeclHandler = self._refuse("an element declaration")
        p.AttlistDeclHandler = self._refuse("an attribute list declaration")
        p.NotationDeclHandler = self._refuse("a notation declaration")
        p.ExternalEntityRefHandler = self._refuse("an external entity")
        p.ProcessingInstructionHandler = self._refuse("a processing instruction")

    def read(self, source: str) -> list[Part]:
        try:
            self.parser.Parse(source, True)
        except expat.ExpatError as exc:
            raise BadRequest(
                f"invalid SSML at line {exc.lineno}, column {exc.offset + 1}: {expat.ErrorString(exc.code)}"
            ) from None
        self._flush()
        return self.parts

    def _where(self) -> str:
        return f"line {self.parser.CurrentLineNumber}"

    def _refuse(self, what: str):  # type: ignore[no-untyped-def]
        def handler(*_args: object) -> None:
            raise BadRequest(f"invalid SSML at {self._where()}: {what} is not accepted")

        return handler

    def _start(self, name: str, attrs: dict[str, str]) -> None:
        if not self.stack and name != "speak":
            raise BadRequest(f"invalid SSML: the root element is <{name}>, not <speak>")
        if self.stack and name == "speak":
            raise BadRequest(f"invalid SSML at {self._where()}: <speak> inside <speak>")
        allowed = _ATTRIBUTES.get(name)
        if allowed is None:
            raise BadRequest(
                f"SSML element <{name}> at {self._where()} is not supported; supported: "
                + ", ".join(f"<{n}>" for n in _ATTRIBUTES)
            )
        for attr in attrs:
            if attr not in allowed:
                raise BadRequest(f"SSML attribute {attr!r} of <{name}> at {self._where()} is not supported")
        self.elements += 1
        if self.elements > MAX_ELEMENTS:
            raise BadRequest(f"SSML has more than {MAX_ELEMENTS} elements")
        if len(self.stack) >= MAX_DEPTH:
            raise BadRequest(f"SSML nests deeper than {MAX_DEPTH} elements at {self._where()}")
        if self.skip and name != "sub":
            raise BadRequest(f"SSML <{name}> inside <sub> at {self._where()}: <sub> holds text only")
        self.stack.append(name)
        if name in ("p", "s"):
            self._flush()
        elif name == "break":
            self._flush()
            self.parts.append(Break(self._break_seconds(attrs)))
        elif name == "prosody":
            self._flush()
            self.rates.append(self.rates[-1] * self._rate(attrs.get("rate", "default")))
        elif name == "sub":
            if "alias" not in attrs:
                raise BadRequest(f"SSML <sub> at {self._where()} has no alias attribute")
            self.text.append(f" {attrs['alias']} ")
            self.skip += 1
        elif name == "say-as":
            kind = attrs.get("interpret-as", "")
            if kind not in SAY_AS:
                raise BadRequest(
                    f"SSML <say-as interpret-as={kind!r}> at {self._where()} is not supported; "
                    f"supported: {', '.join(SAY_AS)}"
                )
            if self.say_as is not None:
                raise BadRequest(f"SSML <say-as> inside <say-as> at {self._where()}")
            self.say_as = SAY_AS[kind]
            self.say_as_text = []

    def _end(self, name: str) -> None:
        self.stack.pop()
        if name in ("p", "s"):
            self._flush()
        elif name == "prosody":
            self._flush()
            self.rates.pop()
        elif name == "sub":
            self.skip -= 1
        elif name == "say-as":
            self.text.append(f" {self._said_as(''.join(self.say_as_text))} ")
            self.say_as = None

    def _chars(self, data: str) -> None:
        if self.skip:
            return
        if not self.stack:
            return  # whitespace around the root
        if self.say_as is not None:
            self.say_as_text.append(data)
        else:
            self.text.append(data)

    def _flush(self) -> None:
        spoken = " ".join("".join(self.text).split())
        self.text = []
        if spoken:
            self.parts.append(Span(spoken, self.rates[-1]))

    def _break_seconds(self, attrs: dict[str, str]) -> float:
        if "time" in attrs:
            match = _TIME.fullmatch(attrs["time"])
            if match is None:
                raise BadRequest(
                    f"SSML <break time={attrs['time']!r}> at {self._where()}: give milliseconds or seconds, "
                    "like 300ms or 1.5s"
                )
            seconds = float(match[1]) / (1000.0 if match[2] == "ms" else 1.0)
            if seconds > MAX_BREAK_S:
                raise BadRequest(
                    f"SSML <break time={attrs['time']!r}> at {self._where()} is longer than {MAX_BREAK_S:g} s"
                )
            return seconds
        strength = attrs.get("strength", "medium")
        if strength not in BREAK_STRENGTHS:
            raise BadRequest(
                f"SSML <break strength={strength!r}> at {self._where()}; accepted: {', '.join(BREAK_STRENGTHS)}"
            )
        return BREAK_STRENGTHS[strength]

    def _rate(self, value: str) -> float:
        rate = RATE_KEYWORDS.get(value.strip())
        if rate is None:
            match = _PERCENT.fullmatch(value)
            if match is None:
                raise BadRequest(
                    f"SSML <prosody rate={value!r}> at {self._where()}: give a percentage like 80% or one of "
                    + ", ".join(RATE_KEYWORDS)
                )
            rate = float(match[1]) / 100.0
        combined = self.rates[-1] * rate
        if not RATE_RANGE[0] <= combined <= RATE_RANGE[1]:
            raise BadRequest(
                f"SSML <prosody rate={value!r}> at {self._where()} makes the pace {combined:g} times the "
                f"default; the range is [{RATE_RANGE[0]:g}, {RATE_RANGE[1]:g}]"
            )
        return rate

    def _said_as(self, content: str) -> str:
        content = content.strip()
        if self.say_as == "characters":
            # One letter or digit at a time: espeak-ng reads a lone letter by its name.
            return " ".join(ch for ch in content if not ch.isspace())
        if _NUMBER.fullmatch(content) is None:
            raise BadRequest(f"SSML <say-as interpret-as='cardinal'> holds {content!r}, not a number")
        return content.replace(",", "")
