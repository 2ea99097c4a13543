"""Generated bad input, as an outside tester would send it: never a 5xx, always {"error"} on a 4xx.

schemathesis generates requests (valid and invalid) for every operation of our own OpenAPI document,
fetched from the running server at /v2/openapi.json; hypothesis covers what OpenAPI cannot express: the
binary tensor extension, CloudEvents in both modes, and gRPC ModelInfer messages. `make test` runs a
bounded number of examples per test (FUZZ_EXAMPLES, default 15); `make fuzz` runs many more and prints
the case and 5xx counts per route and transport (written to .cache/fuzz-report.json).
"""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from tritonclient.grpc import service_pb2 as pb  # KServe's stubs and Triton's cannot share a process
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from predictor.api import openapi
from predictor.config import Settings

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "15"))
REPORT = Path(os.environ.get("FUZZ_REPORT", ".cache/fuzz-report.json"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("FUZZ_RANDOM") != "1",  # the same cases every `make test` run
    suppress_health_check=list(HealthCheck),
    database=None,
)

CASES: Counter[str] = Counter()
SERVER_ERRORS: Counter[str] = Counter()
REQUEST_TYPE = "dev.tts-predictor.synthesize.v1"


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    rows = {k: {"cases": CASES[k], "5xx": SERVER_ERRORS[k]} for k in sorted(CASES)}
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    tmp = REPORT.with_suffix(".tmp")
    tmp.write_text(json.dumps({"examples_per_test": EXAMPLES, "routes": rows}, indent=2))
    tmp.replace(REPORT)
    print("\nfuzz cases (route/transport: cases, 5xx):")
    for key, row in rows.items():
        print(f"  {key}: {row['cases']}, {row['5xx']}")


def _count(key: str, status: int) -> None:
    CASES[key] += 1
    if status >= 500:
        SERVER_ERRORS[key] += 1


def _header(response: httpx.Response | Any, name: str) -> str:
    value = response.headers.get(name, "")
    return value[0] if isinstance(value, list) else value  # schemathesis: a list per header


def _check_http(key: str, response: httpx.Response | Any, body_hint: str = "") -> None:
    status = response.status_code
    _count(key, status)
    assert status < 500, f"{key}: {status} {response.text[:300]} for {body_hint[:300]}"
    if status >= 400 and _header(response, "content-type").startswith("application/json"):
        assert set(response.json()) == {"error"}, response.text[:300]
    assert _header(response, "x-request-id"), "every response carries x-request-id"


# --- schemathesis against our OpenAPI document ----------------------------------------------------
# The operations, from the document built in process (only to name the tests); the requests are generated
# from the document the server serves.
OPERATIONS = [
    (method.upper(), path)
    for path, item in openapi.document(Settings()).get("paths", {}).items()
    for method in item
    if method in ("get", "post")
]


@pytest.fixture(scope="module")
def openapi_schema(predictor: Any) -> Any:
    return schemathesis.openapi.from_url(predictor.url + "/v2/openapi.json")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_openapi_operations_never_answer_5xx(
    predictor: Any, openapi_schema: Any, method: str, path: str, mode: GenerationMode
) -> None:
    operation = openapi_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @FUZZ
    def run(case: Any) -> None:
        response = case.call(base_url=predictor.url, timeout=120)
        _check_http(f"REST {method} {path}", response, repr(case.body))

    try:
        run()
    except Unsatisfiable:
        pytest.skip("no invalid request exists for this operation (no parameters, no body)")


# --- hypothesis: what OpenAPI cannot express --------------------------------------------------------
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
texts = st.text(max_size=60) | st.sampled_from(["Hello.", "?!", "\x00", "", "  ", "a" * 300, "12345"])


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(value, json_values)


@st.composite
def binary_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A binary-extension body: a plausible header with any field possibly of the wrong type, then raw bytes."""
    payload = draw(
        st.one_of(
            texts.map(
                lambda t: (
                    struct.pack("<I", len(t.encode("utf-8", "surrogatepass")))
                    + t.encode("utf-8", "surrogatepass")
                )
            ),
            st.binary(max_size=64),
        )
    )
    size = draw(_maybe(st.just(len(payload)) | st.integers(-5, 200)))
    tensor = {
        "name": draw(_maybe(st.just("text"))),
        "datatype": draw(_maybe(st.sampled_from(["BYTES", "FP32", "INT64"]))),
        "shape": draw(_maybe(st.lists(st.integers(-2, 3), max_size=3))),
        "parameters": draw(_maybe(st.fixed_dictionaries({"binary_data_size": st.just(size)}))),
    }
    header: dict[str, Any] = {"inputs": draw(_maybe(st.just([tensor])))}
    if draw(st.booleans()):
        header["parameters"] = draw(
            _maybe(
                st.dictionaries(
                    st.sampled_from(["noise_scale", "seed", "voice", "binary_data_output"]),
                    json_scalars,
                    max_size=3,
                )
            )
        )
    if draw(st.booleans()):
        header["outputs"] = draw(
            _maybe(st.lists(st.fixed_dictionaries({"name": _maybe(st.just("audio"))}), max_size=2))
        )
    if draw(st.booleans()):
        header["id"] = draw(json_values)
    raw = json.dumps(header, default=str).encode()
    length = draw(_maybe(st.just(len(raw))).map(str) | st.text(max_size=5))
    return raw + payload, {
        "inference-header-content-length": length,
        "content-type": "application/octet-stream",
    }


@given(request=binary_requests())
@FUZZ
def test_binary_extension_bodies_never_answer_5xx(
    predictor: Any, request: tuple[bytes, dict[str, str]]
) -> None:
    body, headers = request
    headers = {
        k: v.encode("ascii", "replace").decode() if isinstance(v, str) else str(v) for k, v in headers.items()
    }

    response = predictor.post("/v2/models/tts/infer", content=body, headers=headers, timeout=120)

    _check_http("REST v2 binary extension", response, repr(body[:200]))


header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(str.strip)


@st.composite
def events(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    data = draw(
        st.one_of(
            st.fixed_dictionaries(
                {"text": _maybe(texts)},
                optional={
                    "format": _maybe(st.sampled_from(["wav", "mp3", "ogg"])),
                    "output": _maybe(st.sampled_from(["s3://elsewhere/a.wav", "s3://b/", "http://x/y"])),
                    "seed": json_scalars,
                    "noise_w": json_scalars,
                },
            ),
            json_values,
        )
    )
    if draw(st.booleans()):
        headers = {
            "ce-specversion": draw(st.just("1.0") | header_text),
            "ce-type": draw(st.just(REQUEST_TYPE) | header_text),
            "ce-source": draw(st.just("/fuzz") | header_text),
            "ce-id": draw(header_text),
            "content-type": draw(
                st.sampled_from(["application/json", "text/plain", "application/cloudevents+json"])
            ),
        }
        return "binary", json.dumps(data, default=str).encode(), headers
    event = {
        "specversion": draw(_maybe(st.just("1.0"))),
        "type": draw(_maybe(st.just(REQUEST_TYPE))),
        "source": draw(_maybe(st.just("/fuzz") | st.text(max_size=10))),
        "id": draw(_maybe(st.text(max_size=10))),
        "data": data,
    }
    extra = draw(
        st.dictionaries(st.sampled_from(["time", "subject", "dataschema", "ext"]), json_values, max_size=2)
    )
    body = draw(st.just({**event, **extra}) | json_values)
    return (
        "structured",
        json.dumps(body, default=str).encode(),
        {"content-type": "application/cloudevents+json"},
    )


@given(event=events())
@FUZZ
def test_cloudevents_in_both_modes_never_answer_5xx(
    predictor: Any, event: tuple[str, bytes, dict[str, str]]
) -> None:
    mode, body, headers = event

    response = predictor.post("/v1/models/tts:predict", content=body, headers=headers, timeout=120)

    _check_http(f"REST CloudEvents {mode}", response, repr(body[:200]))


@st.composite
def infer_messages(draw: st.DrawFn) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(
        model_name=draw(st.sampled_from(["tts", "tts", "other", ""])),
        model_version=draw(st.sampled_from(["", "1", "2"])),
        id=draw(st.text(max_size=10)),
    )
    for _ in range(draw(st.integers(0, 2))):
        tensor = request.inputs.add(
            name=draw(st.sampled_from(["text", "text", "prompt"])),
            datatype=draw(st.sampled_from(["BYTES", "BYTES", "FP32", "INT64", "NOPE"])),
            shape=draw(st.lists(st.integers(0, 3), max_size=3)),
        )
        kind = draw(st.sampled_from(["bytes", "fp32", "int64", "none"]))
        if kind == "bytes":
            tensor.contents.bytes_contents.extend(
                draw(
                    st.lists(
                        st.binary(max_size=30) | texts.map(lambda t: t.encode("utf-8", "surrogatepass")),
                        max_size=3,
                    )
                )
            )
        elif kind == "fp32":
            tensor.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=3)))
        elif kind == "int64":
            tensor.contents.int64_contents.extend(
                draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3))
            )
    if draw(st.booleans()):
        request.raw_input_contents.extend(draw(st.lists(st.binary(max_size=40), max_size=2)))
    for name in draw(
        st.lists(st.sampled_from(["noise_scale", "length_scale", "seed", "voice", "other"]), max_size=3)
    ):
        param = request.parameters[name]
        kind = draw(st.sampled_from(["bool", "int", "string", "double"]))
        if kind == "bool":
            param.bool_param = draw(st.booleans())
        elif kind == "int":
            param.int64_param = draw(st.integers(-(2**63), 2**63 - 1))
        elif kind == "string":
            param.string_param = draw(st.text(max_size=10))
        else:
            param.double_param = draw(st.floats())
    for name in draw(st.lists(st.sampled_from(["audio", "audio_length", "other"]), max_size=2)):
        request.outputs.add(name=name)
    return request


@pytest.fixture(scope="module")
def grpc_stub(predictor: Any) -> Iterator[Any]:
    with grpc.insecure_channel(predictor.grpc) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@given(message=infer_messages())
@FUZZ
def test_grpc_model_infer_messages_never_answer_internal(
    grpc_stub: Any, message: pb.ModelInferRequest
) -> None:
    try:
        grpc_stub.ModelInfer(message, timeout=120)
        code = grpc.StatusCode.OK
    except grpc.RpcError as exc:
        code = exc.code()
        details = exc.details()
    server_side = code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS)
    _count("gRPC ModelInfer", 500 if server_side else 200)
    assert not server_side, f"{code}: {details} for {message}"
