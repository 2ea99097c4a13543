"""CloudEvents on the v1 predict path, as a Knative Trigger delivers them (binary or structured mode).

Request: type CE_REQUEST_TYPE, data {"text": "...", "voice"?, "format"?, "output"?, "length_scale"?,
"noise_scale"?, "noise_w"?, "seed"?, "ssml"?, "timestamps"?} (``ssml: true``: the text is an SSML
document; ``timestamps: "word"``: the inline reply carries the words). Reply: same mode, type
CE_REPLY_TYPE (never the request's type:
a Trigger filtering on the request type would otherwise feed our reply back to us forever), extension
`inreplyto` = the request event's id, and data

- with ``output`` (s3://bucket/key): {"uri", "sha256", "bytes", "audio_seconds", "sample_rate",
  "format"}, the audio written once however often the event is redelivered (outputs.py);
- without: {"audio_base64", "format", "sha256", "bytes", "audio_seconds", "sample_rate"} (and
  "words", [{"word", "start", "end"}, ...] in seconds, when asked for), up to
  CE_INLINE_MAX_BYTES of encoded audio. An event whose audio may exceed that (an upper bound from the
  text's length, pace and format) is refused with 413 before synthesis, the message saying to pass
  ``output``; the rare text that reads much longer than it is written is still caught after synthesis.

Without a ``seed`` in the data, the noise is seeded from the event's (source, id) (both engines seed,
engine/noise.py): a redelivery gets the same audio, inline or not; with ``output`` the stored reply is
returned without synthesis.

``output`` must lie under one of CE_OUTPUT_PREFIXES (403 otherwise, before storage is touched).

The reply's id is derived from the request's (source, id), so every redelivery gets the same reply id
and a downstream consumer can drop duplicates by it.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from cloudevents.exceptions import GenericException as CloudEventError
from cloudevents.http import CloudEvent, from_http, to_binary, to_structured

from predictor import text as text_prep
from predictor.audio import codecs
from predictor.config import Settings
from predictor.engine.base import SEED_LIMIT, SynthesisParams
from predictor.engine.words import TIMESTAMPS, in_seconds
from predictor.errors import BadRequest, Forbidden, ReplyTooLarge
from predictor.events.outputs import (
    Completion,
    EncodedAudio,
    OutputStore,
    OutputTarget,
    event_key,
    now_iso,
    parse_output_uri,
)
from predictor.serving import pipeline
from predictor.serving.limits import TextLimits
from predictor.serving.offload import off_loop
from predictor.serving.params import decode_texts, markup_flag, parse_params
from predictor.serving.service import TTSService

STRUCTURED = "application/cloudevents+json"
DEFAULT_FORMAT = "wav"
# Data fields that are not synthesis parameters; everything else goes through parse_params.
_EVENT_FIELDS = ("text", "format", "output", "ssml", "timestamps")
# Namespace of reply ids (uuid5 of the request's event key): any fixed UUID would do.
_REPLY_IDS = uuid.UUID("5b0c2f0e-8a0b-4f57-9a43-3f4c4e6f1d2a")


def is_cloudevent(headers: Mapping[str, str]) -> bool:
    return "ce-specversion" in headers or _is_structured(headers)


def _is_structured(headers: Mapping[str, str]) -> bool:
    return headers.get("content-type", "").split(";")[0].strip().lower() == STRUCTURED


@dataclass(frozen=True)
class SynthesisEvent:
    event: CloudEvent
    binary: bool
    text: str
    params: SynthesisParams
    format: codecs.Format
    output: OutputTarget | None
    data_sha256: str  # of the data as canonical JSON: tells a redelivery with other data apart
    ssml: bool = False  # data.ssml: the text is an SSML document (serving/pipeline.py)
    timestamps: bool = False  # data.timestamps "word": the inline reply carries the words' times

    @property
    def key(self) -> str:
        return event_key(self.event["source"], self.event["id"])


# Context attributes every event must carry, as non-empty strings (CloudEvents 1.0, "REQUIRED").
_REQUIRED = ("id", "source", "specversion", "type")
# Optional context attributes of the spec, all strings when present (time and dataschema included).
_OPTIONAL = ("datacontenttype", "dataschema", "subject", "time")
# RFC 3986 URI-reference: only these characters, and '%' only as a two-digit escape.
_URI_REFERENCE = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})+")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")


def parse(headers: Mapping[str, str], body: bytes, settings: Settings) -> SynthesisEvent:
    """The event in either mode, its attributes and data type-checked before anything else reads them.

    The SDK takes attributes as they come (an id that is a list or a number, a source with spaces)
    and parses JSON without a depth limit (a deeply nested body is a RecursionError); both are 400
    here, checked first.
    """
    # The mode as the SDK decides it: the structured content type wins over any ce- headers.
    binary = not _is_structured(headers)
    if binary:
        _check_attributes({name: headers.get(f"ce-{name}") for name in (*_REQUIRED, *_OPTIONAL)}, "ce-")
    else:
        envelope = _json_body(body, "a structured CloudEvent")
        if not isinstance(envelope, dict):
            raise BadRequest("a structured CloudEvent must be a JSON object of attributes and data")
        _check_attributes(envelope, "")
        for name, value in envelope.items():
            if name not in ("data", "data_base64") and not isinstance(value, (str, int, bool)):
                raise BadRequest(f"CloudEvent attribute {name!r} must be a string, integer or boolean")
    try:
        event = from_http(dict(headers), body, data_unmarshaller=_json_data)
    except (CloudEventError, ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
        if isinstance(exc.__context__, BadRequest):
            # Our data unmarshaller's own answer, which the SDK wraps in a message quoting its repr.
            raise exc.__context__ from None
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
    markup = markup_flag(data.get("ssml"), "data.ssml")
    (text,) = decode_texts(
        [data["text"]], "data.text", TextLimits.of(settings, max_items=1), normalize=not markup
    )
    timestamps = _timestamps(data.get("timestamps"), data.get("output") is not None)
    output = _output(data["output"], settings) if data.get("output") is not None else None
    return SynthesisEvent(
        event=event,
        binary=binary,
        text=text,
        params=params,
        format=_format(data.get("format", DEFAULT_FORMAT)),
        output=output,
        data_sha256=hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest(),
        ssml=markup,
        timestamps=timestamps,
    )


def _timestamps(value: Any, output: bool) -> bool:
    """data.timestamps: absent (null) or "word", on an inline reply only: a stored output's reply is
    replayed from storage on redelivery, which keeps no words."""
    if value is None:
        return False
    if value not in TIMESTAMPS:
        raise BadRequest(f"data.timestamps {value!r} is not supported; accepted: {', '.join(TIMESTAMPS)}")
    if output:
        raise BadRequest(
            "data.timestamps needs an inline reply: a reply with data.output carries no words; "
            "drop data.output or data.timestamps"
        )
    return True


def _check_attributes(attributes: Mapping[str, Any], prefix: str) -> None:
    for name in _REQUIRED:
        value = attributes.get(name)
        if value is None:
            raise BadRequest(f"malformed CloudEvent: attribute {prefix}{name} is missing")
        if not isinstance(value, str) or not value:
            raise BadRequest(f"malformed CloudEvent: attribute {prefix}{name} must be a non-empty string")
    if attributes["specversion"] != "1.0":
        raise BadRequest(f"malformed CloudEvent: specversion {attributes['specversion']!r} is not 1.0")
    if not is_uri_reference(attributes["source"]):
        raise BadRequest(f"malformed CloudEvent: source {attributes['source']!r} is not a URI-reference")
    for name in _OPTIONAL:
        value = attributes.get(name)
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"malformed CloudEvent: attribute {prefix}{name} must be a string")


def is_uri_reference(value: str) -> bool:
    """RFC 3986 URI-reference, as CloudEvents requires of `source`: a URI ("urn:...", "https://...") or a
    relative reference ("/sensors/1"); no spaces or other characters that must be escaped."""
    if not _URI_REFERENCE.fullmatch(value):
        return False
    head = value.split("/", 1)[0]
    if ":" in head.split("?", 1)[0].split("#", 1)[0]:
        return bool(_SCHEME.fullmatch(head.split(":", 1)[0]))  # a scheme, well formed
    return True


def _output(uri: Any, settings: Settings) -> OutputTarget:
    target = parse_output_uri(uri)
    if any(segment in (".", "..") for segment in target.key.split("/")):
        raise BadRequest(f"data.output {target.uri!r} has '.' or '..' segments; name the object plainly")
    if not any(target.uri.startswith(prefix) for prefix in settings.output_prefixes):
        allowed = ", ".join(settings.output_prefixes) or "none: CE_OUTPUT_PREFIXES is empty"
        raise Forbidden(f"data.output {target.uri!r} is outside the allowed output locations ({allowed})")
    return target


def _format(name: Any) -> codecs.Format:
    supported = codecs.supported_formats()
    if not isinstance(name, str) or name not in supported:
        raise BadRequest(f"data.format {name!r} is not supported; supported: {', '.join(supported)}")
    return codecs.FORMATS[name]


def _json_body(raw: bytes | str, what: str) -> Any:
    # orjson, not json: it refuses nesting deeper than 1024 with an error instead of a RecursionError.
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"{what} is not valid JSON: {exc}") from None


def _json_data(raw: bytes | str | None) -> Any:
    if raw in (None, b"", ""):
        return None
    assert raw is not None
    return _json_body(raw, "event data")


def inline_size_bound(text: str, params: SynthesisParams, fmt: codecs.Format, sample_rate: int) -> int:
    """An upper bound on the encoded size of an inline reply, from the text alone, before synthesis."""
    seconds = text_prep.spoken_seconds_bound(text, params.length_scale or 1.0)
    return codecs.encoded_size_bound(seconds, fmt, sample_rate)


async def complete(
    request: SynthesisEvent, service: TTSService, store: OutputStore, settings: Settings
) -> Completion:
    """Do what the event asks: synthesize, then write the output once, or carry the audio inline."""
    # Refuse a bad voice, text or document before storage is asked anything: a 400 must not depend on S3.
    service.check_params(request.params)
    assert service.engine is not None  # check_params() requires ready
    if request.params.seed is None and service.engine.supports_seed:
        # The noise follows from the event, so a redelivery (same source and id) gets the same audio.
        request = dataclasses.replace(
            request, params=dataclasses.replace(request.params, seed=int(request.key, 16) % SEED_LIMIT)
        )
    prepared = await off_loop(
        len(request.text),
        pipeline.prepare_request,
        service,
        [request.text],
        request.params,
        request.ssml,
        settings,
    )
    if request.output is not None:

        async def produce() -> EncodedAudio:
            return (await _synthesize(request, prepared, service))[0]

        return await store.complete(request.output, request.key, request.data_sha256, produce)
    bound = inline_size_bound(request.text, request.params, request.format, service.sample_rate)
    if bound > settings.ce_inline_max_bytes:
        raise ReplyTooLarge(
            f"the {request.format.name} audio of {len(request.text)} characters may reach {bound} bytes, over "
            f"CE_INLINE_MAX_BYTES={settings.ce_inline_max_bytes} for an inline reply; pass data.output (an "
            "s3:// URI) to have it written to storage, or send a shorter text"
        )
    encoded, words = await _synthesize(request, prepared, service)
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
    if words is not None:
        data["words"] = words
    return Completion(data=data, time=now_iso())


async def _synthesize(
    request: SynthesisEvent, prepared: list[list[pipeline.Piece]], service: TTSService
) -> tuple[EncodedAudio, list[dict[str, object]] | None]:
    """The event's audio, encoded, and its words in seconds if it asked for them."""
    result = await pipeline.synthesize_prepared(
        service, prepared, service.settings.crossfade_ms, request.timestamps
    )
    fmt = request.format
    # Encoding (MP3, Opus) costs CPU time: off the event loop, as on every route.
    audio = result.audio[0]
    work = codecs.encode_us(fmt.name, len(audio), result.sample_rate)
    data = await off_loop(work, codecs.encode, audio, result.sample_rate, fmt.name)
    encoded = EncodedAudio(
        data=data,
        format=fmt.name,
        media_type=fmt.media_type,
        sample_rate=codecs.output_sample_rate(fmt, result.sample_rate),
        audio_seconds=round(result.audio_seconds, 4),
    )
    return encoded, None if result.words is None else in_seconds(result.words[0], result.sample_rate)


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
