"""`POST /v1/audio/speech`: OpenAI's shape, whole files, streams that start early, cancellation."""

from __future__ import annotations

import base64
import itertools
import json
import time

import httpx
import numpy as np
import pytest

from predictor.audio import crossfade
from testing.audio import check_encoded
from testing.bodies import speech_request

TEN_SENTENCES = " ".join(f"This is sentence number {n}, spoken on its own." for n in range(1, 11))


def speech(predictor, text: str, response_format: str, **fields) -> httpx.Response:
    return predictor.post(
        "/v1/audio/speech", json=speech_request(text, response_format, **fields), timeout=120
    )


TWO_SENTENCES = "Hello from the speech route. It has two sentences."


# quiet_predictor serves the voice without inference noise (the route takes no noise parameters), so
# its audio can be compared with the engine's own (testing/audio.py).
@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus"])
def test_whole_file_in_each_format_is_the_engines_speech(quiet_predictor, reference, fmt):
    response = speech(quiet_predictor, TWO_SENTENCES, fmt)

    assert response.status_code == 200, response.text
    check_encoded(response.content, fmt, reference.speech_route(TWO_SENTENCES), 22050)


def test_pcm_is_raw_16_bit_at_the_model_rate(quiet_predictor, reference):
    response = speech(quiet_predictor, "Raw samples, please.", "pcm")

    assert response.headers["content-type"].startswith("audio/pcm")
    check_encoded(response.content, "pcm", reference.speech_route("Raw samples, please."), 22050)


def test_speed_shortens_the_audio(quiet_predictor, reference):
    normal = speech(quiet_predictor, TEN_SENTENCES[:120], "pcm")
    fast = speech(quiet_predictor, TEN_SENTENCES[:120], "pcm", speed=2.0)

    assert len(fast.content) < 0.7 * len(normal.content)
    check_encoded(fast.content, "pcm", reference.speech_route(TEN_SENTENCES[:120], speed=2.0), 22050)


def test_stream_starts_before_the_last_segment_is_synthesized(predictor):
    calls_before = predictor.metric("tts_batch_size_count")

    with predictor.stream(
        "/v1/audio/speech", json=speech_request(TEN_SENTENCES, "pcm", stream=True)
    ) as response:
        chunks = response.iter_bytes()
        first = next(chunks)
        synthesized_at_first_chunk = predictor.metric("tts_batch_size_count") - calls_before
        rest = b"".join(chunks)

    assert response.status_code == 200 and first
    assert synthesized_at_first_chunk < 10, "the first bytes waited for every segment"
    assert predictor.metric("tts_batch_size_count") - calls_before == 10
    assert len(first + rest) // 2 > 22050 * 10  # ten sentences of audio in the end
    assert predictor.metric("tts_first_packet_seconds_count") >= 1


def test_streamed_wav_is_the_engines_speech(quiet_predictor, reference):
    with quiet_predictor.stream(
        "/v1/audio/speech", json=speech_request(TEN_SENTENCES[:150], "wav", stream=True)
    ) as response:
        body = response.read()

    assert body[:4] == b"RIFF" and body[8:12] == b"WAVE"
    # Canonical 44-byte header with "unknown" sizes, then the samples as they were synthesized.
    check_encoded(body[44:], "pcm", reference.speech_route(TEN_SENTENCES[:150]), 22050)


def test_client_that_hangs_up_cancels_the_remaining_segments(predictor):
    text = " ".join([TEN_SENTENCES] * 3)  # thirty segments
    calls_before = predictor.metric("tts_batch_size_count")

    with predictor.stream("/v1/audio/speech", json=speech_request(text, "pcm", stream=True)) as response:
        next(response.iter_bytes())
    time.sleep(3.0)  # long enough for many more segments, had they gone on
    settled = predictor.metric("tts_batch_size_count") - calls_before
    time.sleep(1.0)

    assert settled < 30
    assert predictor.metric("tts_batch_size_count") - calls_before == settled, (
        "synthesis went on after the hang-up"
    )


def test_openai_client_works_against_the_server(quiet_predictor, reference):
    openai = pytest.importorskip("openai")  # in the test extras; skipped only where it cannot install
    client = openai.OpenAI(base_url=quiet_predictor.url + "/v1", api_key="not-needed")
    text = "Hello from the OpenAI client."

    reply = client.audio.speech.create(
        model="tts", voice="en_US-joe-medium", input=text, response_format="wav"
    )

    check_encoded(reply.content, "wav", reference.speech_route(text), 22050)


BAD = {
    "empty input": ({"input": "  "}, "empty"),
    "input over the limit": ({"input": "a" * 50_001}, "MAX_STREAM_TEXT_CHARS"),
    "unknown format": ({"input": "Hi.", "response_format": "aac"}, "aac"),
    "unknown voice": ({"input": "Hi.", "voice": "nonesuch"}, "nonesuch"),
    "speed too high": ({"input": "Hi.", "speed": 9}, "speed"),
    "unknown field": ({"input": "Hi.", "pitch": 2}, "pitch"),
    "unknown model": ({"input": "Hi.", "model": "tts-2"}, "tts-2"),
    "SSML element outside the subset": ({"input": "<speak><audio src='a.wav'/></speak>"}, "<audio>"),
    "malformed SSML": ({"input": "<speak>Hi.<break></speak>"}, "line 1"),
    "SSML with a DTD": ({"input": "<!DOCTYPE speak><speak>Hi.</speak>"}, "DTD"),
    "SSML declaring an entity": (
        {"input": '<speak><!DOCTYPE speak [<!ENTITY a "b">]>&a;</speak>'},
        "invalid SSML",
    ),
    "SSML break too long": ({"input": '<speak>Hi.<break time="30s"/></speak>'}, "longer than 10 s"),
    "timestamps on a raw stream": ({"input": "Hi.", "timestamps": "word", "stream": True}, "sse"),
    "timestamps without JSON": ({"input": "Hi.", "timestamps": "word"}, "Accept: application/json"),
    "timestamps of phonemes": (
        {"input": "Hi.", "timestamps": "phoneme", "stream_format": "sse"},
        "'phoneme'",
    ),
}


@pytest.mark.parametrize(("body", "reason"), BAD.values(), ids=BAD.keys())
def test_bad_speech_requests_get_400_with_reason(predictor, body, reason):
    response = predictor.post("/v1/audio/speech", json={"model": "tts", **body})

    assert response.status_code == 400, response.text
    assert reason in response.json()["error"]


def test_an_ssml_break_is_exact_silence_between_the_speech_of_its_two_sides(quiet_predictor, reference):
    before, after = "Hello there.", "General Kenobi."

    response = speech(quiet_predictor, f'<speak>{before}<break time="700ms"/>{after}</speak>', "pcm")

    assert response.status_code == 200, response.text
    gap = np.zeros(round(0.7 * 22050), dtype=np.float32)
    expected = np.concatenate([reference.speech_route(before), gap, reference.speech_route(after)])
    check_encoded(response.content, "pcm", expected, 22050)
    samples = np.frombuffer(response.content, dtype="<i2")
    start = len(reference.speech_route(before))
    assert not samples[start : start + len(gap)].any()


def test_ssml_prosody_rate_paces_its_span_and_sub_speaks_the_alias(quiet_predictor, reference):
    document = '<speak><prosody rate="50%">Slowly now.</prosody><sub alias="Wonderful.">W.</sub></speak>'

    response = speech(quiet_predictor, document, "pcm")

    assert response.status_code == 200, response.text
    expected = crossfade.join(
        [reference.speak("Slowly now.", length_scale=2.0), reference.speak("Wonderful.")], 22050, 50.0
    )
    check_encoded(response.content, "pcm", expected, 22050)


def test_ssml_streams_as_the_whole_file_does(quiet_predictor):
    document = '<speak>One.<break time="300ms"/><prosody rate="fast">Two and three.</prosody></speak>'

    whole = speech(quiet_predictor, document, "pcm")
    with quiet_predictor.stream(
        "/v1/audio/speech", json=speech_request(document, "pcm", stream=True)
    ) as response:
        streamed = response.read()

    assert whole.status_code == response.status_code == 200
    a, b = np.frombuffer(whole.content, "<i2"), np.frombuffer(streamed, "<i2")
    assert len(a) == len(b) and np.abs(a.astype(int) - b).max() <= 1


def test_ssml_refused_for_a_reason_known_before_synthesis_costs_no_engine_call(predictor):
    before = predictor.metric("tts_batch_size_count")

    response = predictor.post(
        "/v1/audio/speech",
        json=speech_request('<speak>Fine so far.<prosody volume="loud">Loud.</prosody></speak>', "wav"),
    )

    assert response.status_code == 400 and "'volume'" in response.json()["error"]
    assert predictor.metric("tts_batch_size_count") == before


TIMED = "Call 555-0100, ext. 42 now. Then the quick brown fox jumps over the lazy dog!"


def _timed(predictor, text: str, **fields) -> dict:
    response = predictor.post(
        "/v1/audio/speech",
        json=speech_request(text, "pcm", timestamps="word", **fields),
        headers={"accept": "application/json"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def test_word_timestamps_time_every_written_word_once_in_order_inside_the_audio(quiet_predictor, reference):
    answer = _timed(quiet_predictor, TIMED)

    words = answer["words"]
    pcm = base64.b64decode(answer["audio"])
    check_encoded(pcm, "pcm", reference.speech_route(TIMED), 22050)
    assert [w["word"] for w in words] == TIMED.split()
    assert all(0 <= w["start"] <= w["end"] <= answer["audio_seconds"] for w in words)
    assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(words))
    assert answer["audio_seconds"] == pytest.approx(len(pcm) / 2 / 22050, abs=1e-4)


def test_a_later_segments_word_times_are_its_own_shifted_by_where_the_crossfade_lays_it(
    quiet_predictor, reference
):
    first, second = "Hello there, friend.", "Then the quick brown fox jumps."

    joined = _timed(quiet_predictor, f"{first} {second}")["words"]
    alone = _timed(quiet_predictor, second)["words"]

    # The second segment starts where the first one's audio ends, less the crossfade's overlap.
    offset = (len(reference.speech_route(first)) - round(0.05 * 22050)) / 22050
    later = joined[len(first.split()) :]
    assert [w["word"] for w in later] == [w["word"] for w in alone]
    for a, b in zip(later, alone, strict=True):
        assert a["start"] == pytest.approx(b["start"] + offset, abs=1e-4)
        assert a["end"] == pytest.approx(b["end"] + offset, abs=1e-4)


def test_sse_timestamps_come_before_each_segments_audio_and_match_the_json_answer(quiet_predictor):
    text = "One small step. And one more, spoken second."
    whole = _timed(quiet_predictor, text)

    response = quiet_predictor.post(
        "/v1/audio/speech",
        json=speech_request(text, "pcm", timestamps="word", stream_format="sse"),
        timeout=120,
    )

    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "speech.audio.timestamps" and kinds[-1] == "speech.audio.done"
    assert kinds.count("speech.audio.timestamps") == 2  # one per segment
    assert [w for e in events if e["type"] == "speech.audio.timestamps" for w in e["words"]] == whole["words"]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert audio == base64.b64decode(whole["audio"])


def _peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def test_a_20000_character_text_streams_in_bounded_memory(start_predictor):
    # onnxruntime: the faster CPU engine; the property under test is the route's, not the engine's.
    predictor = start_predictor(ENGINE="onnx", CPU_THREADS="2", MAX_STREAM_TEXT_CHARS="25000")
    text = ((TEN_SENTENCES + " ") * (20_000 // len(TEN_SENTENCES) + 1))[:20_000]

    def stream(chars: int) -> tuple[httpx.Response, int]:
        received = 0
        body = speech_request(text[:chars], "pcm", stream=True)
        with predictor.stream("/v1/audio/speech", timeout=1200, json=body) as r:
            for chunk in r.iter_bytes():
                received += len(chunk)
        return r, received

    # A quarter of the length first, twice: allocator arenas, engine caches and buffers reach their
    # working size. Measured peak growth per stream: 114 MiB for the first 5,000 characters, 2 MiB for
    # the second, then 0-4 MiB for 10,000 and 20,000; after a single warm-up the 20,000-character run
    # still inherited ~25 MiB of that settling, right at the limit. What the long text adds on top is
    # what must stay small.
    stream(5_000)
    stream(5_000)
    before = _peak_rss_bytes(predictor.proc.pid)

    response, received = stream(20_000)

    growth = _peak_rss_bytes(predictor.proc.pid) - before
    whole_audio_as_float32 = received * 2  # int16 on the wire
    assert response.status_code == 200 and received > 22050 * 2 * 600  # over ten minutes of speech
    assert growth < 0.25 * whole_audio_as_float32, f"peak RSS grew {growth / 2**20:.0f} MiB"


# Bodies the document and the route must judge alike (runtime data aside: which model and voice names
# exist is the loaded artifact's, so those are checked only by the route and tested above).
DOCUMENTED = {
    "every field": {
        "input": "Every field at once.",
        "voice": {"id": "alloy"},
        "response_format": "pcm",
        "speed": 1.5,
        "stream": False,
        "stream_format": "sse",
        "instructions": "Ignored by a VITS voice.",
    },
    "nulls where the model allows them": {"input": "Hi.", "voice": None, "stream_format": None},
    "integer speed": {"input": "Hi.", "speed": 2, "response_format": "wav"},
    "raw stream": {"input": "Hi.", "stream_format": "audio", "response_format": "pcm"},
    "unknown field": {"input": "Hi.", "pitch": 2},
    "speed over the range": {"input": "Hi.", "speed": 4.5},
    "speed a string": {"input": "Hi.", "speed": "1"},
    "stream a string": {"input": "Hi.", "stream": "yes"},
    "unknown stream format": {"input": "Hi.", "stream_format": "xml"},
    "unknown response format": {"input": "Hi.", "response_format": "aac"},
    "blank input": {"input": "   "},
    "no input": {},
    "voice object with an extra key": {"input": "Hi.", "voice": {"id": "alloy", "x": 1}},
    "voice a number": {"input": "Hi.", "voice": 3},
}


@pytest.fixture(scope="module")
def speech_schema(predictor):
    from openapi_schema_validator import OAS30Validator

    document = predictor.get("/v2/openapi.json").json()
    return OAS30Validator(document["components"]["schemas"]["speech_request"])


def test_the_speech_schema_names_exactly_the_fields_the_route_reads(speech_schema):
    from predictor.api.speech import SpeechRequest

    assert set(speech_schema.schema["properties"]) == set(SpeechRequest.model_fields)


@pytest.mark.parametrize("fields", DOCUMENTED.values(), ids=DOCUMENTED.keys())
def test_the_openapi_document_accepts_a_speech_body_exactly_when_the_route_does(
    predictor, speech_schema, fields
):
    body = {"model": "tts", **fields}

    documented = speech_schema.is_valid(body)
    response = predictor.post("/v1/audio/speech", json=body)

    assert response.status_code in (200, 400), response.text
    assert documented == (response.status_code == 200), (
        f"document {'accepts' if documented else 'refuses'} it, the route answered {response.status_code}: "
        f"{response.text[:200]}"
    )
