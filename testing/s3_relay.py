"""An HTTP relay in front of the local S3 that answers chosen requests with an S3 error.

moto cannot be told to fail one upload part or the next three PUTs; this relay can. Every request is
read whole (``Expect: 100-continue`` included, as botocore sends for uploads) and forwarded to the
upstream on a fresh connection, unless a rule claims it: then the client gets the rule's S3 error
and the upstream never sees the request (or, for a rule with ``applied``, sees and applies it, and
only its answer is lost: a write that took effect though the caller heard a failure). Every request line is recorded, in order, with whether it
was spoiled, so a test can count attempts, parts and aborts.

``one_at_a_time`` forwards the requests it matches one after another. moto checks a conditional write
(``If-None-Match: *``) and then writes without a lock, so two completions racing on one key can both
pass; S3 decides them atomically. Serializing them here gives moto S3's behaviour.
"""

from __future__ import annotations

import contextlib
import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# S3's own answers for the faults the tests inject.
ERRORS = {
    403: ("AccessDenied", "Access Denied"),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
}
# Hop-by-hop headers the relay must not copy onto the other connection.
_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "host"}


@dataclass
class Seen:
    method: str
    path: str  # with its query string
    spoiled: bool


@dataclass
class Rule:
    """Spoil requests for which ``matches(method, path)`` holds, the first ``times`` of them (None: all).

    ``applied``: forward the request to the upstream first, then answer the error instead of its reply.
    """

    matches: Callable[[str, str], bool]
    status: int = 403
    times: int | None = None
    applied: bool = False
    hits: int = field(default=0)


class S3Relay:
    """The relay on a free loopback port; ``url`` is the endpoint to give boto3 instead of upstream's."""

    def __init__(self, upstream: str, one_at_a_time: Callable[[str, str], bool] | None = None) -> None:
        parts = urlsplit(upstream)
        self._one_at_a_time = one_at_a_time
        self._serial = threading.Lock()
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rules: list[Rule] = []
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _relay(self) -> None:
                relay._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def fail(
        self,
        matches: Callable[[str, str], bool],
        status: int = 403,
        times: int | None = None,
        applied: bool = False,
    ) -> Rule:
        rule = Rule(matches, status, times, applied)
        self.rules.append(rule)
        return rule

    def requests(self, method: str, contains: str = "") -> list[Seen]:
        """The requests seen with this method whose path (and query) contains ``contains``."""
        with self._lock:
            return [s for s in self.seen if s.method == method and contains in s.path]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _spoiling(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if (rule.times is None or rule.hits < rule.times) and rule.matches(method, path):
                    rule.hits += 1
                    self.seen.append(Seen(method, path, True))
                    return rule
            self.seen.append(Seen(method, path, False))
            return None

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("content-length") or 0)
        body = h.rfile.read(length) if length else b""
        rule = self._spoiling(h.command, h.path)
        if rule is not None:
            if rule.applied:
                self._exchange(h, body)
            code, message = ERRORS[rule.status]
            error = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
            h.send_response(rule.status)
            h.send_header("content-type", "application/xml")
            h.send_header("content-length", str(len(error)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(error)
            return
        serial = self._one_at_a_time is not None and self._one_at_a_time(h.command, h.path)
        with self._serial if serial else contextlib.nullcontext():
            self._forward(h, body)

    def _exchange(self, h: BaseHTTPRequestHandler, body: bytes) -> tuple[http.client.HTTPResponse, bytes]:
        """The request sent upstream on a fresh connection; its response, read whole."""
        upstream = http.client.HTTPConnection(*self._upstream, timeout=60)
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
            upstream.request(h.command, h.path, body=body, headers=headers)
            response = upstream.getresponse()
            return response, response.read()
        finally:
            upstream.close()

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes) -> None:
        response, data = self._exchange(h, body)
        h.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in _HOP and key.lower() != "content-length":
                h.send_header(key, value)
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
