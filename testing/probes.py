"""HTTP probes as the kubelet sends them: a fresh TCP connection per probe, one GET, the answer read to
its end (the kubelet's prober disables keep-alive).

Timed from connect to the last byte, with nothing else in the probe's path: an httpx.get builds a client
(and its TLS context) per call, about 50 ms of this process's CPU, which is the client's cost, not the
server's, and under load on a shared 2-CPU machine grows with the load.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
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


def probes_from_another_process(
    port: int, path: str, seconds: float, every_s: float = 0.02, timeout_s: float = 1.0
) -> tuple[list[float], list[str]]:
    """``http_probe`` every ``every_s`` for ``seconds`` from a child process, as the kubelet probes from
    a process of its own: a prober beside load-generating threads would wait for their GIL and count
    that wait as the server's. (sorted seconds of the probes answered 200 with a body, why each other
    probe failed)."""
    done = subprocess.run(
        [sys.executable, "-m", "testing.probes", str(port), path, str(seconds), str(every_s), str(timeout_s)],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    result = json.loads(done.stdout)
    return sorted(result["ok"]), result["failed"]


def _probe_for(port: int, path: str, seconds: float, every_s: float, timeout_s: float) -> dict[str, list]:
    ok: list[float] = []
    failed: list[str] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            took, status, body = http_probe(port, path, timeout_s=timeout_s)
        except (TimeoutError, OSError) as exc:
            failed.append(f"{type(exc).__name__}: {exc}")
        else:
            if status == 200 and body:
                ok.append(took)
            else:
                failed.append(f"status {status}, {len(body)} body bytes")
        time.sleep(every_s)
    return {"ok": ok, "failed": failed}


if __name__ == "__main__":
    port, path, seconds, every_s, timeout_s = sys.argv[1:6]
    print(json.dumps(_probe_for(int(port), path, float(seconds), float(every_s), float(timeout_s))))
