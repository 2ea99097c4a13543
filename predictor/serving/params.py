"""Request parameters and texts as every protocol sends them, checked into SynthesisParams."""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf.unknown_fields import UnknownFieldSet
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

from predictor import text as text_prep
from predictor.engine.base import SEED_LIMIT, SynthesisParams
from predictor.errors import BadRequest
from predictor.serving.limits import TextLimits, check_count, check_length

# Protobuf field numbers and wire types of the v2 InferParameter oneof (double_param, uint64_param).
_DOUBLE_PARAM, _UINT64_PARAM = 4, 5
_WIRE_FIXED64, _WIRE_VARINT = 1, 0

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


def plain_value(value: Any) -> Any:
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
        value = plain_value(value)
        if name in ("length_scale", "noise_scale", "noise_w"):
            values[name] = _number(name, value, strings_allowed)
        elif name == "seed":
            if isinstance(value, float) and value.is_integer() and not 0 <= value < SEED_LIMIT:
                # orjson reads an integer literal beyond 64 bits as a float: say what was sent, an
                # integer out of range (SynthesisParams' own check), not "a float".
                value = int(value)
            values[name] = _integer(name, value, strings_allowed)
        elif name == "voice":
            if not isinstance(value, str) or not value:
                raise BadRequest("parameter voice must be a non-empty string")
            values[name] = value
        elif name not in extra_ok:
            raise BadRequest(f"unknown parameter {name!r}; accepted: {', '.join(SYNTH_PARAMS)}")
    return SynthesisParams(**values)


def markup_flag(value: Any, where: str = "parameter ssml") -> bool:
    """Whether a request's texts are SSML (predictor/ssml.py): a boolean, absent meaning false."""
    value = plain_value(value)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{where} must be a boolean, got {value!r}")
    return value


def decode_texts(
    items: Any, where: str = "text", limits: TextLimits | None = None, normalize: bool = True
) -> list[str]:
    """Texts as every protocol sends them (str or UTF-8 bytes), normalized once, here at the boundary:
    control characters (NUL included) and lone surrogates become spaces, so none ever reaches
    espeak-ng; see text.normalize.

    ``limits`` are checked first, on the texts as sent (decoding and counting characters run in C,
    normalizing runs in Python): a text far over MAX_TEXT_CHARS is refused in microseconds instead of being
    normalized first, which held the event loop for seconds. SSML documents (``normalize`` false) are
    normalized span by span once parsed (serving/pipeline.py), never as markup.
    """
    if limits is not None:
        check_count(len(items), limits.max_items)
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
        if limits is not None:
            check_length(i, len(item), limits.max_chars)
        out.append(text_prep.normalize(item) if normalize else item)
    return out
