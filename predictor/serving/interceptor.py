"""The gRPC interceptor: errors to status codes, request counters, request ids and shadow records."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from grpc import StatusCode
from grpc_interceptor.exceptions import GrpcException
from kserve.errors import (
    InferenceError,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    ServerNotLive,
    ServerNotReady,
    UnsupportedProtocol,
)
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor

from predictor.errors import PredictorError
from predictor.observability import metrics, request_ids
from predictor.observability.logs import CLIENT_ERRORS
from predictor.serving.service import TTSService
from predictor.shadow import recorder as records

log = logging.getLogger("predictor.server")


GRPC_SYNTHESIS_METHODS = frozenset({"ModelInfer"})

# The call's request id, for the log line of an unexpected error (one interceptor serves every call).
_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("grpc_request_id", default="")


def call_request_id() -> str:
    """The id the interceptor gave the gRPC call this task serves ("" outside one)."""
    return _REQUEST_ID.get()


# KServe's errors and their status, as KServe's interceptor maps them; anything else reaching the
# interceptor is a bug of ours. Mapped here so that a client's error is not logged with a traceback
# (KServe's interceptor logs every one of them as an ERROR with its stack).
_KSERVE_ERRORS: tuple[tuple[type[Exception], StatusCode], ...] = (
    (InferenceError, StatusCode.INVALID_ARGUMENT),
    (InvalidInput, StatusCode.INVALID_ARGUMENT),
    (UnsupportedProtocol, StatusCode.INVALID_ARGUMENT),
    (ModelNotFound, StatusCode.NOT_FOUND),
    (ModelNotReady, StatusCode.UNAVAILABLE),
    (ServerNotLive, StatusCode.UNAVAILABLE),
    (ServerNotReady, StatusCode.UNAVAILABLE),
    (NotImplementedError, StatusCode.UNIMPLEMENTED),
)


# Shadow records carry HTTP statuses, so compare can count errors alike across REST and gRPC.
_GRPC_AS_HTTP = {
    StatusCode.OK: 200,
    StatusCode.INVALID_ARGUMENT: 400,
    StatusCode.NOT_FOUND: 404,
    StatusCode.PERMISSION_DENIED: 403,
    StatusCode.RESOURCE_EXHAUSTED: 413,
    StatusCode.UNAVAILABLE: 503,
    StatusCode.UNIMPLEMENTED: 501,
    StatusCode.CANCELLED: 499,  # nginx's "client closed request", as the REST middleware records it
}


def _count(route: str, code: StatusCode) -> None:
    metrics.REQUESTS.labels(route, code.name).inc()
    if code != StatusCode.OK:
        metrics.ERRORS.labels(route, code.name).inc()


async def _counted_stream(responses: AsyncIterator[Any], route: str, context: Any) -> AsyncIterator[Any]:
    """``responses``, counted by how the stream ended: OK when it ran out, CANCELLED when the client
    cancelled or went away before its end (the task cancelled, or the iteration closed early)."""
    code = StatusCode.OK
    try:
        async for response in responses:
            yield response
    except BaseException as exc:
        code = _ended_by(exc, context)
        raise
    finally:
        _count(route, code)


def _ended_by(exc: BaseException, context: Any) -> StatusCode:
    """The status of a call that raised ``exc``: CANCELLED when its client cancelled or went away (grpc
    cancels the handler, which stops its work at the next engine call or window; a stream's iteration
    is closed early), else what the handler set, else UNKNOWN."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return StatusCode.CANCELLED
    return context.code() or StatusCode.UNKNOWN


class GrpcInterceptor(ExceptionToStatusInterceptor):
    """KServe's mapping plus ours, a request counter by method and final status, request ids in the
    initial metadata, a shadow record per ModelInfer, and each ModelInfer admitted for the drain."""

    def __init__(self, revision: str, recorder: records.Recorder | None, service: TTSService | None = None):
        super().__init__()
        self._revision = revision
        self._recorder = recorder
        self._service = service

    async def intercept(self, method: Any, request_or_iterator: Any, context: Any, method_name: str) -> Any:
        code = StatusCode.OK
        name = method_name.rsplit("/", 1)[-1]
        route = "grpc:" + name
        incoming = dict(context.invocation_metadata() or ()).get(request_ids.REQUEST_ID_HEADER)
        rid = request_ids.request_id(incoming if isinstance(incoming, str) else None)
        await context.send_initial_metadata(
            ((request_ids.REQUEST_ID_HEADER, rid), (request_ids.REVISION_HEADER, self._revision))
        )
        _REQUEST_ID.set(rid)
        started = time.perf_counter()
        # Audio is captured only for calls that will leave a record, as in the REST middleware.
        recorded = self._recorder is not None and name in GRPC_SYNTHESIS_METHODS
        captured, token = records.begin() if recorded else (None, None)
        streamed = False
        try:
            if self._service is not None and name in GRPC_SYNTHESIS_METHODS:
                async with self._service.admit(rid, route):
                    return await super().intercept(method, request_or_iterator, context, method_name)
            response = await super().intercept(method, request_or_iterator, context, method_name)
            if hasattr(response, "__aiter__"):
                # A streamed answer runs after this returns: its outcome is counted when it ends.
                streamed = True
                return _counted_stream(response, route, context)
            return response
        except BaseException as exc:
            code = _ended_by(exc, context)
            raise
        finally:
            if not streamed:
                _count(route, code)
            if recorded and self._recorder is not None:
                records.end(token)
                status = _GRPC_AS_HTTP.get(code, 500)
                self._recorder.submit(rid, route, status, time.perf_counter() - started, captured)

    async def handle_exception(
        self, ex: Exception, request_or_iterator: Any, context: Any, method_name: str
    ) -> None:
        route = "grpc:" + method_name.rsplit("/", 1)[-1]
        if isinstance(ex, PredictorError):
            if ex.http_status >= 500:
                log.warning("grpc %s failed: %s", method_name, ex.message)
            else:
                CLIENT_ERRORS.info("%s %s: %s", route, ex.grpc_status, ex.message)
            await context.abort(StatusCode[ex.grpc_status], ex.message)
        for kind, status in _KSERVE_ERRORS:
            if isinstance(ex, kind):
                # Not ready, not found, bad input: expected answers, one line each without a stack.
                reason = getattr(ex, "reason", None) or str(ex)
                CLIENT_ERRORS.info("%s %s: %s", route, status.name, reason)
                await context.abort(status, reason)
        if not isinstance(ex, GrpcException):
            # As over REST: one log line with the request id and the traceback, INTERNAL with a message
            # naming the id (the metadata, sent first, carries it too).
            rid = _REQUEST_ID.get()
            log.error(
                "unhandled error: %s: %s",
                type(ex).__name__,
                ex,
                exc_info=ex,
                extra={"request_id": rid, "route": route},
            )
            await context.abort(
                StatusCode.INTERNAL, f"internal error ({type(ex).__name__}); request id {rid}"
            )
        await super().handle_exception(ex, request_or_iterator, context, method_name)
