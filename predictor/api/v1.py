"""KServe's v1 protocol (`:predict` with instances) and the CloudEvents it also receives."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import orjson
import soundfile
from fastapi import APIRouter, Request
from fastapi.responses import Response

from predictor.api.checks import require_model
from predictor.config import Settings
from predictor.engine.base import SynthesisParams
from predictor.errors import BadRequest
from predictor.events import cloudevents
from predictor.events.outputs import OutputStore
from predictor.serving import pipeline
from predictor.serving.limits import TextLimits
from predictor.serving.offload import off_loop
from predictor.serving.params import decode_texts, parse_params
from predictor.serving.service import SynthesisResult, TTSService


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


def parse_v1(body: Any, limits: TextLimits) -> tuple[list[str], SynthesisParams]:
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
    return decode_texts(texts, "instances", limits), parse_params(
        body.get("parameters"), strings_allowed=False, extra_ok=set()
    )


def router(service: TTSService, settings: Settings, outputs: OutputStore) -> APIRouter:
    """`:predict` with instances, or a CloudEvent (binary or structured) delivered by the event bus."""
    name = settings.model_name
    limits = TextLimits.of(settings)
    routes = APIRouter()

    @routes.post("/v1/models/{model_name}:predict")
    async def v1_predict(model_name: str, request: Request) -> Response:
        require_model(model_name, name)
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        if cloudevents.is_cloudevent(headers):
            event = await off_loop(len(body), cloudevents.parse, headers, body, settings)
            completion = await cloudevents.complete(event, service, outputs, settings)
            size = len(completion.data.get("audio_base64", ""))
            reply_headers, reply_body = await off_loop(size, cloudevents.reply, event, completion, settings)
            return Response(content=reply_body, headers=reply_headers)
        texts, params = await off_loop(len(body), decode, body)
        result = await pipeline.synthesize(service, texts, params, False, settings)
        content = await off_loop(sum(a.nbytes for a in result.audio), encode, result)
        return Response(content, media_type="application/json")

    def decode(body: bytes) -> tuple[list[str], SynthesisParams]:
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"body is not valid JSON: {exc}") from None
        return parse_v1(payload, limits)

    def encode(result: SynthesisResult) -> bytes:
        return orjson.dumps({"predictions": v1_predictions(result)})

    return routes
