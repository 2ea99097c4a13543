"""Bad input gets a 4xx that says what is wrong, over every route, and the server keeps serving."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from predictor.observability import logs
from testing.bodies import v2_request

GOOD = v2_request("Still serving.")


def binary_v2_body(payload: bytes) -> tuple[bytes, dict[str, str]]:
    """A v2 request using the binary tensor extension: one BYTES element, length-prefixed."""
    tensor = struct.pack("<I", len(payload)) + payload
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": len(tensor)},
                }
            ]
        }
    ).encode()
    return header + tensor, {
        "Inference-Header-Content-Length": str(len(header)),
        "content-type": "application/octet-stream",
    }


V2_CASES = {
    "empty text": (v2_request(""), "empty"),
    "whitespace only": (v2_request("   \n\t "), "empty"),
    "text over MAX_TEXT_CHARS": (v2_request("a" * 2001), "MAX_TEXT_CHARS"),
    "wrong datatype": (
        {"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}]},
        "BYTES",
    ),
    "wrong shape": (
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]}]},
        "shape",
    ),
    "shape disagrees with data": (
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["hi"]}]},
        "shape",
    ),
    "zero items": ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [0], "data": []}]}, "N >= 1"),
    "wrong input name": (
        {"inputs": [{"name": "prompt", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]},
        "'text'",
    ),
    "unknown parameter": (v2_request("Hello.", temperature=0.5), "temperature"),
    "length_scale out of range": (v2_request("Hello.", length_scale=50), "length_scale"),
    "noise_scale not a number": (v2_request("Hello.", noise_scale="loud"), "noise_scale"),
    "unknown voice": (v2_request("Hello.", voice="nobody"), "nobody"),
    "negative seed": (v2_request("Hello.", seed=-1), "seed"),
    "fractional seed": (v2_request("Hello.", seed=1.5), "seed"),
    "unknown output": ({**v2_request("Hello."), "outputs": [{"name": "spectrogram"}]}, "spectrogram"),
    "not a v2 request": ({"instances": [{"text": "hi"}]}, "inputs"),
}


@pytest.mark.parametrize(("body", "reason"), V2_CASES.values(), ids=V2_CASES.keys())
def test_v2_bad_input_gets_400_with_reason(predictor, body, reason):
    response = predictor.post("/v2/models/tts/infer", json=body)

    assert response.status_code == 400, response.text
    assert reason in response.json()["error"]
    assert predictor.post("/v2/models/tts/infer", json=GOOD).status_code == 200


def test_invalid_utf8_in_binary_tensor_gets_400(predictor):
    body, headers = binary_v2_body(b"caf\xe9 \xff")

    response = predictor.post("/v2/models/tts/infer", content=body, headers=headers)

    assert response.status_code == 400, response.text
    assert "UTF-8" in response.json()["error"]


def test_malformed_json_gets_400(predictor):
    response = predictor.post(
        "/v2/models/tts/infer", content=b'{"inputs": [', headers={"content-type": "application/json"}
    )

    assert response.status_code == 400


def test_unknown_model_gets_404(predictor):
    response = predictor.post("/v2/models/other/infer", json=GOOD)

    assert response.status_code == 404


V1_CASES = {
    "no instances": ({"text": "hi"}, "instances"),
    "instance without text": ({"instances": [{"words": "hi"}]}, "instances[0]"),
    "empty text": ({"instances": [{"text": " "}]}, "empty"),
    "text not a string": ({"instances": [{"text": 42}]}, "string"),
    "unknown parameter": ({"instances": [{"text": "hi"}], "parameters": {"speed": 2}}, "speed"),
}


@pytest.mark.parametrize(("body", "reason"), V1_CASES.values(), ids=V1_CASES.keys())
def test_v1_bad_input_gets_400_with_reason(predictor, body, reason):
    response = predictor.post("/v1/models/tts:predict", json=body)

    assert response.status_code == 400, response.text
    assert reason in response.json()["error"]


EVENT = {"ce-specversion": "1.0", "ce-source": "/tests", "ce-id": "bad-1", "content-type": "application/json"}
CE_CASES = {
    "missing type": ({**EVENT}, {"text": "hi"}, "CloudEvent"),
    "unsupported type": ({**EVENT, "ce-type": "com.example.other"}, {"text": "hi"}, "unsupported event type"),
    "our own reply type": (
        {**EVENT, "ce-type": "dev.tts-predictor.synthesized.v1"},
        {"text": "hi"},
        "unsupported event type",
    ),
    "data without text": ({**EVENT, "ce-type": "dev.tts-predictor.synthesize.v1"}, {"words": "hi"}, "text"),
    "empty text": ({**EVENT, "ce-type": "dev.tts-predictor.synthesize.v1"}, {"text": ""}, "empty"),
    "unknown field": (
        {**EVENT, "ce-type": "dev.tts-predictor.synthesize.v1"},
        {"text": "hi", "pitch": 3},
        "pitch",
    ),
}


@pytest.mark.parametrize(("headers", "data", "reason"), CE_CASES.values(), ids=CE_CASES.keys())
def test_malformed_cloudevent_gets_400(predictor, headers, data, reason):
    response = predictor.post("/v1/models/tts:predict", headers=headers, content=json.dumps(data))

    assert response.status_code == 400, response.text
    assert reason in response.json()["error"]


@pytest.mark.parametrize("body", [b'{"text": ', b"[" * 2000], ids=["cut short", "nested too deep"])
def test_binary_cloudevent_whose_data_is_not_json_gets_400_saying_so_plainly(predictor, body):
    headers = {**EVENT, "ce-type": "dev.tts-predictor.synthesize.v1"}
    response = predictor.post("/v1/models/tts:predict", headers=headers, content=body)

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error.startswith("event data is not valid JSON: "), error
    assert "BadRequest" not in error and "unmarshall" not in error


def test_structured_cloudevent_that_is_not_json_gets_400(predictor):
    response = predictor.post(
        "/v1/models/tts:predict",
        headers={"content-type": "application/cloudevents+json"},
        content=b"{not json",
    )

    assert response.status_code == 400


def test_grpc_bad_input_is_invalid_argument(predictor):
    client = triton_grpc.InferenceServerClient(predictor.grpc)
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"   "], dtype=object))

    with pytest.raises(InferenceServerException) as caught:
        client.infer("tts", [text])

    assert "INVALID_ARGUMENT" in str(caught.value.status()) and "empty" in caught.value.message()
    good = triton_grpc.InferInput("text", [1], "BYTES")
    good.set_data_from_numpy(np.array([b"Fine."], dtype=object))
    assert client.infer("tts", [good]).as_numpy("audio_length")[0] > 0


def test_grpc_string_parameter_that_is_not_a_number_is_invalid_argument(predictor):
    client = triton_grpc.InferenceServerClient(predictor.grpc)
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Hello."], dtype=object))

    with pytest.raises(InferenceServerException) as caught:
        client.infer("tts", [text], parameters={"length_scale": "fast"})

    assert "length_scale" in caught.value.message()


def test_more_texts_than_max_batch_items_get_400_naming_the_limit(plain_predictor):
    at_limit = plain_predictor.post("/v2/models/tts/infer", json=v2_request("One.", "Two."))
    over = plain_predictor.post("/v2/models/tts/infer", json=v2_request("One.", "Two.", "Three."))

    assert at_limit.status_code == 200, at_limit.text
    assert over.status_code == 400
    assert "3 texts" in over.json()["error"] and "MAX_BATCH_ITEMS=2" in over.json()["error"]


def test_a_letter_under_two_thousand_accents_costs_one_engine_call_on_the_speech_route(predictor):
    # Issue 25's attack: 1,701 one-character segments kept a core busy for about seven minutes.
    calls_before = predictor.metric("tts_batch_size_count")
    engine_before = predictor.metric("tts_synthesis_seconds_sum")

    response = predictor.post(
        "/v1/audio/speech",
        json={"model": "tts", "input": "a" + "\u0301" * 2000, "response_format": "wav"},
        timeout=30,
    )

    assert response.status_code == 200, response.text
    assert predictor.metric("tts_batch_size_count") - calls_before == 1
    assert predictor.metric("tts_synthesis_seconds_sum") - engine_before < 1.0


def _new_log_lines(predictor, before: int) -> list[dict]:
    return [json.loads(line) for line in predictor.logs().splitlines()[before:] if line.strip()]


def test_repeated_client_errors_log_a_few_lines_without_a_traceback(predictor):
    before = len(predictor.logs().splitlines())
    client = triton_grpc.InferenceServerClient(predictor.grpc)
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Hello."], dtype=object))

    for _ in range(20):
        with pytest.raises(InferenceServerException) as caught:
            client.infer("no-such-model", [text])
        assert "NOT_FOUND" in str(caught.value.status())
        assert predictor.post("/v2/models/tts/infer", json={"inputs": []}).status_code == 400

    lines = _new_log_lines(predictor, before)
    assert not [line for line in lines if "exc" in line], "a client error was logged with a traceback"
    # 40 bad requests: the gRPC ones log one line each up to the burst, REST 400s none.
    assert 1 <= len(lines) <= logs.CLIENT_ERROR_BURST, lines
    assert all(line["logger"] == "predictor.client_errors" and "NOT_FOUND" in line["msg"] for line in lines)


def test_a_speed_that_is_not_a_number_is_400_saying_it_must_be_finite(predictor):
    body = b'{"model": "tts", "input": "Hello.", "speed": NaN}'

    response = predictor.post("/v1/audio/speech", content=body, headers={"content-type": "application/json"})

    assert response.status_code == 400, response.text
    assert "speed" in response.json()["error"] and "finite" in response.json()["error"]


@pytest.mark.parametrize("seed", [2**80, -1])
@pytest.mark.parametrize("route", ["v2", "v1"])
def test_a_seed_out_of_range_is_400_naming_the_range_and_the_integer_sent(predictor, seed, route):
    # v1 goes through orjson, which reads an integer beyond 64 bits as a float.
    if route == "v2":
        body = {**v2_request("Hello."), "parameters": {"seed": seed}}
        response = predictor.post("/v2/models/tts/infer", json=body)
    else:
        body = {"instances": [{"text": "Hello."}], "parameters": {"seed": seed}}
        response = predictor.post("/v1/models/tts:predict", json=body)

    assert response.status_code == 400, response.text
    assert f"parameter seed={seed} is out of range [0, 2**62)" in response.json()["error"]
