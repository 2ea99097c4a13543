"""Clients that open connections and then stall: what a hostile or broken client does to a server's
connection limit (serving/connections.py)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

# A request head cut off in its middle: the server waits for the rest until HEAD_TIMEOUT_S.
HALF_A_HEAD = b"POST /v2/models/tts/infer HTTP/1.1\r\nHost: predictor\r\nContent-Type: appl"


@contextlib.contextmanager
def stalled(port: int, n: int, send: bytes = HALF_A_HEAD) -> Iterator[list[socket.socket]]:
    """``n`` connections to 127.0.0.1:``port``, each having sent ``send`` (nothing when empty) and then
    nothing more; all closed when the block ends."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            sockets.append(s)
            if send:
                s.sendall(send)
        yield sockets
    finally:
        for s in sockets:
            s.close()
