"""The Open Inference (KServe v2) protocol on the wire: REST bodies (JSON and the binary tensor extension)
and gRPC messages decoded into a V2Call, SynthesisResults encoded back; no routes, no KServe Model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput
from kserve.protocol.rest.v2_datamodels import InferenceRequest
from pydantic import ValidationError

from predictor.api.handlers import validation_problems
from predictor.engine.base import SynthesisParams
from predictor.engine.words import in_seconds
from predictor.errors import BadRequest
from predictor.serving.limits import TextLimits
from predictor.serving.params import decode_texts, markup_flag, parse_params, plain_value
from predictor.serving.service import SynthesisResult

OUTPUTS = ("audio", "audio_length", "words")
# What a request that names no outputs gets: "words" (word timestamps) only when asked for by name.
DEFAULT_OUTPUTS = ("audio", "audio_length")


BINARY_HEADER = "inference-header-content-length"


INPUT_METADATA = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]


OUTPUT_METADATA = [
    {"name": "audio", "datatype": "FP32", "shape": [-1, -1]},
    {"name": "audio_length", "datatype": "INT64", "shape": [-1]},
    # Each text's words as JSON, [{"word", "start", "end"}, ...] in seconds: only when requested.
    {"name": "words", "datatype": "BYTES", "shape": [-1]},
]


def decode_binary_request(body: bytes, header_length: str, model_name: str) -> InferRequest:
    """A v2 request using the binary tensor extension, with raw tensors kept raw.

    KServe's own decoder turns raw BYTES back into JSON strings and fails with a 500 on bytes that are
    not UTF-8; here they stay bytes, so decode_texts can answer 400 with the offending position. Every
    field of the JSON header is type-checked here, before KServe's classes see it: they assume the
    types the extension's spec gives and fail with a 500 on any other.
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
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest(f"id must be a string, got {_json_type(request_id)}")
    offset, inputs, raw = json_size, [], []
    for i, tensor in enumerate(header["inputs"]):
        where = f"inputs[{i}]"
        if not isinstance(tensor, dict) or not {"name", "datatype", "shape"} <= set(tensor):
            raise BadRequest(f"{where} must have name, datatype and shape")
        name, datatype, shape = tensor["name"], tensor["datatype"], tensor["shape"]
        if not isinstance(name, str):
            raise BadRequest(f"{where}.name must be a string, got {_json_type(name)}")
        if not isinstance(datatype, str):
            raise BadRequest(f"{where}.datatype must be a string, got {_json_type(datatype)}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise BadRequest(f"{where}.shape must be a list of non-negative integers, got {shape!r}")
        params = _object(tensor.get("parameters"), f"{where}.parameters")
        size = params.pop("binary_data_size", None)
        if size is None:
            raise BadRequest(
                f"input {name!r} has no binary_data_size; mixing JSON and binary inputs is not supported"
            )
        if not _is_int(size) or size < 0 or offset + size > len(body):
            raise BadRequest(f"input {name!r}: binary_data_size={size!r} runs past the end of the body")
        inputs.append(InferInput(name, list(shape), datatype, parameters=params))
        raw.append(body[offset : offset + size])
        offset += size
    if offset != len(body):
        raise BadRequest(f"{len(body) - offset} bytes after the last binary tensor")
    requested = header.get("outputs")
    if requested is not None and not isinstance(requested, list):
        raise BadRequest(f"outputs must be a list, got {_json_type(requested)}")
    outputs = []
    for i, o in enumerate(requested or []):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise BadRequest(f"outputs[{i}] must be an object with a string name")
        outputs.append(RequestedOutput(o["name"], _object(o.get("parameters"), f"outputs[{i}].parameters")))
    return InferRequest(
        model_name=model_name,
        infer_inputs=inputs,
        request_id=request_id,
        raw_inputs=raw,
        parameters=_object(header.get("parameters"), "parameters"),
        request_outputs=outputs or None,
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be an object, got {_json_type(value)}")
    return dict(value)


def _json_type(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return "null" if value is None else names.get(type(value), type(value).__name__)


def parse_inference_request(raw: bytes) -> InferenceRequest:
    try:
        return InferenceRequest.model_validate_json(raw)
    except ValidationError as exc:
        raise BadRequest(f"invalid v2 inference request: {validation_problems(exc.errors())}") from None


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
    ssml: bool = False  # parameter ssml: each text is an SSML document (serving/pipeline.py)

    @property
    def timestamps(self) -> bool:
        """Whether the words output (word timestamps) was requested."""
        return any(name == "words" for name, _ in self.outputs)


def binary_outputs_requested(payload: InferRequest) -> bool:
    """The request-level binary_data_output flag (REST), which must be a boolean when present."""
    if payload.from_grpc:
        return bool(payload.use_binary_outputs)
    flag = (payload.parameters or {}).get("binary_data_output")
    if flag is not None and not isinstance(flag, bool):
        raise BadRequest(f"parameter binary_data_output must be a boolean, got {flag!r}")
    return bool(flag)


def decode_v2(payload: InferRequest, binary_default: bool, limits: TextLimits) -> V2Call:
    """Texts, parameters and requested outputs from a v2 request (REST or gRPC); texts over ``limits``
    are refused before they are normalized."""
    requested = list(payload.request_outputs or [])
    for r in requested:
        if r.name not in OUTPUTS:
            raise BadRequest(f"unknown output {r.name!r}; this model has {list(OUTPUTS)}")
    if requested:
        outputs = []
        for r in requested:
            flag = plain_value((r.parameters or {}).get("binary_data"))
            if flag is not None and not isinstance(flag, bool):
                raise BadRequest(f"outputs {r.name!r}: parameter binary_data must be a boolean, got {flag!r}")
            outputs.append((r.name, binary_default if flag is None else flag))
    else:
        outputs = [(name, binary_default) for name in DEFAULT_OUTPUTS]
    parameters = dict(payload.parameters or {})
    markup = markup_flag(parameters.pop("ssml", None))
    return V2Call(
        request_id=payload.id or "",
        texts=_texts(payload, limits, normalize=not markup),
        params=parse_params(parameters, strings_allowed=payload.from_grpc),
        outputs=outputs,
        ssml=markup,
    )


def _texts(payload: InferRequest, limits: TextLimits, normalize: bool) -> list[str]:
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
    return decode_texts(data.tolist(), limits=limits, normalize=normalize)


def _tensors(result: SynthesisResult) -> dict[str, tuple[np.ndarray, str, str]]:
    """name -> (array, v2 datatype, gRPC typed-contents field)."""
    audio, lengths = padded(result)
    tensors = {
        "audio": (audio, "FP32", "fp32_contents"),
        "audio_length": (lengths, "INT64", "int64_contents"),
    }
    if result.words is not None:
        documents = [orjson.dumps(in_seconds(w, result.sample_rate)) for w in result.words]
        tensors["words"] = (np.array(documents, dtype=object), "BYTES", "bytes_contents")
    return tensors


def _raw(array: np.ndarray) -> bytes:
    """A tensor's raw bytes: BYTES elements each after its 4-byte little-endian length (the binary
    tensor extension's and Triton's raw_output_contents' layout), others as they lie in memory."""
    if array.dtype == object:
        return b"".join(len(b).to_bytes(4, "little") + b for b in array.reshape(-1))
    return np.ascontiguousarray(array).tobytes()


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
            blob = _raw(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            raw.append(blob)
        elif array.dtype == object:
            entry["data"] = [b.decode() for b in array.reshape(-1)]
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
    add_grpc_outputs(response, call, tensors, raw)
    return response


def add_grpc_outputs(
    response: pb.ModelInferResponse,
    call: V2Call,
    tensors: dict[str, tuple[np.ndarray, str, str]],
    raw: bool,
) -> None:
    """The requested outputs into a gRPC response: raw bytes for all of them, or typed contents."""
    for name, _ in call.outputs:
        array, datatype, field = tensors[name]
        out = response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if raw:
            response.raw_output_contents.append(_raw(array))
        else:
            getattr(out.contents, field).extend(array.reshape(-1).tolist())
