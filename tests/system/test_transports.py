"""One speech pipeline under every transport (serving/pipeline.py): the same text with the same seed is
the same PCM over v2 REST (JSON and binary), v2 gRPC, Triton's ModelStreamInfer, v1, CloudEvents and
the speech route, whole or streamed; each request leaves one shadow record; word timestamps over v2
(the requested output ``words``) and CloudEvents (data.timestamps) are the speech route's."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import soundfile
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from predictor.audio import codecs
from predictor.shadow import recorder as recording
from testing.bodies import audio_of, cloudevent_headers, speech_request, v1_request, v2_request
from testing.streams import stream_one

# Two sentences, so two segments joined by the crossfade; the default engine's own noise, seeded.
TEXT = "Every transport speaks alike. The same seed gives the same samples, 42 times over."
SEED = 1234
SAMPLE_RATE = 22050
# A window decoded with its context equals the whole decode to about 1e-5 (test_streaming.py); in
# 16-bit PCM that is a step or two.
WINDOW_ATOL = 1e-4


@pytest.fixture(scope="module")
def default_predictor(start_predictor):
    """The default engine on CPU (ENGINE=auto: onnxruntime), recording every request to stdout."""
    return start_predictor(
        ENGINE="auto", SHADOW_SINK="stdout", REVISION="rev-transports", SHADOW_FLUSH_S="0.2"
    )


def _records(p, ids: list[str]) -> dict[str, list[dict]]:
    def found() -> dict[str, list[dict]]:
        got: dict[str, list[dict]] = {i: [] for i in ids}
        for line in p.logs().splitlines():
            if line.startswith('{"v":1,'):
                record = json.loads(line)
                if record["id"] in got:
                    got[record["id"]].append(record)
        return got if all(got.values()) else {}

    return p.wait_for(found, 30, f"records {ids}", interval=0.2)


def _pcm16(audio: np.ndarray) -> np.ndarray:
    return np.frombuffer(codecs.encode(audio, SAMPLE_RATE, "pcm"), dtype="<i2")


def _stream_infer(target: str, parameters: dict, request_id: str) -> np.ndarray:
    results = stream_one(target, TEXT, {"x-request-id": request_id}, parameters=parameters, request_id="only")
    assert results and not any(isinstance(r, Exception) for r in results), results[:1]
    return np.concatenate([r.as_numpy("audio")[0] for r in results])


def test_one_seeded_text_is_the_same_pcm_over_every_transport_and_each_leaves_one_record(default_predictor):
    p = default_predictor
    ids = {
        name: f"transports-{name}"
        for name in ("v2", "binary", "grpc", "stream", "v1", "event", "speech", "sse")
    }

    def header(name: str) -> dict[str, str]:
        return {"x-request-id": ids[name]}

    rest = p.post("/v2/models/tts/infer", json=v2_request(TEXT, seed=SEED), headers=header("v2"))
    assert rest.status_code == 200, rest.text
    reference = audio_of(rest.json())

    binary_client = triton_http.InferenceServerClient(p.url.removeprefix("http://"))
    text = triton_http.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([TEXT.encode()], dtype=object), binary_data=True)
    binary = binary_client.infer(
        "tts",
        [text],
        outputs=[triton_http.InferRequestedOutput("audio", binary_data=True)],
        parameters={"seed": SEED},
        headers=header("binary"),
    )
    grpc_client = triton_grpc.InferenceServerClient(p.grpc)
    grpc_text = triton_grpc.InferInput("text", [1], "BYTES")
    grpc_text.set_data_from_numpy(np.array([TEXT.encode()], dtype=object))
    grpc = grpc_client.infer("tts", [grpc_text], parameters={"seed": SEED}, headers=header("grpc"))
    streamed = _stream_infer(p.grpc, {"seed": SEED}, ids["stream"])
    v1 = p.post("/v1/models/tts:predict", json=v1_request(TEXT, seed=SEED), headers=header("v1"))
    event = p.post(
        "/v1/models/tts:predict",
        headers={**cloudevent_headers("transports-1"), **header("event")},
        content=json.dumps({"text": TEXT, "format": "pcm", "seed": SEED}),
    )
    speech = p.post("/v1/audio/speech", json=speech_request(TEXT, "pcm", seed=SEED), headers=header("speech"))
    sse = p.post(
        "/v1/audio/speech",
        json=speech_request(TEXT, "pcm", seed=SEED, stream_format="sse"),
        headers=header("sse"),
        timeout=120,
    )

    # Whole answers: exactly the same samples (16-bit ones exactly the same quantization of them).
    np.testing.assert_array_equal(binary.as_numpy("audio")[0, : len(reference)], reference)
    assert binary.as_numpy("audio").shape == (1, len(reference))
    np.testing.assert_array_equal(
        grpc.as_numpy("audio")[0, : int(grpc.as_numpy("audio_length")[0])], reference
    )
    assert v1.status_code == event.status_code == speech.status_code == sse.status_code == 200
    wav = base64.b64decode(v1.json()["predictions"][0]["wav_base64"])
    expected_wav, _ = soundfile.read(io.BytesIO(_wav(reference)), dtype="int16")
    np.testing.assert_array_equal(soundfile.read(io.BytesIO(wav), dtype="int16")[0], expected_wav)
    np.testing.assert_array_equal(
        np.frombuffer(base64.b64decode(event.json()["audio_base64"]), "<i2"), _pcm16(reference)
    )
    np.testing.assert_array_equal(np.frombuffer(speech.content, "<i2"), _pcm16(reference))
    # Streams, window by window: the same length, the same samples within a window's rounding.
    assert len(streamed) == len(reference)
    assert np.abs(streamed - reference).max() <= WINDOW_ATOL
    events = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")]
    sse_pcm = np.frombuffer(
        b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"), "<i2"
    )
    assert len(sse_pcm) == len(reference)
    assert np.abs(sse_pcm.astype(np.int32) - _pcm16(reference)).max() <= round(WINDOW_ATOL * 32767) + 1

    # A streamed request's record is <the call's id>/<the request's id> (api/stream_infer.py).
    record_ids = {**ids, "stream": ids["stream"] + "/only"}
    records = _records(p, list(record_ids.values()))
    assert {name: len(records[i]) for name, i in record_ids.items()} == dict.fromkeys(ids, 1)
    segments = recording.text_sha256(
        ["Every transport speaks alike.", "The same seed gives the same samples, 42 times over."]
    )
    assert {name: records[i][0]["text_sha256"] for name, i in record_ids.items()} == dict.fromkeys(
        ids, segments
    )
    assert all(records[i][0]["status"] == 200 and records[i][0]["items"] == 2 for i in record_ids.values())


def _wav(audio: np.ndarray) -> bytes:
    # As api/v1.wav_bytes writes it (that module loads KServe's protos, which this process cannot
    # hold beside Triton's).
    buf = io.BytesIO()
    soundfile.write(buf, audio, SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def test_another_seed_or_none_gives_other_audio_on_every_whole_transport(default_predictor):
    p = default_predictor
    seeded = audio_of(p.post("/v2/models/tts/infer", json=v2_request(TEXT, seed=SEED)).json())
    other = audio_of(p.post("/v2/models/tts/infer", json=v2_request(TEXT, seed=SEED + 1)).json())
    fresh = p.post("/v1/audio/speech", json=speech_request(TEXT, "pcm")).content

    assert other.shape != seeded.shape or not np.array_equal(other, seeded)
    assert np.frombuffer(fresh, "<i2").shape != _pcm16(seeded).shape or fresh != _pcm16(seeded).tobytes()


# --- word timestamps over v2 and CloudEvents ---------------------------------------------------
def _speech_words(p, text: str) -> list[dict]:
    response = p.post(
        "/v1/audio/speech",
        json=speech_request(text, "pcm", seed=SEED, timestamps="word"),
        headers={"accept": "application/json"},
    )
    assert response.status_code == 200, response.text
    return response.json()["words"]


def test_v2_words_output_gives_the_speech_routes_timestamps_over_rest_binary_and_grpc(default_predictor):
    p = default_predictor
    texts = [TEXT, "A second text, Dr. Smith's."]
    expected = [_speech_words(p, t) for t in texts]

    body = v2_request(*texts, seed=SEED)
    body["outputs"] = [{"name": "audio"}, {"name": "audio_length"}, {"name": "words"}]
    rest = p.post("/v2/models/tts/infer", json=body)
    assert rest.status_code == 200, rest.text
    outputs = {o["name"]: o for o in rest.json()["outputs"]}
    assert outputs["words"]["datatype"] == "BYTES" and outputs["words"]["shape"] == [2]
    rest_words = [json.loads(d) for d in outputs["words"]["data"]]

    binary_client = triton_http.InferenceServerClient(p.url.removeprefix("http://"))
    text = triton_http.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object), binary_data=True)
    binary = binary_client.infer(
        "tts",
        [text],
        outputs=[triton_http.InferRequestedOutput(n, binary_data=True) for n in ("audio", "words")],
        parameters={"seed": SEED},
    )
    grpc_client = triton_grpc.InferenceServerClient(p.grpc)
    grpc_text = triton_grpc.InferInput("text", [2], "BYTES")
    grpc_text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    grpc = grpc_client.infer(
        "tts", [grpc_text], outputs=[triton_grpc.InferRequestedOutput("words")], parameters={"seed": SEED}
    )

    assert rest_words[0] == expected[0]
    # A request's segments are numbered through it, so the second text's noise (and with it its
    # durations) is not what it gets alone: its words are the same words, in order, inside its audio.
    assert [w["word"] for w in rest_words[1]] == [w["word"] for w in expected[1]] == texts[1].split()
    second_seconds = outputs["audio_length"]["data"][1] / SAMPLE_RATE
    assert all(0 <= w["start"] <= w["end"] <= second_seconds for w in rest_words[1])
    assert [json.loads(d) for d in binary.as_numpy("words")] == rest_words
    assert [json.loads(d) for d in grpc.as_numpy("words")] == rest_words
    np.testing.assert_array_equal(
        binary.as_numpy("audio")[0, : outputs["audio_length"]["data"][0]], audio_of(rest.json())
    )


def test_v2_answers_without_words_unless_asked_for_them(default_predictor):
    rest = default_predictor.post("/v2/models/tts/infer", json=v2_request("No words here.", seed=SEED)).json()

    assert [o["name"] for o in rest["outputs"]] == ["audio", "audio_length"]


def test_a_cloudevent_asking_for_timestamps_gets_the_words_in_its_inline_reply(default_predictor):
    p = default_predictor
    data = {"text": TEXT, "format": "pcm", "seed": SEED, "timestamps": "word"}

    reply = p.post("/v1/models/tts:predict", headers=cloudevent_headers("timed-1"), content=json.dumps(data))

    assert reply.status_code == 200, reply.text
    assert reply.json()["words"] == _speech_words(p, TEXT)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (
            {"text": TEXT, "timestamps": "phoneme"},
            "data.timestamps 'phoneme' is not supported; accepted: word",
        ),
        (
            {"text": TEXT, "timestamps": "word", "output": "s3://outputs/timed.wav"},
            "data.timestamps needs an inline reply",
        ),
    ],
)
def test_a_cloudevent_asking_for_timestamps_it_cannot_get_is_400_naming_why(default_predictor, data, reason):
    reply = default_predictor.post(
        "/v1/models/tts:predict", headers=cloudevent_headers("timed-bad"), content=json.dumps(data)
    )

    assert reply.status_code == 400 and reason in reply.text, reply.text


def test_a_stream_asking_for_words_is_refused_naming_model_infer(default_predictor):
    results = stream_one(default_predictor.grpc, TEXT, outputs=[triton_grpc.InferRequestedOutput("words")])

    assert len(results) == 1 and isinstance(results[0], Exception)
    assert "output 'words' (word timestamps) needs ModelInfer" in str(results[0])


# --- engine workers (ENGINE_WORKERS; that two calls run at once: tests/unit/test_core.py) ---------
def test_two_engine_workers_answer_concurrent_requests_with_the_audio_one_worker_gives(
    start_predictor, default_predictor
):
    from concurrent.futures import ThreadPoolExecutor

    two = start_predictor(ENGINE="auto", ENGINE_WORKERS="2", CPU_THREADS="2")
    # Ready on the solo worker's copy; the workers' two copies come after (not part of the cold start).
    two.wait_for_copies(60)
    assert two.metric("tts_cold_start_seconds", phase="total") > 0
    texts = [f"Request number {n} of four, sent at once." for n in range(1, 5)]
    alone = [
        audio_of(default_predictor.post("/v2/models/tts/infer", json=v2_request(t, seed=SEED)).json())
        for t in texts
    ]

    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(lambda t: two.post("/v2/models/tts/infer", json=v2_request(t, seed=SEED)), texts)
        )

    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    for text, answer, expected in zip(texts, answers, alone, strict=True):
        audio = audio_of(answer.json())
        # Each worker's onnxruntime has one intra-op thread where the one worker has two: the same
        # graph and noise, summed in another order.
        assert len(audio) == len(expected), text
        assert np.abs(audio - expected).max() <= 1e-4, text


# --- lanes (engine/lanes.py): one request's sentences side by side on two CPU threads -------------
def test_two_cpu_threads_run_a_requests_sentences_in_one_call_with_the_audio_one_thread_gives(
    start_predictor, default_predictor
):
    two = start_predictor(ENGINE="auto", CPU_THREADS="2")
    # The lanes' one-thread copy is made once nothing has run for a moment after ready, not beside the
    # requests a cold start woke up for (about a second of speech here; making the copy takes less).
    woke = two.post("/v2/models/tts/infer", json=v2_request(" ".join([TEXT] * 6), seed=SEED))
    assert woke.status_code == 200 and two.metric("tts_cold_start_seconds", phase="copies") == 0
    two.wait_for_copies(60)
    assert '"lanes": true' in two.logs()
    text = "One sentence first. Then a second one, a little longer. And a third to end it."
    expected = audio_of(
        default_predictor.post("/v2/models/tts/infer", json=v2_request(text, seed=SEED)).json()
    )
    calls = two.samples("tts_batch_size")

    answer = two.post("/v2/models/tts/infer", json=v2_request(text, seed=SEED))
    again = two.post("/v2/models/tts/infer", json=v2_request(text, seed=SEED))

    assert answer.status_code == again.status_code == 200, answer.text
    after = two.samples("tts_batch_size")
    # Two requests, each one engine call of its three sentences (one thread makes three calls).
    assert after["tts_batch_size_count"] - calls.get("tts_batch_size_count", 0) == 2
    assert after["tts_batch_size_sum"] - calls.get("tts_batch_size_sum", 0) == 6
    audio = audio_of(answer.json())
    # One thread sums the same graph in another order than two; the same request, the same samples.
    assert len(audio) == len(expected) and np.abs(audio - expected).max() <= 1e-4
    np.testing.assert_array_equal(audio_of(again.json()), audio)
