"""Request bodies: v2 (REST JSON and gRPC), v1 and the OpenAI speech route, for model ``tts``; the audio of a
v2 response."""

from __future__ import annotations

from typing import Any

import numpy as np

MODEL = "tts"


def v2_request(*texts: str, **parameters: Any) -> dict[str, Any]:
    """A v2 REST inference request: one BYTES input ``text`` of shape [N], request parameters if any."""
    body: dict[str, Any] = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}]
    }
    if parameters:
        body["parameters"] = parameters
    return body


def audio_of(body: dict[str, Any], index: int = 0) -> np.ndarray:
    """Text ``index``'s audio in a v2 REST response (the padded ``audio`` tensor cut to its length)."""
    outputs = {o["name"]: o for o in body["outputs"]}
    audio = np.asarray(outputs["audio"]["data"], dtype=np.float32).reshape(outputs["audio"]["shape"])
    length = outputs["audio_length"]["data"][index]
    return audio[index, :length]


def v1_request(*texts: str, **parameters: Any) -> dict[str, Any]:
    """A KServe v1 predict request: one instance per text."""
    body: dict[str, Any] = {"instances": [{"text": t} for t in texts]}
    if parameters:
        body["parameters"] = parameters
    return body


def speech_request(text: str, response_format: str = "pcm", **fields: Any) -> dict[str, Any]:
    """An OpenAI `/v1/audio/speech` body; ``fields`` adds stream, speed, voice and the like."""
    return {"model": MODEL, "input": text, "response_format": response_format, **fields}


def v2_grpc_request(*texts: str, **string_parameters: str) -> Any:
    """A v2 gRPC ModelInferRequest with typed contents (no raw tensors) and string parameters.

    Built from Triton's generated messages: KServe's and Triton's protos share the `inference`
    package and cannot both be loaded into one process, and the tests load Triton's.
    """
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    tensor.contents.bytes_contents.extend(t.encode() for t in texts)
    for key, value in string_parameters.items():
        request.parameters[key].string_param = value
    return request


def cloudevent_headers(event_id: str, source: str = "/tests", **extensions: str) -> dict[str, str]:
    """Binary-mode CloudEvent headers for a synthesis request (the JSON data goes in the body)."""
    return {
        "ce-specversion": "1.0",
        "ce-type": "dev.tts-predictor.synthesize.v1",
        "ce-source": source,
        "ce-id": event_id,
        "content-type": "application/json",
        **{f"ce-{k}": v for k, v in extensions.items()},
    }
