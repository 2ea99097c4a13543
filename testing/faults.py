"""A fault-injecting TCP proxy: put it between a client and a real server (the local S3) and break things.

    with FaultProxy("127.0.0.1", moto_port) as proxy:
        env = aws_env(proxy.endpoint)               # the predictor talks to S3 through the proxy
        proxy.set(Faults(reset_after=1 << 20, resets=3))  # the next 3 connections die after 1 MiB

Faults (``Faults``, swapped at any time with ``set``; connections already open see the new ones too):

- ``latency_s``: a delay before each chunk is forwarded, both directions;
- ``bytes_per_s``: a bandwidth cap per connection and direction;
- ``reset_after``: after this many bytes relayed on a connection (both directions together) it is
  reset (RST, as a crashed peer or a middlebox would), for the next ``resets`` connections (None: all);
- ``stall_after``: after this many bytes a connection stops forwarding but stays open (a hung server);
  ``stall_after=0`` stalls every connection, open ones included;
- ``refuse``: the listening socket is closed, so connecting is refused; clearing it listens again on
  the same port.

``downstream_bytes`` counts what the server sent towards clients, so a test can tell a resumed
download (about one artifact's worth) from one started over (more).

With no faults it is a plain TCP proxy, and ``add_target`` makes it a Service as kube-proxy makes one:
each connection goes to one of the targets picked at random (seeded), and stays with it for its life
(a pod becoming ready is a target added while connections are open). That is what a keep-alive pool
in front of a Service meets (the KEDA HTTP add-on's interceptor): requests follow the pool's
connections, not the endpoints.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, replace
from types import TracebackType

from testing.ports import free_port

_CHUNK = 64 * 1024
# How often a stalled or rate-limited pump looks at the faults again.
_TICK_S = 0.02


@dataclass(frozen=True)
class Faults:
    latency_s: float = 0.0
    bytes_per_s: float = 0.0
    reset_after: int | None = None
    resets: int | None = None
    stall_after: int | None = None
    refuse: bool = False


class _Connection:
    def __init__(
        self, proxy: FaultProxy, client: socket.socket, server: socket.socket, reset_after: int | None
    ):
        self.proxy = proxy
        self.client = client
        self.server = server
        self.reset_after = reset_after  # fixed when the connection opened: "the next N connections"
        self.relayed = 0
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.pumps_left = 2

    def start(self) -> None:
        for src, dst, down in ((self.client, self.server, False), (self.server, self.client, True)):
            threading.Thread(target=self._pump, args=(src, dst, down), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        try:
            while not self.closed.is_set():
                self._wait_while_stalled()
                data = src.recv(_CHUNK)
                if not data:
                    # Half-close: the other direction may still be answering.
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    break
                self._forward(data, dst, downstream)
        except OSError:
            self.close(reset=True)
            return
        with self.lock:
            self.pumps_left -= 1
            done = self.pumps_left == 0
        if done:
            self.close()

    def _wait_while_stalled(self) -> None:
        while not self.closed.is_set():
            stall = self.proxy.faults.stall_after
            if stall is None or self.relayed < stall:
                return
            time.sleep(_TICK_S)

    def _forward(self, data: bytes, dst: socket.socket, downstream: bool) -> None:
        faults = self.proxy.faults
        if faults.latency_s:
            time.sleep(faults.latency_s)
        view = memoryview(data)
        while view:
            if self.closed.is_set():
                raise OSError("closed")
            n = len(view)
            with self.lock:
                if self.reset_after is not None:
                    n = min(n, self.reset_after - self.relayed)
                stall = self.proxy.faults.stall_after
                if stall is not None:
                    n = min(n, max(0, stall - self.relayed))
            if n <= 0:
                if self.reset_after is not None and self.relayed >= self.reset_after:
                    self.close(reset=True)
                    raise OSError("reset by the fault proxy")
                self._wait_while_stalled()
                continue
            rate = self.proxy.faults.bytes_per_s
            if rate:
                n = min(n, max(1, int(rate * _TICK_S)))
            dst.sendall(view[:n])
            view = view[n:]
            with self.lock:
                self.relayed += n
            if downstream:
                self.proxy.count_downstream(n)
            if rate:
                time.sleep(n / rate)

    def close(self, reset: bool = False) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                if reset:
                    # SO_LINGER 0: the close sends RST, as a peer that crashed, not FIN.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                # Wakes the other pump blocked in recv (closing alone would not: its recv holds the
                # socket open) without sending FIN, so the RST is what the peer sees.
                sock.shutdown(socket.SHUT_RD)
            with contextlib.suppress(OSError):
                sock.close()
        self.proxy.forget(self)


class FaultProxy:
    """A TCP proxy on 127.0.0.1 (a free port) to ``host:port``, injecting ``Faults``; a context manager."""

    def __init__(self, host: str, port: int, faults: Faults | None = None, seed: int = 0):
        self.targets = [(host, port)]
        self._random = random.Random(seed)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.faults = faults or Faults()
        self.connections_opened = 0
        self.downstream_bytes = 0
        self._resets_left = self.faults.resets
        self._lock = threading.Lock()
        self._open: set[_Connection] = set()
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()
        self._listen()

    # --- control -------------------------------------------------------------------------------
    def set(self, faults: Faults | None = None, **changes: object) -> None:
        """Replace the faults (or change some fields of the current ones)."""
        new = replace(faults or self.faults, **changes)  # type: ignore[arg-type]
        with self._lock:
            self.faults = new
            self._resets_left = new.resets
        if new.refuse and self._listener is not None:
            self._close_listener()
        elif not new.refuse and self._listener is None:
            self._listen()

    def add_target(self, host: str, port: int) -> None:
        """Another upstream: each new connection goes to one of the targets, at random."""
        with self._lock:
            self.targets.append((host, port))

    def clear(self) -> None:
        """No faults any more; stalled connections resume."""
        self.set(Faults())

    def reset_all(self) -> None:
        """Reset every open connection now."""
        with self._lock:
            connections = list(self._open)
        for conn in connections:
            conn.close(reset=True)

    def count_downstream(self, n: int) -> None:
        with self._lock:
            self.downstream_bytes += n

    def forget(self, conn: _Connection) -> None:
        with self._lock:
            self._open.discard(conn)

    def stop(self) -> None:
        self._stopped.set()
        self._close_listener()
        self.reset_all()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- accepting -----------------------------------------------------------------------------
    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed (refuse, or stop)
            with self._lock:
                target = self._random.choice(self.targets)
            try:
                server = socket.create_connection(target, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections_opened += 1
                reset_after = self.faults.reset_after
                if reset_after is not None and self._resets_left is not None:
                    if self._resets_left > 0:
                        self._resets_left -= 1
                    else:
                        reset_after = None
                conn = _Connection(self, client, server, reset_after)
                self._open.add(conn)
            conn.start()
