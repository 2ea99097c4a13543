"""The only way in from the host: TCP ports on 127.0.0.1 forwarded into the node's network namespace.

The listening sockets are bound in the host's namespace first; then the process moves itself into the
node's namespace (setns), so every connection it opens towards a target is made there. Nothing on the
host routes to the node: it has no interface in the host namespace.
Run: python -m cluster.loopback NETNS_PATH LISTEN_PORT:TARGET_HOST:TARGET_PORT ..."""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import sys

CLONE_NEWNET = 0x40000000


def enter(netns_path: str) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(netns_path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns_path}")
    finally:
        os.close(fd)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def _handler(host: str, port: int):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


async def serve(listeners: list[tuple[socket.socket, str, int]]) -> None:
    servers = [await asyncio.start_server(_handler(h, p), sock=s) for s, h, p in listeners]
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str]) -> int:
    netns, specs = argv[0], argv[1:]
    listeners = []
    for spec in specs:
        listen, host, port = spec.split(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", int(listen)))
        sock.listen(128)
        listeners.append((sock, host, int(port)))
    enter(netns)
    asyncio.run(serve(listeners))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
