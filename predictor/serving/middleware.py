"""The one ASGI middleware: request ids and revision on every response, request counters, shadow records,
admission of synthesis requests for the drain, per-request limits, and a well-formed 500 for an error
nothing else handled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson

from predictor.errors import PayloadTooLarge, RequestTimeout
from predictor.observability import metrics
from predictor.observability.request_ids import REQUEST_ID_HEADER, REVISION_HEADER, request_id
from predictor.serving.service import TTSService
from predictor.shadow.recorder import Recorder, begin, end

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Any  # Starlette's app signature: (scope, receive, send) -> awaitable

log = logging.getLogger("predictor.server")

# nginx's status for a request whose client closed the connection before the answer was complete:
# never sent (nobody is listening), only counted and recorded.
CLIENT_CLOSED_REQUEST = 499


def _is_event(headers: list[tuple[bytes, bytes]]) -> bool:
    """A CloudEvent in either mode: binary (ce- headers) or structured (its content type)."""
    return any(
        k.startswith(b"ce-") or (k == b"content-type" and v.startswith(b"application/cloudevents"))
        for k, v in headers
    )


@dataclass(frozen=True)
class Limits:
    """What one request may cost before it is refused (Settings: MAX_REQUEST_BYTES, MAX_HEADER_BYTES,
    MAX_HEADER_COUNT, BODY_TIMEOUT_S)."""

    max_body_bytes: int
    max_header_bytes: int
    max_header_count: int
    body_timeout_s: float


class RequestMiddleware:
    """Pure ASGI: `x-request-id` and `x-tts-revision` on every response; every response counted by route
    template and status; with a recorder, a shadow record for every request to a synthesis route
    (errors included: compare needs them).

    Limits, before the app sees the request: headers over ``max_header_bytes`` in all or more than
    ``max_header_count`` of them is 431; a declared
    Content-Length over ``max_body_bytes`` is 413 at once, a chunked body is cut off with 413 as soon as
    it passes the limit, and a body still incomplete after ``body_timeout_s`` is 408. These answers
    carry ``Connection: close``: the rest of the body is never read. With ``close_when_busy``, so does
    every answer that starts while the service holds more requests than its workers run: a keep-alive
    pool in front of a Service dials again, and kube-proxy picks a ready pod for the next request.

    An exception no handler turned into a response becomes a 500 {"error"} with both headers, counted,
    logged once with the request id and traceback; the connection stays usable (the body was answered
    in full). Only if the response had already started (a stream) is the connection dropped.

    Installed outermost, so its latency covers everything the app does for the request, and so the
    drain's admission (every POST: each synthesis route is one, and no other POST runs long) spans the
    whole response, a stream's last chunk included.
    """

    def __init__(
        self,
        app: ASGIApp,
        revision: str,
        recorder: Recorder | None,
        routes: frozenset[str],
        limits: Limits,
        service: TTSService | None = None,
        close_when_busy: bool = False,
    ):
        self.app = app
        self._service = service
        self._close_when_busy = close_when_busy
        self._revision = revision.encode()
        self._recorder = recorder
        self._routes = routes
        self._limits = limits

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = next((v for k, v in scope["headers"] if k == REQUEST_ID_HEADER.encode()), b"")
        rid = request_id(incoming.decode("latin-1"))
        ids = [(REQUEST_ID_HEADER.encode(), rid.encode()), (REVISION_HEADER.encode(), self._revision)]
        status = 500  # what the client sees if the app raises before answering
        started_response = False
        completed = False  # the response's last byte was sent
        close = False  # set when the body was not read to its end: the connection cannot be reused
        disconnected = asyncio.Event()
        watcher: asyncio.Future[Message] | None = None

        async def send_with_ids(message: Message) -> None:
            nonlocal status, started_response, completed
            if message["type"] == "http.response.start":
                status = message["status"]
                started_response = True
                extra = [(b"connection", b"close")] if close or self._busy() else []
                message = {**message, "headers": [*message.get("headers", ()), *ids, *extra]}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                completed = True
            await send(message)

        def watch() -> asyncio.Future[Message]:
            # Once the body is read, the only message left is http.disconnect. One reader for it,
            # shared by the app (Starlette's streams watch for it) and the cancellation below.
            nonlocal watcher
            if watcher is None:
                watcher = asyncio.ensure_future(receive())
                watcher.add_done_callback(lambda _: disconnected.set())
            return watcher

        async def answer(code: int, error: str) -> None:
            nonlocal close
            close = close or code in (408, 413, 431)
            await send_with_ids(
                {
                    "type": "http.response.start",
                    "status": code,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send_with_ids({"type": "http.response.body", "body": orjson.dumps({"error": error})})

        started = time.perf_counter()
        deadline = time.monotonic() + self._limits.body_timeout_s
        received = 0
        body_done = False

        async def limited_receive() -> Message:
            # Raises PredictorErrors, which the app's handler answers (413/408) like any bad input.
            nonlocal received, body_done, close
            if body_done:
                return await asyncio.shield(watch())  # after the body: the disconnect, no deadline
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                close = True
                raise RequestTimeout(
                    f"the request body took longer than BODY_TIMEOUT_S={self._limits.body_timeout_s:g} s"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self._limits.max_body_bytes:
                    close = True
                    raise PayloadTooLarge(self._too_large(f"over {self._limits.max_body_bytes}"))
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            if body_done:
                watch()
            return message

        async def until_answered_or_gone() -> None:
            """Run the app; if the client goes away before its answer is complete, cancel the app: the
            work stops at the next engine call or window, and the request counts as 499."""
            nonlocal status
            app = asyncio.ensure_future(self.app(scope, limited_receive, send_with_ids))
            gone = asyncio.ensure_future(disconnected.wait())
            try:
                await asyncio.wait({app, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not app.done() and not completed:
                    app.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await app
                    status = CLIENT_CLOSED_REQUEST
                    return
                await app
            finally:
                gone.cancel()
                if not app.done():
                    app.cancel()

        captured, token = begin() if self._recorder is not None else (None, None)
        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await answer(*refusal)
            elif self._service is not None and scope.get("method") == "POST":
                async with self._service.admit(rid, scope.get("path", "")):
                    if _is_event(scope["headers"]):
                        # An event is finished whoever waits: the bus redelivers it, and the work done
                        # (an output written once) answers the redelivery.
                        await self.app(scope, limited_receive, send_with_ids)
                    else:
                        await until_answered_or_gone()
            else:
                await self.app(scope, limited_receive, send_with_ids)
        except Exception as exc:
            route = getattr(scope.get("route"), "path", None) or scope.get("path", "")
            log.error(
                "unhandled error: %s: %s",
                type(exc).__name__,
                exc,
                exc_info=True,
                extra={"request_id": rid, "route": route},
            )
            if started_response:
                raise  # a stream cut short: dropping the connection is the only signal left
            status = 500
            await answer(500, f"internal error ({type(exc).__name__}); request id {rid}")
        finally:
            if watcher is not None and not watcher.done():
                watcher.cancel()
            route = getattr(scope.get("route"), "path", None)
            metrics.REQUESTS.labels(route or "unmatched", str(status)).inc()
            if status >= 400:
                metrics.ERRORS.labels(route or "unmatched", str(status)).inc()
            if self._recorder is not None and captured is not None:
                end(token)
                if route in self._routes:
                    self._recorder.submit(rid, route, status, time.perf_counter() - started, captured)

    def _busy(self) -> bool:
        """Close this connection after the answer: the pod has requests waiting, and a keep-alive pool in
        front of a Service would keep sending it more (Settings.close_when_busy)."""
        return self._close_when_busy and self._service is not None and self._service.busy

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        """(status, message) for a request refused on its head alone, before the app reads anything."""
        headers = scope["headers"]
        # h11 bounds only a head that arrives in pieces (MAX_HEADER_BYTES, what a slow client may make
        # it buffer); a whole head read at once is measured here.
        size = sum(len(k) + len(v) + 4 for k, v in headers)
        if size > self._limits.max_header_bytes:
            return (
                431,
                f"request headers of {size} bytes; the limit is MAX_HEADER_BYTES={self._limits.max_header_bytes}",
            )
        if len(headers) > self._limits.max_header_count:
            return (
                431,
                f"{len(headers)} request headers; the limit is MAX_HEADER_COUNT={self._limits.max_header_count}",
            )
        declared = next((v for k, v in headers if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self._limits.max_body_bytes:
            return PayloadTooLarge.http_status, self._too_large(f"{int(declared)}")
        return None

    def _too_large(self, size: str) -> str:
        return f"request body of {size} bytes; the limit is MAX_REQUEST_BYTES={self._limits.max_body_bytes}"
