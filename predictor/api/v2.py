"""The Open Inference (KServe v2) REST routes: infer, model metadata and versioned readiness, registered
before KServe's own so these win; the wire format is api/v2_codec.py's."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferRequest

from predictor.api.checks import require_model, require_version
from predictor.api.v2_codec import (
    BINARY_HEADER,
    INPUT_METADATA,
    OUTPUT_METADATA,
    V2Call,
    binary_outputs_requested,
    decode_binary_request,
    decode_v2,
    encode_rest,
    parse_inference_request,
)
from predictor.config import Settings
from predictor.errors import BadRequest
from predictor.serving import pipeline
from predictor.serving.limits import TextLimits
from predictor.serving.offload import off_loop
from predictor.serving.service import TTSService


def router(service: TTSService, settings: Settings) -> APIRouter:
    """v2 inference, model metadata and versioned readiness, registered before KServe's own routes so
    these win (its versioned routes answer 501)."""
    name = settings.model_name
    limits = TextLimits.of(settings)
    routes = APIRouter()

    async def infer(request: Request) -> Response:
        # KServe's route reads a body without content-type: application/json as binary and then
        # demands the binary header; Triton's HTTP client sends JSON exactly like that.
        service.require_ready()
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        call = await off_loop(len(body), decode, body, headers)
        result = await pipeline.synthesize(
            service, call.texts, call.params, call.ssml, settings, call.timestamps
        )
        content, response_headers = await off_loop(
            sum(a.nbytes for a in result.audio), encode_rest, call, result, name
        )
        return Response(content, headers=response_headers)

    def decode(body: bytes, headers: dict[str, str]) -> V2Call:
        binary_in = BINARY_HEADER in headers
        if binary_in:
            infer_request = decode_binary_request(body, headers[BINARY_HEADER], name)
        else:
            try:
                infer_request = InferRequest.from_inference_request(parse_inference_request(body), name)
            except InvalidInput as exc:
                raise BadRequest(str(exc.reason)) from None
        binary_out = binary_outputs_requested(infer_request)
        return decode_v2(infer_request, binary_default=binary_in or binary_out, limits=limits)

    def metadata() -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": name,
            "versions": [settings.model_version],
            "platform": settings.engine_name,
            "inputs": INPUT_METADATA,
            "outputs": OUTPUT_METADATA,
        }
        if service.engine is not None:
            meta["parameters"] = {"sample_rate": service.sample_rate, "voices": service.voices}
        return meta

    @routes.post("/v2/models/{model_name}/infer")
    async def v2_infer(model_name: str, request: Request) -> Response:
        require_model(model_name, name)
        return await infer(request)

    @routes.post("/v2/models/{model_name}/versions/{model_version}/infer")
    async def v2_infer_version(model_name: str, model_version: str, request: Request) -> Response:
        require_model(model_name, name)
        require_version(model_version, settings.model_version)
        return await infer(request)

    @routes.get("/v2/models/{model_name}")
    async def model_metadata(model_name: str) -> dict[str, Any]:
        require_model(model_name, name)
        return metadata()

    @routes.get("/v2/models/{model_name}/versions/{model_version}")
    async def model_version_metadata(model_name: str, model_version: str) -> dict[str, Any]:
        require_model(model_name, name)
        require_version(model_version, settings.model_version)
        return metadata()

    @routes.get("/v2/models/{model_name}/versions/{model_version}/ready")
    async def model_version_ready(model_name: str, model_version: str) -> dict[str, Any]:
        # As KServe's unversioned route answers: 200 {"name", "ready": true}, or 503 while not ready.
        require_model(model_name, name)
        require_version(model_version, settings.model_version)
        service.require_ready()
        return {"name": name, "ready": True}

    return routes
