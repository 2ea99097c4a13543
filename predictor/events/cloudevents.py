"""CloudEvents on the v1 predict path, as a Knative Trigger delivers them (binary or structured mode).

Request: type CE_REQUEST_TYPE, data {"text": "...", "voice"?, "format"?, "output"?, "length_scale"?,
"noise_scale"?, "noise_w"?, "seed"?}. Reply: same mode, type CE_REPLY_TYPE (never the request's type:
a Trigger filtering on the request type would otherwise feed our reply back to us forever), extension
`inreplyto` = the request event's id, and data

- with ``output`` (s3://bucket/key): {"uri", "sha256", "bytes", "audio_seconds", "sample_rate",
  "format"}, the audio written once however often the event is redelivered (outputs.py);
- without: {"audio_base64", "format", "sha256", "bytes", "audio_seconds", "sample_rate"}, up to
  CE_INLINE_MAX_BYTES of encoded audio. The size is only known after synthesis, so an oversized event
  costs one synthesis before its 413; the message says to pass ``output``.

The reply's id is derived from the request's (source, id), so every redelivery gets the same reply id
and a downstream consumer can drop duplicates by it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cloudevents.exceptions import GenericException as CloudEventError
from cloudevents.http import CloudEvent, from_http, to_binary, to_structured

from predictor.audio import codecs
from predictor.config import Settings
from predictor.engine.base import SynthesisParams
from predictor.errors import BadRequest, ReplyTooLarge
from predictor.events.outputs import (
    Completion,
    EncodedAudio,
    OutputStore,
    OutputTarget,
    event_key,
    now_iso,
    parse_output_uri,
)
from predictor.serving.params import decode_texts, parse_params
from predictor.serving.service import TTSService

STRUCTURED = "application/cloudevents+json"
DEFAULT_FORMAT = "wav"
# Data fields that are not synthesis parameters; everything else goes through parse_params.
_EVENT_FIELDS = ("text", "format", "output")
# Namespace of reply ids (uuid5 of the request's event key): any fixed UUID would do.
_REPLY_IDS = uuid.UUID("5b0c2f0e-8a0b-4f57-9a43-3f4c4e6f1d2a")


def is_cloudevent(headers: Mapping[str, str]) -> bool:
    return "ce-specversion" in headers or headers.get("content-type", "").split(";")[0].strip() == STRUCTURED


@dataclass(frozen=True)
class SynthesisEvent:
    event: CloudEvent
    binary: bool
    text: str
    params: SynthesisParams
    format: codecs.Format
    output: OutputTarget | None
    data_sha256: str  # of the data as canonical JSON: tells a redelivery with other data apart

    @property
    def key(self) -> str:
        return event_key(self.event["source"], self.event["id"])


def parse(headers: Mapping[str, str], body: bytes, settings: Settings) -> SynthesisEvent:
    binary = "ce-specversion" in headers
    try:
        event = from_http(dict(headers), body, data_unmarshaller=_json_data)
    except (CloudEventError, ValueError) as exc:
        raise BadRequest(f"malformed CloudEvent: {exc}") from None
    if event["type"] != settings.ce_request_type:
        raise BadRequest(
            f"unsupported event type {event['type']!r}; this predictor accepts {settings.ce_request_type!r}"
        )
    data = event.data
    if not isinstance(data, dict) or "text" not in data:
        raise BadRequest('event data must be a JSON object {"text": "...", ...}')
    params = parse_params(
        {k: v for k, v in data.items() if k not in _EVENT_FIELDS}, strings_allowed=False, extra_ok=set()
    )
    (text,) = decode_texts([data["text"]], "data.text")
    output = parse_output_uri(data["output"]) if data.get("output") is not None else None
    return SynthesisEvent(
        event=event,
        binary=binary,
        text=text,
        params=params,
        format=_format(data.get("format", DEFAULT_FORMAT)),
        output=output,
        data_sha256=hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest(),
    )


def _format(name: Any) -> codecs.Format:
    supported = codecs.supported_formats()
    if not isinstance(name, str) or name not in supported:
        raise BadRequest(f"data.format {name!r} is not supported; supported: {', '.join(supported)}")
    return codecs.FORMATS[name]


def _json_data(raw: bytes | str | None) -> Any:
    if raw in (None, b"", ""):
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"event data is not valid JSON: {exc}") from None


async def complete(
    request: SynthesisEvent, service: TTSService, store: OutputStore, settings: Settings
) -> Completion:
    """Do what the event asks: synthesize, then write the output once, or carry the audio inline."""
    # Refuse a bad text or voice before storage is asked anything: a 400 must not depend on S3.
    service.check([request.text], request.params)
    if request.output is not None:
        return await store.complete(
            request.output, request.key, request.data_sha256, lambda: _synthesize(request, service)
        )
    encoded = await _synthesize(request, service)
    if len(encoded.data) > settings.ce_inline_max_bytes:
        raise ReplyTooLarge(
            f"the {encoded.format} audio is {len(encoded.data)} bytes, over CE_INLINE_MAX_BYTES="
            f"{settings.ce_inline_max_bytes} for an inline reply; pass data.output (an s3:// URI) to have it "
            "written to storage, or send a shorter text"
        )
    data = {
        "audio_base64": base64.b64encode(encoded.data).decode("ascii"),
        "format": encoded.format,
        "sha256": encoded.sha256,
        "bytes": len(encoded.data),
        "audio_seconds": encoded.audio_seconds,
        "sample_rate": encoded.sample_rate,
    }
    return Completion(data=data, time=now_iso())


async def _synthesize(request: SynthesisEvent, service: TTSService) -> EncodedAudio:
    result = await service.synthesize([request.text], request.params)
    fmt = request.format
    # Encoding (MP3, Opus) costs CPU time: off the event loop, like synthesis.
    data = await asyncio.to_thread(codecs.encode, result.audio[0], result.sample_rate, fmt.name)
    return EncodedAudio(
        data=data,
        format=fmt.name,
        media_type=fmt.media_type,
        sample_rate=codecs.output_sample_rate(fmt, result.sample_rate),
        audio_seconds=round(result.audio_seconds, 4),
    )


def reply(
    request: SynthesisEvent, completion: Completion, settings: Settings
) -> tuple[dict[str, str], bytes]:
    """The reply event as (headers, body) in the request's mode."""
    attributes = {
        "type": settings.ce_reply_type,
        "source": settings.reply_source,
        "id": str(uuid.uuid5(_REPLY_IDS, request.key)),
        "time": completion.time,
        "datacontenttype": "application/json",
        "inreplyto": request.event["id"],
    }
    event = CloudEvent(attributes, completion.data)
    headers, body = to_binary(event) if request.binary else to_structured(event)
    if not request.binary:
        headers["content-type"] = STRUCTURED
    return headers, body
