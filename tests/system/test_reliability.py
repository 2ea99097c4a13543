"""Reliability at the edges of the protocols: the same 400 for the same bad input on every transport,
a well-formed 500 when something unexpected breaks, versioned routes, {"error"} bodies, and the limits
that protect the pod (body size, headers, slow clients), over real sockets against real processes."""

from __future__ import annotations

import json
import os
import socket
import struct
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2 as pb  # KServe's stubs and Triton's cannot share a process
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

REQUEST_TYPE = "dev.tts-predictor.synthesize.v1"
FORMATS = ("wav", "pcm", "flac", "mp3", "opus")


def v2_body(*texts: str, **parameters: object) -> dict:
    body: dict = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}]
    }
    if parameters:
        body["parameters"] = parameters
    return body


def binary_body(header: dict, payload: bytes) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(header).encode()
    return raw + payload, {
        "inference-header-content-length": str(len(raw)),
        "content-type": "application/octet-stream",
    }


def binary_text(text: bytes) -> tuple[bytes, dict[str, str]]:
    tensor = struct.pack("<I", len(text)) + text
    header = {
        "inputs": [
            {
                "name": "text",
                "datatype": "BYTES",
                "shape": [1],
                "parameters": {"binary_data_size": len(tensor)},
            }
        ]
    }
    return binary_body(header, tensor)


def ce_headers(event_id: str, **overrides: str) -> dict[str, str]:
    return {
        "ce-specversion": "1.0",
        "ce-type": REQUEST_TYPE,
        "ce-source": "/tests/reliability",
        "ce-id": event_id,
        "content-type": "application/json",
        **overrides,
    }


def structured(event: dict) -> tuple[bytes, dict[str, str]]:
    return json.dumps(event).encode(), {"content-type": "application/cloudevents+json"}


def grpc_infer(target: str, request: pb.ModelInferRequest, metadata: tuple = ()) -> pb.ModelInferResponse:
    with grpc.insecure_channel(target) as channel:
        return pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=metadata, timeout=60)


def grpc_text(text: bytes, **fields: object) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="tts", **fields)
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(text)
    return request


# --- 1. the same 400 for the same bad input, on every route --------------------------------------
NOTHING = "?!… —"  # punctuation only: nothing espeak-ng pronounces


def _nothing_to_speak_answers(predictor) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}

    def record(name: str, response: httpx.Response) -> None:
        out[name] = (response.status_code, response.json().get("error", "") if response.content else "")

    record("v2 json", predictor.post("/v2/models/tts/infer", json=v2_body(NOTHING)))
    body, headers = binary_text(NOTHING.encode())
    record("v2 binary", predictor.post("/v2/models/tts/infer", content=body, headers=headers))
    record("v2 versioned", predictor.post("/v2/models/tts/versions/1/infer", json=v2_body(NOTHING)))
    record("v1", predictor.post("/v1/models/tts:predict", json={"instances": [{"text": NOTHING}]}))
    record(
        "event binary",
        predictor.post(
            "/v1/models/tts:predict", headers=ce_headers("nothing-1"), content=json.dumps({"text": NOTHING})
        ),
    )
    event = {
        "specversion": "1.0",
        "type": REQUEST_TYPE,
        "source": "/t",
        "id": "nothing-2",
        "data": {"text": NOTHING},
    }
    body, headers = structured(event)
    record("event structured", predictor.post("/v1/models/tts:predict", content=body, headers=headers))
    for fmt in FORMATS:
        for stream in (False, True):
            request = {"model": "tts", "input": NOTHING, "response_format": fmt, "stream": stream}
            record(f"speech {fmt} stream={stream}", predictor.post("/v1/audio/speech", json=request))
    try:
        grpc_infer(predictor.grpc, grpc_text(NOTHING.encode()))
        out["grpc"] = (200, "")
    except grpc.RpcError as exc:
        out["grpc"] = (400 if exc.code() == grpc.StatusCode.INVALID_ARGUMENT else 500, exc.details() or "")
    return out


def test_text_with_nothing_to_speak_is_one_400_on_every_route_and_format(predictor):
    answers = _nothing_to_speak_answers(predictor)

    wrong = {route: a for route, a in answers.items() if a[0] != 400 or "nothing to speak" not in a[1]}
    assert not wrong, wrong


@pytest.mark.parametrize("control", ["\x00", "\x07", "\x1b[31m"], ids=["NUL", "BEL", "ANSI"])
def test_control_characters_are_removed_not_a_500(predictor, control):
    # JSON carries these as escapes; each becomes a space before espeak-ng.
    raw = json.dumps(v2_body(f"Hello{control}world."))

    response = predictor.post(
        "/v2/models/tts/infer", content=raw, headers={"content-type": "application/json"}
    )

    assert response.status_code == 200, response.text
    assert response.json()["outputs"][1]["data"][0] > 0


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v2/models/tts/infer",
            '{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["a\\ud800b"]}]}',
        ),
        ("/v1/models/tts:predict", '{"instances":[{"text":"a\\ud800b"}]}'),
        ("/v1/audio/speech", '{"model":"tts","input":"a\\ud800b"}'),
    ],
    ids=["v2", "v1", "speech"],
)
def test_a_lone_surrogate_escape_is_400(predictor, path, body):
    response = predictor.post(path, content=body, headers={"content-type": "application/json"})

    assert response.status_code == 400, response.text


def test_control_characters_only_is_the_empty_text_400_on_grpc_too(predictor):
    with pytest.raises(grpc.RpcError) as caught:
        grpc_infer(predictor.grpc, grpc_text(b"\x00\x01\x02"))

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "empty" in caught.value.details()


SPEECH_TYPES = {
    "speed true": ({"speed": True}, "speed"),
    "speed as a string": ({"speed": "2"}, "speed"),
    "stream as a string": ({"stream": "yes"}, "stream"),
    "stream as a number": ({"stream": 1}, "stream"),
    "input as a number": ({"input": 42}, "input"),
}


@pytest.mark.parametrize(("fields", "names"), SPEECH_TYPES.values(), ids=SPEECH_TYPES.keys())
def test_speech_types_are_strict(predictor, fields, names):
    response = predictor.post("/v1/audio/speech", json={"model": "tts", "input": "Hello.", **fields})

    assert response.status_code == 400, response.text
    assert names in response.json()["error"]


def test_speech_integer_speed_is_still_a_number(predictor):
    response = predictor.post(
        "/v1/audio/speech", json={"model": "tts", "input": "Hi.", "speed": 2, "response_format": "pcm"}
    )

    assert response.status_code == 200, response.text


TEXT_TENSOR = {"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}
BINARY_HEADERS = {
    "name is a number": ({"inputs": [{**TEXT_TENSOR, "name": 7}]}, "name"),
    "datatype is a list": ({"inputs": [{**TEXT_TENSOR, "datatype": ["BYTES"]}]}, "datatype"),
    "shape of strings": ({"inputs": [{**TEXT_TENSOR, "shape": ["1"]}]}, "shape"),
    "shape a number": ({"inputs": [{**TEXT_TENSOR, "shape": 1}]}, "shape"),
    "parameters a list": ({"inputs": [{**TEXT_TENSOR, "parameters": [6]}]}, "parameters"),
    "size a string": (
        {"inputs": [{**TEXT_TENSOR, "parameters": {"binary_data_size": "6"}}]},
        "binary_data_size",
    ),
    "size a boolean": (
        {"inputs": [{**TEXT_TENSOR, "parameters": {"binary_data_size": True}}]},
        "binary_data_size",
    ),
    "request parameters a string": ({"inputs": [TEXT_TENSOR], "parameters": "fast"}, "parameters"),
    "outputs an object": ({"inputs": [TEXT_TENSOR], "outputs": {"name": "audio"}}, "outputs"),
    "output parameters a list": (
        {"inputs": [TEXT_TENSOR], "outputs": [{"name": "audio", "parameters": [1]}]},
        "parameters",
    ),
    "binary_data a string": (
        {"inputs": [TEXT_TENSOR], "outputs": [{"name": "audio", "parameters": {"binary_data": "yes"}}]},
        "binary_data",
    ),
    "id a number": ({"id": 5, "inputs": [TEXT_TENSOR]}, "id"),
}


@pytest.mark.parametrize(("header", "names"), BINARY_HEADERS.values(), ids=BINARY_HEADERS.keys())
def test_binary_extension_header_with_wrong_json_types_is_400(predictor, header, names):
    body, headers = binary_body(header, struct.pack("<I", 2) + b"hi")

    response = predictor.post("/v2/models/tts/infer", content=body, headers=headers)

    assert response.status_code == 400, response.text
    assert names in response.json()["error"]


DEEP = "[" * 5000 + "]" * 5000
EVENT_CASES = {
    "id is a list": ({"id": ["a"]}, "id"),
    "id is a number": ({"id": 7}, "id"),
    "source is a number": ({"source": 3}, "source"),
    "source with spaces": ({"source": "not a uri"}, "URI-reference"),
    "type is an object": ({"type": {"x": 1}}, "type"),
    "specversion is a number": ({"specversion": 1.0}, "specversion"),
    "time is a number": ({"time": 12}, "time"),
}


@pytest.mark.parametrize(("change", "names"), EVENT_CASES.values(), ids=EVENT_CASES.keys())
def test_structured_event_attributes_of_the_wrong_type_are_400(predictor, change, names):
    event = {
        "specversion": "1.0",
        "type": REQUEST_TYPE,
        "source": "/t",
        "id": "typed-1",
        "data": {"text": "Hi."},
    }
    body, headers = structured({**event, **change})

    response = predictor.post("/v1/models/tts:predict", content=body, headers=headers)

    assert response.status_code == 400, response.text
    assert names in response.json()["error"]


def test_binary_event_with_a_source_that_is_not_a_uri_reference_is_400(predictor):
    headers = ce_headers("typed-2", **{"ce-source": "has spaces in it"})

    response = predictor.post("/v1/models/tts:predict", headers=headers, content=b'{"text": "Hi."}')

    assert response.status_code == 400
    assert "URI-reference" in response.json()["error"]


@pytest.mark.parametrize("mode", ["binary", "structured", "structured with ce- headers"])
def test_deeply_nested_or_non_object_event_bodies_are_400(predictor, mode):
    if mode == "binary":
        response = predictor.post("/v1/models/tts:predict", headers=ce_headers("deep-1"), content=DEEP)
    elif mode == "structured":
        response = predictor.post(
            "/v1/models/tts:predict", headers={"content-type": "application/cloudevents+json"}, content=DEEP
        )
    else:
        headers = {**ce_headers("deep-2"), "content-type": "application/cloudevents+json"}
        response = predictor.post(
            "/v1/models/tts:predict", headers=headers, content=b'["not", "an", "object"]'
        )

    assert response.status_code == 400, response.text


# --- 3. protocol edges ----------------------------------------------------------------------------
def test_versioned_routes_answer_as_unversioned_for_the_served_version(predictor):
    infer = predictor.post("/v2/models/tts/versions/1/infer", json=v2_body("Versioned."))
    metadata = predictor.get("/v2/models/tts/versions/1")
    ready = predictor.get("/v2/models/tts/versions/1/ready")

    assert infer.status_code == 200, infer.text
    assert infer.json()["outputs"][1]["data"][0] > 0
    assert metadata.status_code == 200 and metadata.json()["versions"] == ["1"]
    assert ready.status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2/models/tts/versions/2/infer"),
        ("GET", "/v2/models/tts/versions/2"),
        ("GET", "/v2/models/tts/versions/2/ready"),
        ("GET", "/v2/models/other"),
        ("GET", "/no/such/route"),
    ],
)
def test_other_versions_and_unknown_routes_are_404_with_an_error_body(predictor, method, path):
    response = httpx.request(method, predictor.url + path, json=v2_body("Hi."), timeout=30)

    assert response.status_code == 404, response.text
    assert set(response.json()) == {"error"}
    assert response.headers["x-request-id"] and response.headers["x-tts-revision"]


def test_wrong_method_is_405_with_an_error_body(predictor):
    response = httpx.get(predictor.url + "/v2/models/tts/infer", timeout=10)

    assert response.status_code == 405
    assert set(response.json()) == {"error"}


def test_v2_with_a_trailing_slash_answers_like_v2(predictor):
    plain, slash = predictor.get("/v2"), predictor.get("/v2/")

    assert slash.status_code == plain.status_code == 200
    assert slash.json() == plain.json()


@pytest.mark.parametrize(
    ("version", "code"),
    [("", grpc.StatusCode.OK), ("1", grpc.StatusCode.OK), ("2", grpc.StatusCode.NOT_FOUND)],
)
def test_grpc_version_fields_follow_the_rest_routes(predictor, version, code):
    with grpc.insecure_channel(predictor.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        calls = [
            lambda: stub.ModelInfer(grpc_text(b"Versioned.", model_version=version), timeout=60),
            lambda: stub.ModelReady(pb.ModelReadyRequest(name="tts", version=version), timeout=10),
            lambda: stub.ModelMetadata(pb.ModelMetadataRequest(name="tts", version=version), timeout=10),
        ]
        codes = []
        for call in calls:
            try:
                call()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())

    assert codes == [code] * 3


def test_openapi_document_is_served_and_names_every_rest_route(predictor):
    document = predictor.get("/v2/openapi.json").json()

    assert document["openapi"].startswith("3.")
    assert {
        "/v2/models/{model_name}/infer",
        "/v2/models/{model_name}/versions/{model_version}/infer",
        "/v1/models/{model_name}:predict",
        "/v1/audio/speech",
    } <= set(document["paths"])
    assert predictor.get("/openapi.json").status_code == 200  # KServe's own, untouched


# --- 2. an unexpected error is still a well-formed response ---------------------------------------
# Installed into the predictor process through sitecustomize (PYTHONPATH): production code has no switch
# for this. A text containing BOOM makes synthesis raise an exception no handler knows.
_BROKEN = textwrap.dedent(
    """
    from predictor.serving import service

    _synthesize = service.TTSService.synthesize


    async def synthesize(self, texts, params, **kwargs):
        if any("BOOM" in t for t in texts):
            raise RuntimeError("deliberately broken for a test")
        return await _synthesize(self, texts, params, **kwargs)


    service.TTSService.synthesize = synthesize

    _stream = service.TTSService.stream


    async def stream(self, text, params, **kwargs):
        if "BOOM" in text:
            raise RuntimeError("deliberately broken for a test")
        async for piece in _stream(self, text, params, **kwargs):
            yield piece


    service.TTSService.stream = stream
    """
)


@pytest.fixture(scope="module")
def broken_predictor(start_predictor, tmp_path_factory):
    hooks = tmp_path_factory.mktemp("broken")
    (hooks / "sitecustomize.py").write_text(_BROKEN)
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH", str(Path.cwd()))]))
    return start_predictor(PYTHONPATH=path, REVISION="broken-1")


def test_unexpected_error_is_a_500_with_headers_counted_logged_once_and_the_connection_usable(
    broken_predictor,
):
    p = broken_predictor
    before = p.metric("tts_requests_total", route="/v2/models/{model_name}/infer", code="500")
    with httpx.Client(base_url=p.url, timeout=60) as client:
        broken = client.post("/v2/models/tts/infer", json=v2_body("BOOM"), headers={"x-request-id": "boom-1"})
        after = client.post("/v2/models/tts/infer", json=v2_body("Still fine."))  # same connection

    assert broken.status_code == 500
    assert "RuntimeError" in broken.json()["error"] and "boom-1" in broken.json()["error"]
    assert broken.headers["x-request-id"] == "boom-1" and broken.headers["x-tts-revision"] == "broken-1"
    assert broken.headers.get("connection") != "close"
    assert after.status_code == 200
    assert p.metric("tts_requests_total", route="/v2/models/{model_name}/infer", code="500") == before + 1
    lines = [json.loads(line) for line in p.logs().splitlines() if '"boom-1"' in line]
    assert len(lines) == 1 and "deliberately broken" in lines[0]["exc"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/models/tts:predict", {"instances": [{"text": "BOOM"}]}),
        ("/v1/audio/speech", {"model": "tts", "input": "BOOM", "response_format": "wav"}),
        ("/v1/audio/speech", {"model": "tts", "input": "BOOM", "response_format": "wav", "stream": True}),
    ],
    ids=["v1", "speech", "speech stream"],
)
def test_unexpected_error_on_other_routes_is_a_well_formed_500(broken_predictor, path, body):
    response = broken_predictor.post(path, json=body)

    assert response.status_code == 500
    assert set(response.json()) == {"error"}
    # The deliberate error's own, not one of the wrapper's calling (a TypeError would be a 500 too).
    assert "RuntimeError" in response.json()["error"], response.text
    assert response.headers["x-request-id"]


def test_unexpected_error_over_grpc_is_internal_with_message_and_metadata(broken_predictor):
    with grpc.insecure_channel(broken_predictor.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelInfer.with_call
        with pytest.raises(grpc.RpcError) as caught:
            call(grpc_text(b"BOOM"), metadata=(("x-request-id", "boom-grpc"),), timeout=60)

    error = caught.value
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "RuntimeError" in error.details() and "boom-grpc" in error.details()
    assert dict(error.initial_metadata())["x-request-id"] == "boom-grpc"
    assert broken_predictor.metric("tts_requests_total", route="grpc:ModelInfer", code="INTERNAL") >= 1


# --- 7. limits that protect the pod -----------------------------------------------------------------
@pytest.fixture(scope="module")
def limited_predictor(start_predictor):
    return start_predictor(
        MAX_REQUEST_BYTES="65536", MAX_HEADER_BYTES="4096", MAX_HEADER_COUNT="20", BODY_TIMEOUT_S="2"
    )


def _raw_exchange(port: int, head: bytes, body_chunks: list[bytes] = (), pause_s: float = 0.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        for chunk in body_chunks:
            try:
                sock.sendall(chunk)
            except OSError:
                break  # the server answered and closed early: what a limit should do
            time.sleep(pause_s)
        data = b""
        sock.settimeout(30)
        while True:
            try:
                more = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not more:
                break
            data += more
        return data


def test_declared_body_over_the_limit_is_413_before_it_is_read(limited_predictor):
    p = limited_predictor
    head = (
        b"POST /v2/models/tts/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 10000000\r\n\r\n"
    )

    answer = _raw_exchange(p.http_port, head)  # no body sent at all: the answer cannot come from parsing

    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"MAX_REQUEST_BYTES" in answer and b"connection: close" in answer.lower()


def test_chunked_body_over_the_limit_is_cut_off_with_413(limited_predictor):
    def chunks():
        for _ in range(200):
            yield b"x" * 4096

    response = httpx.post(limited_predictor.url + "/v2/models/tts/infer", content=chunks(), timeout=30)

    assert response.status_code == 413
    assert "MAX_REQUEST_BYTES" in response.json()["error"]


def test_too_many_headers_is_431_and_a_too_large_head_is_refused(limited_predictor):
    many = {f"x-h{i}": "1" for i in range(30)}
    huge = {"x-big": "a" * 8000}

    too_many = httpx.get(limited_predictor.url + "/v2/health/live", headers=many, timeout=10)
    too_large = httpx.get(limited_predictor.url + "/v2/health/live", headers=huge, timeout=10)

    assert too_many.status_code == 431 and "MAX_HEADER_COUNT" in too_many.json()["error"]
    assert too_large.status_code == 431 and "MAX_HEADER_BYTES" in too_large.json()["error"]


def test_a_client_sending_one_byte_a_second_holds_neither_worker_nor_engine(limited_predictor):
    p = limited_predictor
    body = json.dumps(v2_body("Slowly.")).encode()
    head = (
        b"POST /v2/models/tts/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
    )
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(_raw_exchange, p.http_port, head, [bytes([b]) for b in body[:10]], 1.0)
        time.sleep(0.5)
        started = time.monotonic()
        meanwhile = p.post("/v2/models/tts/infer", json=v2_body("Meanwhile."))
        served_in = time.monotonic() - started
        answer = slow.result(timeout=60)

    assert meanwhile.status_code == 200
    assert served_in < 30  # not queued behind the slow client (it never reaches the engine)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"BODY_TIMEOUT_S" in answer


def test_grpc_message_over_the_limit_is_resource_exhausted(limited_predictor):
    client = triton_grpc.InferenceServerClient(limited_predictor.grpc)
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"a" * 100_000], dtype=object))

    with pytest.raises(InferenceServerException) as caught:
        client.infer("tts", [text])

    assert "RESOURCE_EXHAUSTED" in str(caught.value.status())
