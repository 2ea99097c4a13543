"""Wire formats: KServe v2 (REST and gRPC) through a KServe Model, v1 predict, and model metadata.

Binary or typed outputs follow the request, so clients written for Triton and for KServe both work:
a request that sends raw/binary tensors, or asks for binary outputs, gets raw/binary outputs;
otherwise JSON (REST) or typed contents (gRPC).
"""

from __future__ import annotations

import base64
import io
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import soundfile
from google.protobuf.unknown_fields import UnknownFieldSet
from kserve import Model
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput
from kserve.protocol.rest.v2_datamodels import InferenceRequest
from pydantic import ValidationError

from predictor.engine import SynthesisParams
from predictor.errors import BadRequest, NotReady
from predictor.service import SynthesisResult, TTSService

SYNTH_PARAMS = ("length_scale", "noise_scale", "noise_w", "voice", "seed")
# Request parameters the v2 protocol and its clients (Triton's, KServe's) send on their own.
PROTOCOL_PARAMS = {
    "binary_data_output",
    "binary_data",
    "binary_data_size",
    "headers",
    "priority",
    "timeout",
    "sequence_id",
    "sequence_start",
    "sequence_end",
}
OUTPUTS = ("audio", "audio_length")
BINARY_HEADER = "inference-header-content-length"

INPUT_METADATA = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
OUTPUT_METADATA = [
    {"name": "audio", "datatype": "FP32", "shape": [-1, -1]},
    {"name": "audio_length", "datatype": "INT64", "shape": [-1]},
]


# --- parameters ------------------------------------------------------------------------------
# Fields of the Open Inference Protocol's InferParameter that KServe's proto predates; Triton's gRPC
# client sends Python floats as double_param. They arrive as unknown fields, which protobuf keeps.
_DOUBLE_PARAM, _UINT64_PARAM = 4, 5
_WIRE_FIXED64, _WIRE_VARINT = 1, 0


def _plain(value: Any) -> Any:
    """A gRPC InferParameter (or a REST JSON value) as a plain Python value."""
    if not isinstance(value, pb.InferParameter):
        return value
    field = value.WhichOneof("parameter_choice")
    if field:
        return getattr(value, field)
    for unknown in UnknownFieldSet(value):
        if unknown.field_number == _DOUBLE_PARAM and unknown.wire_type == _WIRE_FIXED64:
            return struct.unpack("<d", struct.pack("<Q", unknown.data))[0]
        if unknown.field_number == _UINT64_PARAM and unknown.wire_type == _WIRE_VARINT:
            return int(unknown.data)
    return None


def _number(name: str, value: Any, strings_allowed: bool) -> float:
    if isinstance(value, bool):
        raise BadRequest(f"parameter {name} must be a number, got a boolean")
    if isinstance(value, str) and strings_allowed:
        try:
            value = float(value)
        except ValueError:
            raise BadRequest(f"parameter {name} must be a number, got {value!r}") from None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"parameter {name} must be a finite number, got {value!r}")
    return float(value)


def _integer(name: str, value: Any, strings_allowed: bool) -> int:
    if isinstance(value, str) and strings_allowed:
        try:
            return int(value)
        except ValueError:
            raise BadRequest(f"parameter {name} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"parameter {name} must be an integer, got {value!r}")
    return value


def parse_params(
    raw: Mapping[str, Any] | None, *, strings_allowed: bool, extra_ok: set[str] = PROTOCOL_PARAMS
) -> SynthesisParams:
    """Synthesis parameters from a request's parameter map; unknown names are refused."""
    values: dict[str, Any] = {}
    for name, value in (raw or {}).items():
        value = _plain(value)
        if name in ("length_scale", "noise_scale", "noise_w"):
            values[name] = _number(name, value, strings_allowed)
        elif name == "seed":
            values[name] = _integer(name, value, strings_allowed)
        elif name == "voice":
            if not isinstance(value, str) or not value:
                raise BadRequest("parameter voice must be a non-empty string")
            values[name] = value
        elif name not in extra_ok:
            raise BadRequest(f"unknown parameter {name!r}; accepted: {', '.join(SYNTH_PARAMS)}")
    return SynthesisParams(**values)


def decode_texts(items: Any, where: str = "text") -> list[str]:
    out = []
    for i, item in enumerate(items):
        if isinstance(item, (bytes, bytearray, np.bytes_)):
            try:
                item = bytes(item).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BadRequest(
                    f"{where}[{i}] is not valid UTF-8: {exc.reason} at byte {exc.start}"
                ) from None
        if not isinstance(item, str):
            raise BadRequest(f"{where}[{i}] must be a UTF-8 string, got {type(item).__name__}")
        out.append(item)
    return out


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


def wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, audio, sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def v1_predictions(result: SynthesisResult) -> list[dict]:
    return [
        {
            "wav_base64": base64.b64encode(wav_bytes(a, result.sample_rate)).decode("ascii"),
            "sample_rate": result.sample_rate,
            "audio_seconds": round(len(a) / result.sample_rate, 4),
        }
        for a in result.audio
    ]


def parse_v1(body: Any) -> tuple[list[str], SynthesisParams]:
    """{"instances": [{"text": ...}, ...], "parameters": {...}} -> texts, params."""
    if not isinstance(body, dict) or not isinstance(body.get("instances"), list):
        raise BadRequest('v1 body must be {"instances": [{"text": "..."}], "parameters": {...}}')
    unknown = set(body) - {"instances", "parameters"}
    if unknown:
        raise BadRequest(f"unknown v1 field(s) {sorted(unknown)}")
    texts = []
    for i, inst in enumerate(body["instances"]):
        if not isinstance(inst, dict) or set(inst) != {"text"}:
            raise BadRequest(f'instances[{i}] must be {{"text": "..."}}')
        texts.append(inst["text"])
    if not isinstance(body.get("parameters", {}), dict):
        raise BadRequest("parameters must be an object")
    return decode_texts(texts, "instances"), parse_params(
        body.get("parameters"), strings_allowed=False, extra_ok=set()
    )


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
