"""HTTP probes as the kubelet sends them: a fresh TCP connection per probe, one GET, the answer read to
its end (the kubelet's prober disables keep-alive).

Timed from connect to the last byte, with nothing else in the probe's path: an httpx.get builds a client
(and its TLS context) per call, about 50 ms of this process's CPU, which is the client's cost, not the
server's, and under load on a shared 2-CPU machine grows with the load.
"""

from __future__ import annotations

import socket
import time


def http_probe(
    port: int, path: str, timeout_s: float = 1.0, host: str = "127.0.0.1"
) -> tuple[float, int, bytes]:
    """(seconds, status, body) of ``GET path`` on a new connection; TimeoutError past ``timeout_s``
    (the probe's timeoutSeconds), as the kubelet counts a probe that did not answer in time."""
    started = time.monotonic()
    deadline = started + timeout_s
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: kube-probe/1.34\r\nConnection: close\r\n\r\n".encode()
        )
        chunks = []
        while True:
            s.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                raise TimeoutError(f"GET {path}: no full answer within {timeout_s:g} s") from None
            if not chunk:
                break
            chunks.append(chunk)
    seconds = time.monotonic() - started
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return seconds, status, body
