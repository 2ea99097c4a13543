"""Free TCP ports on the loopback interface."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on right now (closed on return: connecting to it is refused).

    Another process may take it before the caller binds it; on a shared machine that race is rare
    enough that the callers retry the whole run rather than guard every bind.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
