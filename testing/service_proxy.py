"""A ClusterIP Service as kube-proxy makes one, on 127.0.0.1: each TCP connection goes to one of the
ready endpoints picked at random, and stays with it for the connection's life (iptables' statistic
module; IPVS's rr picks per connection too). Endpoints can be added while connections are open, as a
pod becoming ready is.

What it shows is what a keep-alive pool in front of a Service does (the KEDA HTTP add-on's
interceptor, Go's http.Transport): requests follow the pool's connections, not the endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Iterator

from testing.ports import free_port


class ServiceProxy:
    def __init__(self, endpoints: list[int], seed: int = 0) -> None:
        self.port = free_port()
        self._endpoints = list(endpoints)  # ports on 127.0.0.1
        self._random = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="service-proxy", daemon=True)
        self.connections: dict[int, int] = {}  # endpoint port -> connections sent to it

    def add_endpoint(self, port: int) -> None:
        self._loop.call_soon_threadsafe(self._endpoints.append, port)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._connect, "127.0.0.1", self.port))
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _connect(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        port = self._random.choice(self._endpoints)
        self.connections[port] = self.connections.get(port, 0) + 1
        try:
            upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            client_w.close()
            return

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    w.close()

        await asyncio.gather(pipe(client_r, upstream_w), pipe(upstream_r, client_w))

    def start(self) -> None:
        self._thread.start()
        self._started.wait(10)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@contextlib.contextmanager
def service(endpoints: list[int], seed: int = 0) -> Iterator[ServiceProxy]:
    proxy = ServiceProxy(endpoints, seed)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
