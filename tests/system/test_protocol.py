"""The protocol contract over real sockets: v2 REST and gRPC (KServe's and Triton's clients), v1, CloudEvents."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from testing.audio import check_encoded, check_samples
from testing.bodies import audio_of, cloudevent_headers, v1_request, v2_grpc_request, v2_request
from testing.streams import stream_one

SENTENCE = "The quick brown fox jumps over the lazy dog."
QUIET = {"noise_scale": 0.0, "noise_w": 0.0}


def test_v2_rest_returns_the_engines_speech(predictor, reference):
    response = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE, **QUIET))

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["parameters"]["sample_rate"] == 22050
    check_samples(audio_of(body), reference.speak(SENTENCE))


def test_longer_text_gives_longer_audio(predictor):
    short = predictor.post("/v2/models/tts/infer", json=v2_request("Hello.", **QUIET)).json()
    long = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE + " " + SENTENCE, **QUIET)).json()

    assert len(audio_of(long)) > 2 * len(audio_of(short))


def test_zero_noise_is_identical_across_calls(predictor):
    first = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE, **QUIET)).json()
    second = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE, **QUIET)).json()

    np.testing.assert_array_equal(audio_of(first), audio_of(second))


def test_batch_is_zero_padded_to_longest_item(predictor):
    body = predictor.post("/v2/models/tts/infer", json=v2_request("Hi.", SENTENCE, **QUIET)).json()

    outputs = {o["name"]: o for o in body["outputs"]}
    lengths = outputs["audio_length"]["data"]
    audio = np.asarray(outputs["audio"]["data"], dtype=np.float32).reshape(outputs["audio"]["shape"])
    assert outputs["audio"]["shape"] == [2, max(lengths)]
    assert lengths[0] < lengths[1]
    assert not audio[0, lengths[0] :].any()


def test_length_scale_slows_speech(predictor, reference):
    normal = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE, **QUIET)).json()
    slow = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE, length_scale=1.5, **QUIET)).json()

    assert len(audio_of(slow)) > 1.3 * len(audio_of(normal))
    check_samples(audio_of(slow), reference.speak(SENTENCE, length_scale=1.5))


def test_model_metadata_describes_tensors_and_sample_rate(predictor):
    meta = predictor.get("/v2/models/tts").json()

    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert [o["name"] for o in meta["outputs"]] == ["audio", "audio_length", "words"]
    document = predictor.get("/v2/openapi.json").json()
    requestable = document["components"]["schemas"]["request_output"]["properties"]["name"]["enum"]
    assert requestable == [o["name"] for o in meta["outputs"]]
    assert meta["parameters"]["sample_rate"] == 22050


def triton_http_infer(predictor, binary: bool) -> triton_http.InferResult:
    """SENTENCE through Triton's HTTP client, tensors and outputs binary or JSON."""
    client = triton_http.InferenceServerClient(f"127.0.0.1:{predictor.http_port}")
    text = triton_http.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([SENTENCE.encode()], dtype=object), binary_data=binary)
    outputs = [triton_http.InferRequestedOutput(n, binary_data=binary) for n in ("audio", "audio_length")]
    return client.infer("tts", [text], outputs=outputs, parameters=QUIET)


def test_triton_http_client_with_binary_tensors(predictor):
    result = triton_http_infer(predictor, binary=True)

    rest = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE, **QUIET)).json()
    length = int(result.as_numpy("audio_length")[0])
    np.testing.assert_array_equal(result.as_numpy("audio")[0, :length], audio_of(rest))
    assert result.get_response()["parameters"]["sample_rate"] == 22050


def test_triton_http_client_json_only(predictor, reference):
    result = triton_http_infer(predictor, binary=False)

    assert "data" in result.get_output("audio")
    check_samples(
        result.as_numpy("audio")[0, : int(result.as_numpy("audio_length")[0])], reference.speak(SENTENCE)
    )


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "typed"])
def test_triton_grpc_client_matches_rest(predictor, raw):
    client = triton_grpc.InferenceServerClient(predictor.grpc)
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([SENTENCE.encode()], dtype=object))
    if raw:
        # Triton's client sends floats as double_param, a field KServe's proto does not declare.
        result = client.infer("tts", [text], parameters={"noise_scale": 0.0, "noise_w": 0.0})
        audio, lengths = result.as_numpy("audio"), result.as_numpy("audio_length")
    else:
        audio, lengths = grpc_typed_infer(predictor.grpc, SENTENCE, {"noise_scale": "0", "noise_w": "0"})

    rest = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE, **QUIET)).json()
    np.testing.assert_array_equal(audio[0, : int(lengths[0])], audio_of(rest))


def grpc_typed_infer(target: str, text: str, params: dict[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """A v2 gRPC request with typed contents (no raw tensors) and string parameters.

    Triton's generated stubs are used because KServe's and Triton's protos share the `inference`
    package and cannot both be imported into one process.
    """
    import grpc
    from tritonclient.grpc.service_pb2_grpc import GRPCInferenceServiceStub

    request = v2_grpc_request(text, **params)
    with grpc.insecure_channel(target) as channel:
        response = GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert not response.raw_output_contents, "typed request must get typed outputs"
    outputs = {o.name: o for o in response.outputs}
    audio = np.asarray(outputs["audio"].contents.fp32_contents, dtype=np.float32).reshape(
        list(outputs["audio"].shape)
    )
    assert response.parameters["sample_rate"].int64_param == 22050
    return audio, np.asarray(outputs["audio_length"].contents.int64_contents)


def test_kserve_rest_and_grpc_clients(predictor):
    # KServe's gRPC client cannot share a process with Triton's (see grpc_typed_infer), so it runs apart.
    script = Path(__file__).resolve().parents[2] / "testing" / "kserve_clients.py"

    run = subprocess.run(
        [sys.executable, str(script), predictor.url, predictor.grpc, SENTENCE],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert result["rest_shape"] == result["grpc_shape"] and result["identical"]
    rest = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE, **QUIET)).json()
    assert result["rest_length"] == len(audio_of(rest))


def test_v1_predict_returns_wav_per_instance(predictor, reference):
    response = predictor.post(
        "/v1/models/tts:predict",
        json=v1_request("Hello.", SENTENCE, **QUIET),
    )

    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert len(predictions) == 2
    check_encoded(base64.b64decode(predictions[0]["wav_base64"]), "wav", reference.speak("Hello."), 22050)
    check_encoded(base64.b64decode(predictions[1]["wav_base64"]), "wav", reference.speak(SENTENCE), 22050)


def test_v1_model_status_is_ready(predictor):
    assert predictor.get("/v1/models/tts").status_code == 200


# --- CloudEvents -----------------------------------------------------------------------------
EVENT_TYPE = "dev.tts-predictor.synthesize.v1"


def test_cloudevent_binary_mode_round_trip(predictor, reference):
    headers = {
        "ce-specversion": "1.0",
        "ce-type": EVENT_TYPE,
        "ce-source": "/tests",
        "ce-id": "evt-binary-1",
        "content-type": "application/json",
    }

    response = predictor.post(
        "/v1/models/tts:predict", headers=headers, content=json.dumps({"text": SENTENCE, **QUIET})
    )

    assert response.status_code == 200, response.text
    assert response.headers["ce-type"] != EVENT_TYPE
    assert response.headers["ce-type"] == "dev.tts-predictor.synthesized.v1"
    assert response.headers["ce-inreplyto"] == "evt-binary-1"
    data = response.json()
    check_encoded(base64.b64decode(data["audio_base64"]), data["format"], reference.speak(SENTENCE), 22050)


def test_cloudevent_structured_mode_round_trip(predictor, reference):
    event = {
        "specversion": "1.0",
        "type": EVENT_TYPE,
        "source": "/tests",
        "id": "evt-structured-1",
        "datacontenttype": "application/json",
        "data": {"text": SENTENCE, **QUIET},
    }

    response = predictor.post(
        "/v1/models/tts:predict",
        headers={"content-type": "application/cloudevents+json"},
        content=json.dumps(event),
    )

    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/cloudevents+json")
    reply = response.json()
    assert reply["type"] != EVENT_TYPE and reply["inreplyto"] == "evt-structured-1"
    assert reply["data"]["sample_rate"] == 22050 and reply["data"]["audio_seconds"] > 1
    expected = reference.speak(SENTENCE)
    check_encoded(base64.b64decode(reply["data"]["audio_base64"]), reply["data"]["format"], expected, 22050)


# --- engines and seeds -----------------------------------------------------------------------
def test_seed_reproduces_noisy_audio_over_rest_and_grpc(predictor):
    seeded = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE, seed=42)).json()
    again = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE, seed=42)).json()
    audio, lengths = grpc_typed_infer(predictor.grpc, SENTENCE, {"seed": "42"})

    np.testing.assert_array_equal(audio_of(seeded), audio_of(again))
    np.testing.assert_array_equal(audio[0, : int(lengths[0])], audio_of(seeded))


@pytest.fixture(scope="module")
def onnx(start_predictor):
    """The default engine on CPU (ENGINE=auto picks onnxruntime)."""
    return start_predictor(ENGINE="auto")


def test_onnx_engine_serves_the_same_speech(onnx, predictor):
    ours = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE, **QUIET)).json()
    reference = onnx.post("/v2/models/tts/infer", json=v2_request(SENTENCE, **QUIET)).json()

    assert onnx.get("/v2/models/tts").json()["platform"] == "onnx"
    assert len(audio_of(ours)) == len(audio_of(reference))
    assert np.abs(audio_of(ours) - audio_of(reference)).max() <= 1e-3


def test_a_seed_gives_the_same_noisy_speech_on_the_default_engine_as_on_torch(onnx, predictor):
    ours = predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE, seed=42)).json()
    default = onnx.post("/v2/models/tts/infer", json=v2_request(SENTENCE, seed=42))
    again, lengths = grpc_typed_infer(onnx.grpc, SENTENCE, {"seed": "42"})

    assert default.status_code == 200, default.text
    assert len(audio_of(default.json())) == len(audio_of(ours))
    assert np.abs(audio_of(default.json()) - audio_of(ours)).max() <= 1e-3
    np.testing.assert_array_equal(again[0, : int(lengths[0])], audio_of(default.json()))


def test_an_inline_event_delivered_twice_without_a_seed_gets_the_same_audio_on_the_default_engine(onnx):
    data = json.dumps({"text": SENTENCE, "format": "wav"})  # the voice's own noise: no seed, no QUIET

    first = onnx.post("/v1/models/tts:predict", headers=cloudevent_headers("twice-1"), content=data)
    again = onnx.post("/v1/models/tts:predict", headers=cloudevent_headers("twice-1"), content=data)
    other = onnx.post("/v1/models/tts:predict", headers=cloudevent_headers("twice-2"), content=data)

    assert first.status_code == again.status_code == other.status_code == 200, first.text
    assert first.json()["audio_base64"] == again.json()["audio_base64"]
    assert first.json()["sha256"] != other.json()["sha256"]


# --- SSML on v2 and CloudEvents (parameter ssml / data.ssml) --------------------------------------
SSML_SIDES = ("Hello there.", "General Kenobi.")
SSML_DOCUMENT = (
    f'<speak>{SSML_SIDES[0]}<break time="400ms"/><prosody rate="50%">{SSML_SIDES[1]}</prosody></speak>'
)


def _ssml_expected(reference) -> np.ndarray:
    return np.concatenate(
        [
            reference.speech_route(SSML_SIDES[0]),
            np.zeros(round(0.4 * 22050), dtype=np.float32),
            reference.speech_route(SSML_SIDES[1], speed=0.5),
        ]
    )


def test_an_ssml_text_over_v2_rest_and_grpc_is_the_speech_routes_audio(predictor, reference):
    rest = predictor.post("/v2/models/tts/infer", json=v2_request(SSML_DOCUMENT, ssml=True, **QUIET))
    client = triton_grpc.InferenceServerClient(predictor.grpc)
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([SSML_DOCUMENT.encode()], dtype=object))
    grpc_result = client.infer("tts", [text], parameters={"ssml": True, "noise_scale": 0.0, "noise_w": 0.0})

    assert rest.status_code == 200, rest.text
    check_samples(audio_of(rest.json()), _ssml_expected(reference))
    grpc_audio = grpc_result.as_numpy("audio")[0, : int(grpc_result.as_numpy("audio_length")[0])]
    np.testing.assert_array_equal(grpc_audio, audio_of(rest.json()))


def test_an_ssml_event_is_the_speech_routes_audio(predictor, reference):
    data = json.dumps({"text": SSML_DOCUMENT, "ssml": True, "format": "wav", **QUIET})

    response = predictor.post("/v1/models/tts:predict", headers=cloudevent_headers("ssml-1"), content=data)

    assert response.status_code == 200, response.text
    check_encoded(base64.b64decode(response.json()["audio_base64"]), "wav", _ssml_expected(reference), 22050)


@pytest.mark.parametrize(
    ("parameters", "text", "named"),
    [
        ({"ssml": True}, "<speak><audio/></speak>", "<audio>"),
        ({"ssml": "yes"}, "<speak>Hi.</speak>", "parameter ssml must be a boolean"),
        ({"ssml": True}, "Hi <b>there</b>", "starts with <speak>"),
    ],
)
def test_bad_ssml_over_v2_is_400_naming_the_problem_before_any_engine_call(
    predictor, parameters, text, named
):
    before = predictor.metric("tts_batch_size_count")

    response = predictor.post("/v2/models/tts/infer", json=v2_request(text, **parameters))

    assert response.status_code == 400 and named in response.json()["error"], response.text
    assert predictor.metric("tts_batch_size_count") == before


def test_an_ssml_text_over_model_stream_infer_streams_the_audio_v2_answers_whole(predictor):
    results = stream_one(predictor.grpc, SSML_DOCUMENT, parameters={"ssml": True, **QUIET})
    whole = predictor.post("/v2/models/tts/infer", json=v2_request(SSML_DOCUMENT, ssml=True, **QUIET)).json()

    assert results and not any(isinstance(r, Exception) for r in results), results[:1]
    assert len(results) > 2  # a piece per window and the breaks' runs, not one whole answer
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in results]
    assert finals == [False] * (len(results) - 1) + [True]
    streamed = np.concatenate([r.as_numpy("audio")[0] for r in results])
    assert len(streamed) == len(audio_of(whole))
    assert np.abs(streamed - audio_of(whole)).max() <= 1e-3
