"""Slow and hostile clients: stalled request heads are closed, and the probes are answered however many
sockets are held open (predictor.serving.connections), over real sockets to a real predictor."""

from __future__ import annotations

import contextlib
import socket
import time

import pytest

from testing.predictor import PredictorProcess
from testing.slow_clients import HALF_A_HEAD, stalled

HEAD_TIMEOUT_S = 6.0
PROBES = ("/v2/health/live", "/v2/models/tts/ready")
# Kubernetes' default probe timeout (timeoutSeconds: 1), which the manifests keep.
PROBE_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def guarded(start_predictor) -> PredictorProcess:
    return start_predictor(ENGINE="onnx", HEAD_TIMEOUT_S=str(HEAD_TIMEOUT_S), MAX_CONNECTIONS="1000")


def _connect(p: PredictorProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", p.http_port), timeout=30)


def _stalled(
    p: PredictorProcess, n: int, send: bytes = HALF_A_HEAD
) -> contextlib.AbstractContextManager[list[socket.socket]]:
    return stalled(p.http_port, n, send)


def _closed_by_peer(s: socket.socket, within_s: float) -> float | None:
    """Seconds until the server closed ``s`` (recv gives EOF or a reset), or None if it stayed open."""
    s.settimeout(within_s)
    started = time.monotonic()
    try:
        data = s.recv(1024)
    except TimeoutError:
        return None
    except ConnectionResetError:
        return time.monotonic() - started
    assert data == b"", data
    return time.monotonic() - started


def _response(s: socket.socket) -> bytes:
    """One whole response with a Content-Length body, as read off the socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += s.recv(4096)
    return head + b"\r\n\r\n" + body


def test_a_stalled_request_head_is_closed_after_head_timeout_s(guarded):
    with _stalled(guarded, 5) as half_heads, _stalled(guarded, 5, send=b"") as silent:
        opened = time.monotonic()
        for s in [*half_heads, *silent]:
            closed = _closed_by_peer(s, within_s=HEAD_TIMEOUT_S + 5)
            assert closed is not None, "the server still holds a stalled connection"
        assert HEAD_TIMEOUT_S - 0.5 <= time.monotonic() - opened <= HEAD_TIMEOUT_S + 5


def test_an_idle_keep_alive_connection_outlives_the_head_timeout(guarded):
    request = b"GET /v2/health/live HTTP/1.1\r\nHost: predictor\r\n\r\n"
    with _stalled(guarded, 1, send=request) as (s,):
        assert _response(s).startswith(b"HTTP/1.1 200 OK")
        # Idle between requests is the keep-alive timeout's business (65 s), not the head timeout's.
        assert _closed_by_peer(s, within_s=HEAD_TIMEOUT_S + 2) is None
        s.sendall(request)
        assert _response(s).startswith(b"HTTP/1.1 200 OK")


def test_probes_answer_within_their_timeout_while_1500_stalled_connections_are_held(guarded):
    with _stalled(guarded, 1500):
        probe_times = []
        for _ in range(3):
            for path in PROBES:
                started = time.monotonic()
                response = guarded.get(path, timeout=PROBE_TIMEOUT_S)
                probe_times.append(time.monotonic() - started)
                assert response.status_code == 200, (path, response.text)
        # Anything else is refused at once, saying when to come back, rather than left hanging.
        refused = guarded.get("/v2/models/tts", timeout=PROBE_TIMEOUT_S)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert "MAX_CONNECTIONS" in refused.json()["error"]
    assert max(probe_times) < PROBE_TIMEOUT_S
    # Once the stalled sockets are gone, the server serves as before.
    assert guarded.get("/v2/models/tts").status_code == 200
