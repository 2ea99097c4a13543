"""What leaves the event loop for the request worker: by about how long it takes, not by its size."""

from __future__ import annotations

import asyncio
import threading

import pytest

from predictor.audio import codecs
from predictor.serving.offload import off_loop

RATE = 22050


def _runs_on(work: int) -> str:
    async def main() -> str:
        return await off_loop(work, lambda: threading.current_thread().name)

    return asyncio.run(main())


@pytest.mark.parametrize("fmt", ["wav", "pcm"])
def test_a_sentences_wav_or_pcm_is_encoded_on_the_event_loop(fmt: str) -> None:
    # Ten seconds of audio: 0.5-1.5 ms of work, less than the hop there and back.
    assert _runs_on(codecs.encode_us(fmt, 10 * RATE, RATE)) == threading.current_thread().name


@pytest.mark.parametrize("fmt", ["mp3", "opus"])
def test_a_sentences_mp3_or_opus_is_encoded_on_the_request_worker(fmt: str) -> None:
    # One second: milliseconds of work, which would hold every other request on the loop.
    assert _runs_on(codecs.encode_us(fmt, RATE, RATE)).startswith("request-cpu")


def test_a_minute_of_wav_is_encoded_on_the_request_worker() -> None:
    assert _runs_on(codecs.encode_us("wav", 60 * RATE, RATE)).startswith("request-cpu")


def test_a_long_texts_characters_are_worked_on_the_request_worker_and_a_short_ones_inline() -> None:
    assert _runs_on(len("a" * 100)) == threading.current_thread().name
    assert _runs_on(len("a" * 10_000)).startswith("request-cpu")
