"""The one ASGI middleware: request ids and revision on every response, request counters, shadow records,
and admission of synthesis requests for the drain."""

from __future__ import annotations

import time
from typing import Any

from predictor.observability import metrics
from predictor.observability.request_ids import REQUEST_ID_HEADER, REVISION_HEADER, request_id
from predictor.serving.service import TTSService
from predictor.shadow.recorder import Recorder, begin, end

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Any  # Starlette's app signature: (scope, receive, send) -> awaitable


class RequestMiddleware:
    """Pure ASGI: `x-request-id` and `x-tts-revision` on every response; every response counted by route
    template and status; with a recorder, a shadow record for every request to a synthesis route
    (errors included: compare needs them).

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
        service: TTSService | None = None,
    ):
        self.app = app
        self._service = service
        self._revision = revision.encode()
        self._recorder = recorder
        self._routes = routes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = next((v for k, v in scope["headers"] if k == REQUEST_ID_HEADER.encode()), b"")
        rid = request_id(incoming.decode("latin-1"))
        ids = [(REQUEST_ID_HEADER.encode(), rid.encode()), (REVISION_HEADER.encode(), self._revision)]
        status = 500  # what the client sees if the app raises before answering

        async def send_with_ids(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), *ids]}
            await send(message)

        started = time.perf_counter()
        captured, token = begin() if self._recorder is not None else (None, None)
        try:
            if self._service is not None and scope.get("method") == "POST":
                async with self._service.admit(rid, scope.get("path", "")):
                    await self.app(scope, receive, send_with_ids)
            else:
                await self.app(scope, receive, send_with_ids)
        finally:
            route = getattr(scope.get("route"), "path", None)
            metrics.REQUESTS.labels(route or "unmatched", str(status)).inc()
            if status >= 400:
                metrics.ERRORS.labels(route or "unmatched", str(status)).inc()
            if self._recorder is not None and captured is not None:
                end(token)
                if route in self._routes:
                    self._recorder.submit(rid, route, status, time.perf_counter() - started, captured)
