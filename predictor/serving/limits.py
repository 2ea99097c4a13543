"""How many texts, and how long each, one request may send, and the 400s that say so: checked where
texts are decoded (before they are normalized) and again where the service admits them.

Apart from params.py because it must not load KServe's protobuf modules: the service imports it, and
a process that also loads Triton's client (the tests) cannot hold both sets of protos.
"""

from __future__ import annotations

from dataclasses import dataclass

from predictor.config import Settings
from predictor.errors import BadRequest


@dataclass(frozen=True)
class TextLimits:
    """How many texts, and how long each, a request may send (MAX_BATCH_ITEMS, MAX_TEXT_CHARS)."""

    max_items: int
    max_chars: int

    @classmethod
    def of(cls, settings: Settings, max_items: int | None = None) -> TextLimits:
        return cls(settings.max_batch_items if max_items is None else max_items, settings.max_text_chars)


def check_count(n: int, max_items: int) -> None:
    if n > max_items:
        raise BadRequest(f"{n} texts in one request; the limit is MAX_BATCH_ITEMS={max_items}")


def check_blank(i: int, text: str) -> None:
    if not text.strip():
        raise BadRequest(f"text[{i}] is empty or whitespace only")


def check_length(i: int, chars: int, max_chars: int) -> None:
    if chars > max_chars:
        raise BadRequest(f"text[{i}] has {chars} characters; the limit is MAX_TEXT_CHARS={max_chars}")
