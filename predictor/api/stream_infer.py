"""Triton's bidirectional `ModelStreamInfer` on the v2 gRPC service: one response per audio window.

KServe's servicer has no streaming method, so this handler adds it to the same service name
(`inference.GRPCInferenceService`), where Triton's clients (`tritonclient.grpc` `start_stream` /
`async_stream_infer`) look for it. Each request on the stream carries one text (input `text`, BYTES,
shape [1]) and the usual v2 parameters (with ``ssml`` true the text is an SSML document); it is
streamed through serving/pipeline.py as the speech route streams it: segmented, each segment
synthesized through the shared queue and decoded in windows (engine/windows.py), the segments
crossfaded, and each window goes back as soon as it is decoded: outputs `audio` FP32 [1, S] and
`audio_length` INT64 [1], the request's id echoed, parameter `sample_rate`. The `words` output (word
timestamps) is ModelInfer's: a stream asking for it is refused, as its words are known only per
segment.

Decoupled protocol, as Triton's decoupled models answer: every response carries the parameter
`triton_final_response`, true on the request's last one. A request with the parameter
`triton_enable_empty_final_response` true gets its data responses flagged false and then one empty
response flagged true, as Triton sends it.

Requests on one stream are answered in order, each admitted for the drain as a unary call is (a
SIGTERM lets the request in progress finish and answers the next with the error "model is
draining"). A malformed request, or one that fails, gets one response with `error_message` set
(Triton's stream error) and the stream stays open for the next request. A stream closed by the client
stops the engine at the next window.

Each request on the stream leaves one shadow record (as a ModelInfer call does), route
`grpc:ModelStreamInfer`, id `<the call's x-request-id>/<the request's id, else its position>`, so
the records of a mirrored stream pair up between revisions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.infer_type import InferRequest

from predictor.api.checks import require_model
from predictor.api.v2_codec import add_grpc_outputs, decode_v2
from predictor.errors import BadRequest, PredictorError
from predictor.serving import pipeline
from predictor.serving.interceptor import call_request_id
from predictor.serving.limits import TextLimits
from predictor.serving.offload import off_loop
from predictor.serving.service import TTSService
from predictor.shadow import recorder as records

log = logging.getLogger("predictor.stream_infer")

SERVICE = "inference.GRPCInferenceService"
METHOD = f"/{SERVICE}/ModelStreamInfer"
METHOD_ROUTE = "grpc:ModelStreamInfer"  # the route its requests are admitted and recorded under
FINAL = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"


@dataclass(frozen=True)
class StreamResponse:
    """Triton's ModelStreamInferResponse: error_message (1) or infer_response (2).

    KServe's proto has no such message and Triton's cannot be imported next to KServe's (both
    declare package `inference`), so it is written here; its infer_response is KServe's
    ModelInferResponse, the same message on the wire.
    """

    error_message: str = ""
    infer_response: pb.ModelInferResponse | None = None

    def serialize(self) -> bytes:
        out = b""
        if self.error_message:
            out += _field(1, self.error_message.encode("utf-8"))
        if self.infer_response is not None:
            out += _field(2, self.infer_response.SerializeToString())
        return out


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


class StreamInferHandler(grpc.GenericRpcHandler):
    """Serves ModelStreamInfer; every other method falls through to KServe's servicer."""

    def __init__(self, service: TTSService, model_name: str, recorder: records.Recorder | None = None):
        self._service = service
        self._model_name = model_name
        self._recorder = recorder

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method != METHOD:
            return None
        return grpc.stream_stream_rpc_method_handler(
            self._stream,
            request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=StreamResponse.serialize,
        )

    async def _stream(
        self, requests: AsyncIterator[pb.ModelInferRequest], _context: Any
    ) -> AsyncIterator[StreamResponse]:
        n = 0
        async for request in requests:
            record_id = f"{call_request_id()}/{request.id or n}"
            n += 1
            captured, token = records.begin() if self._recorder is not None else (None, None)
            started, status = time.perf_counter(), 499  # unless it ends: the client closed the stream
            try:
                # Each request on the stream is admitted as a unary call is (the interceptor admits
                # ModelInfer): a drain lets it finish, and refuses the next one.
                async with self._service.admit(request.id, METHOD_ROUTE):
                    async for response in self._answer(request):
                        yield response
                status = 200
            except PredictorError as exc:
                status = exc.http_status
                if exc.http_status >= 500:
                    log.warning("stream request %r failed: %s", request.id, exc.message)
                yield StreamResponse(error_message=exc.message)
            except Exception:
                status = 500
                raise
            finally:
                if self._recorder is not None:
                    records.end(token)
                    seconds = time.perf_counter() - started
                    self._recorder.submit(record_id, METHOD_ROUTE, status, seconds, captured)

    async def _answer(self, request: pb.ModelInferRequest) -> AsyncIterator[StreamResponse]:
        require_model(request.model_name, self._model_name)
        empty_final = False
        if EMPTY_FINAL in request.parameters:
            empty_final = request.parameters[EMPTY_FINAL].bool_param
            del request.parameters[EMPTY_FINAL]
        try:
            payload = InferRequest.from_grpc(request)
        except Exception as exc:  # KServe raises several types for malformed tensors
            raise BadRequest(f"malformed request: {exc}") from None
        call = decode_v2(
            payload,
            binary_default=bool(payload.use_binary_outputs),
            limits=TextLimits.of(self._service.settings),
        )
        if len(call.texts) != 1:
            raise BadRequest(f"a streamed request carries one text (shape [1]), got {len(call.texts)}")
        if call.timestamps:
            raise BadRequest("output 'words' (word timestamps) needs ModelInfer; a stream cannot carry it")
        raw = all(binary for _, binary in call.outputs)
        sample_rate = self._service.sample_rate
        settings = self._service.settings
        self._service.check_params(call.params)
        (pieces,) = await off_loop(
            len(call.texts[0]),
            pipeline.prepare_request,
            self._service,
            call.texts,
            call.params,
            call.ssml,
            settings,
        )
        windows = _with_last(pipeline.windows(self._service, pieces, settings.crossfade_ms))
        async for audio, last in windows:
            if not len(audio) and not last:
                continue  # the crossfade holding a segment's head: nothing to send yet
            response = pb.ModelInferResponse(model_name=self._model_name, id=call.request_id)
            response.parameters["sample_rate"].int64_param = sample_rate
            response.parameters[FINAL].bool_param = last and not empty_final
            tensors = {
                "audio": (audio.reshape(1, -1), "FP32", "fp32_contents"),
                "audio_length": (np.array([len(audio)], dtype=np.int64), "INT64", "int64_contents"),
            }
            add_grpc_outputs(response, call, tensors, raw)
            yield StreamResponse(infer_response=response)
        if empty_final:
            response = pb.ModelInferResponse(model_name=self._model_name, id=call.request_id)
            response.parameters[FINAL].bool_param = True
            yield StreamResponse(infer_response=response)


async def _with_last(pieces: AsyncIterator[np.ndarray]) -> AsyncIterator[tuple[np.ndarray, bool]]:
    """Each piece with whether it is the last, one piece behind."""
    held = await anext(pieces, None)
    while held is not None:
        following = await anext(pieces, None)
        yield held, following is None
        held = following
