"""HTTP connections a slow or hostile client cannot use to starve the server or its probes.

Uvicorn's h11 protocol with two changes:

* **A request-head timeout** (HEAD_TIMEOUT_S). Uvicorn times a connection out only while it is idle
  between requests (the keep-alive timeout, armed after a response); a connection that sends half a
  request head, or nothing, is held forever. Here the head must be complete within HEAD_TIMEOUT_S of
  the connection opening or of its first byte after a response; otherwise the connection is closed.
  The body has its own bound (BODY_TIMEOUT_S, in the middleware).
* **The connection limit spares the probes.** Uvicorn's limit_concurrency answers 503 to every request
  once MAX_CONNECTIONS connections are open, the kubelet's liveness and readiness probes included, so
  anyone who can open sockets gets a healthy pod restarted. Here requests for the probe paths are
  always served (they are answered from memory, without the engine); others get 503 with Retry-After
  and a JSON error once the limit is passed. A reserve on the probes' own port, not a port of their
  own: the manifests keep one port, and a second listener would not help when the process runs out
  of file descriptors, which is what many stalled sockets exhaust (``raise_open_files_limit``).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

log = logging.getLogger("predictor.server")

Scope = dict[str, Any]
ASGIApp = Any

# Seconds a client refused for the connection limit is told to wait: stalled heads are closed by then.
_RETRY_AFTER_S = 1


class ConnectionLimit:
    """ASGI: 503 with Retry-After once more than ``limit`` connections or requests are open, except on
    ``exempt`` paths (the probes)."""

    def __init__(
        self, app: ASGIApp, server_state: ServerState, limit: int | None, exempt: frozenset[str]
    ) -> None:
        self.app = app
        self._state = server_state
        self._limit = limit
        self._exempt = exempt

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and self._limit is not None
            and scope["path"] not in self._exempt
            # This request's own connection and task are counted already: uvicorn's ">=" less one.
            and (len(self._state.connections) > self._limit or len(self._state.tasks) > self._limit)
        ):
            await _refuse(send, self._limit)
            return
        await self.app(scope, receive, send)


async def _refuse(send: Any, limit: int) -> None:
    body = (
        b'{"error":"the server holds its maximum of %d connections (MAX_CONNECTIONS); retry shortly"}' % limit
    )
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(_RETRY_AFTER_S).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def guarded_protocol(head_timeout_s: float, probe_paths: frozenset[str]) -> type[H11Protocol]:
    """Uvicorn's h11 protocol with the head timeout and the probe-sparing connection limit; pass it as
    ``Config.http``. The limit is ``Config.limit_concurrency``, which the protocol then leaves to us."""

    class GuardedH11Protocol(H11Protocol):
        def __init__(
            self,
            config: Config,
            server_state: ServerState,
            app_state: dict[str, Any],
            _loop: asyncio.AbstractEventLoop | None = None,
        ) -> None:
            super().__init__(config, server_state, app_state, _loop)
            self.app = ConnectionLimit(self.app, server_state, self.limit_concurrency, probe_paths)
            self.limit_concurrency = None  # uvicorn's own check would refuse the probes too
            self._head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:
                # Bytes of a head that is not complete yet: the first ones after a response start the
                # clock (until then the keep-alive timeout applies).
                if self._head_timer is None and not self.transport.is_closing():
                    self._arm_head_timer()
            else:
                self._disarm_head_timer()

        def on_response_complete(self) -> None:
            self._disarm_head_timer()
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_timer()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._disarm_head_timer()
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_timed_out)

        def _disarm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                # No 408: a client that has not finished its head is not reading either.
                self.transport.close()

    return GuardedH11Protocol


def raise_open_files_limit() -> int:
    """Raise the soft limit on open files to the hard one (as Go does at start) and return it.

    Each connection is a file descriptor; at a soft limit of 1024, MAX_CONNECTIONS stalled sockets
    would leave none for the probes' connections, the model files or S3.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, target, exc)
    return soft
