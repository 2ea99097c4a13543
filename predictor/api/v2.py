"""The Open Inference (KServe v2) protocol: wire codecs for REST and gRPC, the KServe Model, the REST routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from kserve import Model
from kserve.errors import ModelNotFound
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput
from kserve.protocol.rest.v2_datamodels import InferenceRequest
from pydantic import ValidationError

from predictor.config import Settings
from predictor.engine.base import SynthesisParams
from predictor.errors import BadRequest, NotReady
from predictor.serving.params import decode_texts, parse_params
from predictor.serving.service import SynthesisResult, TTSService

OUTPUTS = ("audio", "audio_length")


BINARY_HEADER = "inference-header-content-length"


INPUT_METADATA = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]


OUTPUT_METADATA = [
    {"name": "audio", "datatype": "FP32", "shape": [-1, -1]},
    {"name": "audio_length", "datatype": "INT64", "shape": [-1]},
]


def decode_binary_request(body: bytes, header_length: str, model_name: str) -> InferRequest:
    """A v2 request using the binary tensor extension, with raw tensors kept raw.

    KServe's own decoder turns raw BYTES back into JSON strings and fails with a 500 on bytes that are
    not UTF-8; here they stay bytes, so decode_texts can answer 400 with the offending position.
    """
    try:
        json_size = int(header_length)
    except ValueError:
        raise BadRequest(f"{BINARY_HEADER} must be an integer, got {header_length!r}") from None
    if not 0 < json_size <= len(body):
        raise BadRequest(f"{BINARY_HEADER}={json_size} does not fit a body of {len(body)} bytes")
    try:
        header = orjson.loads(body[:json_size])
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the JSON header of a binary request is invalid: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise BadRequest('the JSON header of a binary request must be {"inputs": [...], ...}')
    offset, inputs, raw = json_size, [], []
    for i, tensor in enumerate(header["inputs"]):
        if not isinstance(tensor, dict) or not {"name", "datatype", "shape"} <= set(tensor):
            raise BadRequest(f"inputs[{i}] must have name, datatype and shape")
        params = dict(tensor.get("parameters") or {})
        size = params.pop("binary_data_size", None)
        if size is None:
            raise BadRequest(
                f"input {tensor['name']!r} has no binary_data_size; mixing JSON and binary inputs is not supported"
            )
        if not isinstance(size, int) or size < 0 or offset + size > len(body):
            raise BadRequest(
                f"input {tensor['name']!r}: binary_data_size={size} runs past the end of the body"
            )
        inputs.append(
            InferInput(tensor["name"], list(tensor["shape"]), tensor["datatype"], parameters=params)
        )
        raw.append(body[offset : offset + size])
        offset += size
    if offset != len(body):
        raise BadRequest(f"{len(body) - offset} bytes after the last binary tensor")
    outputs = []
    for i, o in enumerate(header.get("outputs") or []):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise BadRequest(f"outputs[{i}] must be an object with a name")
        outputs.append(RequestedOutput(o["name"], dict(o.get("parameters") or {})))
    return InferRequest(
        model_name=model_name,
        infer_inputs=inputs,
        request_id=header.get("id"),
        raw_inputs=raw,
        parameters=dict(header.get("parameters") or {}),
        request_outputs=outputs or None,
    )


def parse_inference_request(raw: bytes) -> InferenceRequest:
    try:
        return InferenceRequest.model_validate_json(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise BadRequest(f"invalid v2 inference request: {problems}") from None


# --- audio -----------------------------------------------------------------------------------
def padded(result: SynthesisResult) -> tuple[np.ndarray, np.ndarray]:
    """audio [N, S] float32 zero-padded to the longest item, audio_length [N] int64."""
    lengths = np.array([len(a) for a in result.audio], dtype=np.int64)
    audio = np.zeros((len(result.audio), int(lengths.max(initial=0))), dtype=np.float32)
    for row, a in zip(audio, result.audio, strict=False):
        row[: len(a)] = a
    return audio, lengths


# --- v2 --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class V2Call:
    """A decoded v2 request: what to synthesize and which outputs to answer with, in which form."""

    request_id: str
    texts: list[str]
    params: SynthesisParams
    outputs: list[tuple[str, bool]]  # (output name, send as raw/binary)


def decode_v2(payload: InferRequest, binary_default: bool) -> V2Call:
    """Texts, parameters and requested outputs from a v2 request (REST or gRPC)."""
    requested = list(payload.request_outputs or [])
    for r in requested:
        if r.name not in OUTPUTS:
            raise BadRequest(f"unknown output {r.name!r}; this model has {list(OUTPUTS)}")
    if requested:
        outputs = [
            (r.name, binary_default if r.binary_data is None else bool(r.binary_data)) for r in requested
        ]
    else:
        outputs = [(name, binary_default) for name in OUTPUTS]
    return V2Call(
        request_id=payload.id or "",
        texts=_texts(payload),
        params=parse_params(payload.parameters, strings_allowed=payload.from_grpc),
        outputs=outputs,
    )


def _texts(payload: InferRequest) -> list[str]:
    if len(payload.inputs) != 1 or payload.inputs[0].name != "text":
        names = [i.name for i in payload.inputs]
        raise BadRequest(f"expected exactly one input named 'text', got {names}")
    inp = payload.inputs[0]
    if inp.datatype != "BYTES":
        raise BadRequest(f"input 'text' must have datatype BYTES, got {inp.datatype}")
    shape = list(inp.shape)
    if len(shape) != 1 or shape[0] < 1:
        raise BadRequest(f"input 'text' must have shape [N] with N >= 1, got {shape}")
    try:
        data = inp.as_numpy().reshape(-1)
    except Exception as exc:  # KServe raises several types for malformed tensors
        raise BadRequest(f"input 'text' cannot be read: {exc}") from None
    if data.size != shape[0]:
        raise BadRequest(f"input 'text' has shape {shape} but {data.size} elements")
    return decode_texts(data.tolist())


def _tensors(result: SynthesisResult) -> dict[str, tuple[np.ndarray, str, str]]:
    """name -> (array, v2 datatype, gRPC typed-contents field)."""
    audio, lengths = padded(result)
    return {"audio": (audio, "FP32", "fp32_contents"), "audio_length": (lengths, "INT64", "int64_contents")}


def encode_rest(call: V2Call, result: SynthesisResult, model_name: str) -> tuple[bytes, dict[str, str]]:
    """The v2 REST response body and headers; binary outputs use the binary tensor data extension.

    Built directly with orjson (numpy arrays serialized natively, float32 in shortest form): KServe's
    InferResponse converts every sample to a Python float first, which costs tens of milliseconds for
    a few seconds of audio.
    """
    tensors = _tensors(result)
    outputs, raw = [], []
    for name, binary in call.outputs:
        array, datatype, _ = tensors[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            blob = np.ascontiguousarray(array).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            raw.append(blob)
        else:
            entry["data"] = np.ascontiguousarray(array).reshape(-1)
        outputs.append(entry)
    header = orjson.dumps(
        {
            "id": call.request_id,
            "model_name": model_name,
            "parameters": {"sample_rate": result.sample_rate},
            "outputs": outputs,
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    if not raw:
        return header, {"content-type": "application/json"}
    return b"".join([header, *raw]), {
        "content-type": "application/octet-stream",
        BINARY_HEADER: str(len(header)),
    }


def encode_grpc(call: V2Call, result: SynthesisResult, model_name: str) -> pb.ModelInferResponse:
    # gRPC has no per-output binary flag: raw_output_contents holds all outputs or none.
    raw = all(binary for _, binary in call.outputs)
    tensors = _tensors(result)
    response = pb.ModelInferResponse(model_name=model_name, id=call.request_id)
    response.parameters["sample_rate"].int64_param = result.sample_rate
    for name, _ in call.outputs:
        array, datatype, field = tensors[name]
        out = response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if raw:
            response.raw_output_contents.append(np.ascontiguousarray(array).tobytes())
        else:
            getattr(out.contents, field).extend(array.reshape(-1).tolist())
    return response


class TTSModel(Model):
    """The predictor as KServe's gRPC servicer sees it: ModelInfer lands in `predict`.

    REST v2 infer is served by our own route (server.py), which skips KServe's InferResponse
    conversion; KServe's only other REST infer path (with a model version) answers 501 before here.
    """

    def __init__(self, name: str, service: TTSService):
        self.service = service
        super().__init__(name)

    # KServe keeps readiness in an attribute it also writes; ours is the service's.
    @property
    def ready(self) -> bool:
        return self.service.ready

    @ready.setter
    def ready(self, _value: bool) -> None:
        pass

    def load(self) -> bool:
        # KServe calls load() on a request that finds the model not ready; loading is cold start's job.
        raise NotReady("model is not ready (cold start in progress)")

    def get_input_types(self) -> list[dict]:
        return INPUT_METADATA

    def get_output_types(self) -> list[dict]:
        return OUTPUT_METADATA

    def validate(self, payload: Any) -> Any:
        return payload

    async def predict(
        self, payload: InferRequest, headers: dict[str, str] | None = None
    ) -> pb.ModelInferResponse:
        # Raw inputs get raw outputs (what Triton's client expects); typed inputs get typed contents.
        call = decode_v2(payload, binary_default=bool(payload.use_binary_outputs))
        result = await self.service.synthesize(call.texts, call.params)
        return encode_grpc(call, result, self.name)


def require_model(model_name: str, name: str) -> None:
    if model_name != name:
        raise ModelNotFound(model_name)


def router(service: TTSService, settings: Settings) -> APIRouter:
    """v2 inference and model metadata, registered before KServe's own routes so these win."""
    name = settings.model_name
    routes = APIRouter()

    @routes.post("/v2/models/{model_name}/infer")
    async def v2_infer(model_name: str, request: Request) -> Response:
        # KServe's route reads a body without content-type: application/json as binary and then
        # demands the binary header; Triton's HTTP client sends JSON exactly like that.
        require_model(model_name, name)
        service.require_ready()
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        binary_in = BINARY_HEADER in headers
        if binary_in:
            infer_request = decode_binary_request(body, headers[BINARY_HEADER], name)
        else:
            infer_request = InferRequest.from_inference_request(parse_inference_request(body), name)
        call = decode_v2(infer_request, binary_default=binary_in or bool(infer_request.use_binary_outputs))
        result = await service.synthesize(call.texts, call.params)
        content, response_headers = encode_rest(call, result, name)
        return Response(content, headers=response_headers)

    @routes.get("/v2/models/{model_name}")
    async def model_metadata(model_name: str) -> dict[str, Any]:
        require_model(model_name, name)
        meta: dict[str, Any] = {
            "name": name,
            "versions": [],
            "platform": settings.engine_name,
            "inputs": INPUT_METADATA,
            "outputs": OUTPUT_METADATA,
        }
        if service.engine is not None:
            meta["parameters"] = {"sample_rate": service.sample_rate, "voices": service.voices}
        return meta

    return routes
