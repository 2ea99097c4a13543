"""Our OpenAPI 3.0 document for every REST route we serve, built here, served at `GET /v2/openapi.json`.

KServe's FastAPI app already serves `/openapi.json`, generated from its routes: our routes read raw
bodies (binary tensors, CloudEvents, JSON without a content type), so FastAPI cannot describe them,
and that document is left as KServe builds it. This one is written by hand from what the routes
accept: the v2 routes with the Open Inference Protocol's schemas (KServe's `rest_predict_v2.yaml`:
inference_request, request_input, tensor_data, metadata_model_response, ...), the v1 routes, the
speech route, health, metrics. CloudEvents and the binary tensor extension ride on headers and raw
bodies that OpenAPI cannot express; tests/system/test_fuzz.py covers them with hypothesis.

Path parameters are enums of the served name and version, so that generated valid requests reach the
handlers (any other value is a 404, which generated invalid requests exercise).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from predictor.api.speech import STREAM_FORMATS, SpeechRequest
from predictor.audio import codecs
from predictor.config import Settings
from predictor.engine.base import SEED_LIMIT, SynthesisParams
from predictor.engine.words import TIMESTAMPS

PATH = "/v2/openapi.json"

_JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {_JSON: {"schema": schema}}


def _errors(*codes: int) -> dict[str, Any]:
    reasons = {
        400: "Bad input, naming what is wrong",
        403: "Not allowed here",
        404: "No such model or version",
        408: "The body took longer than BODY_TIMEOUT_S",
        413: "Body over MAX_REQUEST_BYTES",
        431: "More than MAX_HEADER_COUNT headers",
        503: "Not ready, draining or overloaded (Retry-After when overloaded)",
    }
    return {str(c): {"description": reasons[c], "content": _json(_ref("error"))} for c in codes}


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI 3.0 schema of a pydantic model the routes validate with: its JSON Schema with nested
    models inlined, ``X | None`` as ``nullable``, and pydantic's generated titles dropped."""
    raw = model.model_json_schema()
    definitions = raw.pop("$defs", {})

    def convert(node: Any) -> Any:
        if isinstance(node, list):
            return [convert(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return convert(definitions[node["$ref"].rsplit("/", 1)[1]])
        out = {key: convert(value) for key, value in node.items() if key != "title"}
        if "anyOf" in out:
            options = [o for o in out.pop("anyOf") if o != {"type": "null"}]
            if len(options) < len(node["anyOf"]):
                # 3.0's nullable counts only beside a type, so each typed option carries it.
                options = [{**o, "nullable": True} for o in options]
            out = {**options[0], **out} if len(options) == 1 else {"anyOf": options, **out}
        return out

    return convert(raw)


def _speech_request(settings: Settings) -> dict[str, Any]:
    """SpeechRequest's schema, with what the route checks beyond the model from the same constants:
    the input's bounds, the formats and stream formats it knows."""
    schema = model_schema(SpeechRequest)
    props = schema["properties"]
    props["model"]["description"] = (
        f"{settings.model_name!r}, one of MODEL_ALIASES or one of the voice's names; any other is a 400"
    )
    # Blank input is refused too ("input is empty").
    props["input"].update(minLength=1, maxLength=settings.max_stream_text_chars, pattern=r"\S")
    props["response_format"]["enum"] = codecs.supported_formats()
    # OpenAPI 3.0: a nullable enum lists null among its values.
    props["stream_format"]["enum"] = [*STREAM_FORMATS, None]
    props["timestamps"]["enum"] = [*TIMESTAMPS, None]
    return schema


def _synthesis_parameters() -> dict[str, Any]:
    props: dict[str, Any] = {
        name: {"type": "number", "minimum": lo, "maximum": hi}
        for name, (lo, hi) in SynthesisParams.LIMITS.items()
    }
    props["voice"] = {"type": "string", "minLength": 1}
    props["seed"] = {"type": "integer", "minimum": 0, "maximum": SEED_LIMIT - 1}
    return props


def _schemas(settings: Settings) -> dict[str, Any]:
    scalar = {"oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}
    synth = _synthesis_parameters()
    return {
        "error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "string"}},
        },
        # --- Open Inference Protocol (v2) ---
        "parameters": {
            "type": "object",
            "description": "Request parameters: the synthesis ones below, and those v2 clients send on their own "
            "(binary_data_output, priority, timeout, ...). Any other name is refused (400).",
            "properties": {
                **synth,
                "binary_data_output": {"type": "boolean"},
                "ssml": {
                    "type": "boolean",
                    "description": "Each text is an SSML document (docs/protocol.md, SSML).",
                },
            },
            "additionalProperties": scalar,
        },
        "tensor_data": {
            "type": "array",
            "items": {"oneOf": [{"$ref": "#/components/schemas/tensor_data"}, scalar]},
        },
        "request_input": {
            "type": "object",
            "required": ["name", "shape", "datatype", "data"],
            "properties": {
                "name": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "datatype": {"type": "string"},
                "parameters": _ref("parameters"),
                "data": _ref("tensor_data"),
            },
        },
        "text_input": {
            "type": "object",
            "description": "The one input this model takes: UTF-8 texts.",
            "required": ["name", "shape", "datatype", "data"],
            "properties": {
                "name": {"type": "string", "enum": ["text"]},
                "shape": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1, "maximum": settings.max_batch_items},
                    "minItems": 1,
                    "maxItems": 1,
                },
                "datatype": {"type": "string", "enum": ["BYTES"]},
                "data": {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1, "maxLength": settings.max_text_chars},
                    "minItems": 1,
                    "maxItems": settings.max_batch_items,
                },
            },
        },
        "request_output": {
            "type": "object",
            "required": ["name"],
            "properties": {
                # v2_codec.OUTPUTS, which this module cannot import (KServe's protos would load into
                # processes that hold Triton's); test_protocol checks they are the metadata's.
                "name": {"type": "string", "enum": ["audio", "audio_length", "words"]},
                "parameters": {
                    "type": "object",
                    "properties": {"binary_data": {"type": "boolean"}},
                    "additionalProperties": scalar,
                },
            },
        },
        "inference_request": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string"},
                "parameters": _ref("parameters"),
                "inputs": {
                    "type": "array",
                    "items": {"oneOf": [_ref("text_input"), _ref("request_input")]},
                    "minItems": 1,
                },
                "outputs": {"type": "array", "items": _ref("request_output")},
            },
        },
        "response_output": {
            "type": "object",
            "required": ["name", "shape", "datatype"],
            "properties": {
                "name": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}},
                "datatype": {"type": "string"},
                "parameters": {"type": "object"},
                "data": _ref("tensor_data"),
            },
        },
        "inference_response": {
            "type": "object",
            "required": ["model_name", "outputs"],
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "id": {"type": "string"},
                "parameters": {"type": "object", "properties": {"sample_rate": {"type": "integer"}}},
                "outputs": {"type": "array", "items": _ref("response_output")},
            },
        },
        "metadata_tensor": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {
                "name": {"type": "string"},
                "datatype": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}},
            },
        },
        "metadata_model_response": {
            "type": "object",
            "required": ["name", "platform"],
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": _ref("metadata_tensor")},
                "outputs": {"type": "array", "items": _ref("metadata_tensor")},
                "parameters": {"type": "object"},
            },
        },
        "metadata_server_response": {
            "type": "object",
            "required": ["name", "version"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
        },
        "model_ready_response": {
            "type": "object",
            "required": ["name", "ready"],
            "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}},
        },
        # --- KServe v1 ---
        "v1_request": {
            "type": "object",
            "required": ["instances"],
            "additionalProperties": False,
            "properties": {
                "instances": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": settings.max_batch_items,
                    "items": {
                        "type": "object",
                        "required": ["text"],
                        "additionalProperties": False,
                        "properties": {
                            "text": {"type": "string", "minLength": 1, "maxLength": settings.max_text_chars}
                        },
                    },
                },
                "parameters": {"type": "object", "properties": synth, "additionalProperties": False},
            },
        },
        "v1_response": {
            "type": "object",
            "required": ["predictions"],
            "properties": {
                "predictions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["wav_base64", "sample_rate", "audio_seconds"],
                        "properties": {
                            "wav_base64": {"type": "string"},
                            "sample_rate": {"type": "integer"},
                            "audio_seconds": {"type": "number"},
                        },
                    },
                }
            },
        },
        # --- OpenAI-style speech ---
        "speech_request": _speech_request(settings),
    }


def document(settings: Settings) -> dict[str, Any]:
    """The OpenAPI 3.0.3 document of every REST route this server answers."""
    model = {
        "name": "model_name",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "enum": [settings.model_name]},
    }
    version = {
        "name": "model_version",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "enum": [settings.model_version]},
    }
    infer = {
        "summary": "Synthesize texts (Open Inference Protocol). The binary tensor extension "
        "(Inference-Header-Content-Length) is accepted too.",
        "requestBody": {"required": True, "content": _json(_ref("inference_request"))},
        "responses": {
            "200": {
                "description": "audio FP32 [N, S] and audio_length INT64 [N]; words BYTES [N] (each "
                "text's word timestamps as JSON) when requested",
                "content": {
                    **_json(_ref("inference_response")),
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                },
            },
            **_errors(400, 404, 408, 413, 503),
        },
    }
    metadata = {
        "summary": "Model metadata",
        "responses": {
            "200": {"description": "", "content": _json(_ref("metadata_model_response"))},
            **_errors(404),
        },
    }
    ready = {
        "summary": "Model readiness (the startup and readiness probe)",
        "responses": {
            "200": {"description": "warm", "content": _json(_ref("model_ready_response"))},
            **_errors(404, 503),
        },
    }
    server_metadata = {
        "summary": "Server metadata",
        "responses": {"200": {"description": "", "content": _json(_ref("metadata_server_response"))}},
    }
    audio = {
        fmt.media_type: {"schema": {"type": "string", "format": "binary"}} for fmt in codecs.FORMATS.values()
    }
    paths: dict[str, Any] = {
        "/v2": {"get": server_metadata},
        "/v2/health/live": {"get": {"summary": "Liveness", "responses": {"200": {"description": "live"}}}},
        "/v2/health/ready": {
            "get": {
                "summary": "Server readiness (the model's)",
                "responses": {"200": {"description": "ready"}, **_errors(503)},
            }
        },
        "/v2/models/{model_name}": {"parameters": [model], "get": metadata},
        "/v2/models/{model_name}/ready": {"parameters": [model], "get": ready},
        "/v2/models/{model_name}/infer": {"parameters": [model], "post": infer},
        "/v2/models/{model_name}/versions/{model_version}": {"parameters": [model, version], "get": metadata},
        "/v2/models/{model_name}/versions/{model_version}/ready": {
            "parameters": [model, version],
            "get": ready,
        },
        "/v2/models/{model_name}/versions/{model_version}/infer": {
            "parameters": [model, version],
            "post": infer,
        },
        "/v1/models/{model_name}": {
            "parameters": [model],
            "get": {
                "summary": "v1 model readiness",
                "responses": {"200": {"description": "ready"}, **_errors(404, 503)},
            },
        },
        "/v1/models/{model_name}:predict": {
            "parameters": [model],
            "post": {
                "summary": "Synthesize texts (KServe v1); a CloudEvent (binary or structured mode) on this path "
                "is a synthesis event, see docs/events.md",
                "requestBody": {"required": True, "content": _json(_ref("v1_request"))},
                "responses": {
                    "200": {"description": "one WAV per instance", "content": _json(_ref("v1_response"))},
                    **_errors(400, 404, 408, 413, 503),
                },
            },
        },
        "/v1/audio/speech": {
            "post": {
                "summary": "OpenAI-style speech: one audio file, or a stream of it",
                "requestBody": {"required": True, "content": _json(_ref("speech_request"))},
                "responses": {
                    "200": {"description": "audio", "content": audio},
                    **_errors(400, 408, 413, 503),
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {"description": "", "content": {"text/plain": {"schema": {"type": "string"}}}}
                },
            }
        },
        PATH: {
            "get": {
                "summary": "This document",
                "responses": {"200": {"description": "", "content": _json({"type": "object"})}},
            }
        },
    }
    if settings.playground:
        page = {
            "get": {
                "summary": "The playground page (PLAYGROUND=true)",
                "responses": {"200": {"description": "HTML"}},
            }
        }
        paths["/"] = paths["/playground"] = page
    else:
        paths["/"] = {
            "get": {"summary": "Liveness (KServe's)", "responses": {"200": {"description": "live"}}}
        }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "tts-predictor",
            "version": settings.model_version,
            "description": "Text to speech over the Open Inference Protocol (v2), KServe v1, CloudEvents and "
            'an OpenAI-style speech route. Every error body is {"error": "..."}; every response carries '
            "x-request-id and x-tts-revision.",
        },
        "paths": paths,
        "components": {"schemas": _schemas(settings)},
    }


def router(settings: Settings) -> APIRouter:
    routes = APIRouter()
    body = document(settings)

    @routes.get(PATH, include_in_schema=False)
    async def openapi_document() -> JSONResponse:
        return JSONResponse(body)

    return routes
