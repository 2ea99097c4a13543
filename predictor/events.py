"""CloudEvents on the v1 predict path, as a Knative Trigger delivers them (binary or structured mode).

Request: type CE_REQUEST_TYPE, data {"text": "...", "voice"?, "length_scale"?, "noise_scale"?, "noise_w"?}.
Reply: same mode, type CE_REPLY_TYPE (never the request's type: a Trigger filtering on the request
type would otherwise feed our reply back to us forever), data {"wav_base64", "sample_rate",
"audio_seconds"}, extension `inreplyto` = the request event's id.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from cloudevents.http import CloudEvent, from_http, to_binary, to_structured
from cloudevents.exceptions import GenericException as CloudEventError

from predictor.config import Settings
from predictor.engine import SynthesisParams
from predictor.endpoints import decode_texts, parse_params, v1_predictions
from predictor.errors import BadRequest
from predictor.service import SynthesisResult

STRUCTURED = "application/cloudevents+json"


def is_cloudevent(headers: Mapping[str, str]) -> bool:
    return "ce-specversion" in headers or headers.get("content-type", "").split(";")[0].strip() == STRUCTURED


@dataclass(frozen=True)
class SynthesisEvent:
    event: CloudEvent
    binary: bool
    text: str
    params: SynthesisParams


def parse(headers: Mapping[str, str], body: bytes, settings: Settings) -> SynthesisEvent:
    binary = "ce-specversion" in headers
    try:
        event = from_http(dict(headers), body, data_unmarshaller=_json_data)
    except (CloudEventError, ValueError) as exc:
        raise BadRequest(f"malformed CloudEvent: {exc}") from None
    if event["type"] != settings.ce_request_type:
        raise BadRequest(f"unsupported event type {event['type']!r}; this predictor accepts {settings.ce_request_type!r}")
    data = event.data
    if not isinstance(data, dict) or "text" not in data:
        raise BadRequest('event data must be a JSON object {"text": "...", ...}')
    params = parse_params({k: v for k, v in data.items() if k != "text"}, strings_allowed=False, extra_ok=set())
    (text,) = decode_texts([data["text"]], "data.text")
    return SynthesisEvent(event=event, binary=binary, text=text, params=params)


def _json_data(raw: bytes | str | None):
    if raw in (None, b"", ""):
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"event data is not valid JSON: {exc}") from None


def reply(request: SynthesisEvent, result: SynthesisResult, settings: Settings) -> tuple[dict[str, str], bytes]:
    """The reply event as (headers, body) in the request's mode."""
    attributes = {
        "type": settings.ce_reply_type,
        "source": settings.reply_source,
        "id": str(uuid.uuid4()),
        "datacontenttype": "application/json",
        "inreplyto": request.event["id"],
    }
    event = CloudEvent(attributes, v1_predictions(result)[0])
    headers, body = to_binary(event) if request.binary else to_structured(event)
    if not request.binary:
        headers["content-type"] = STRUCTURED
    return headers, body
