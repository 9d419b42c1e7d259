"""A connection's peer named for logs: host:port, a Unix socket, or in-process."""

from __future__ import annotations

import trio


def describe_peer(stream: trio.abc.Stream) -> str:
    """host:port of a socket stream's peer, or a generic name."""
    transport = getattr(stream, "transport_stream", stream)  # under TLS
    socket = getattr(transport, "socket", None)
    if socket is None:
        return "in-process"
    try:
        address = socket.getpeername()
    except OSError:
        return "unknown"
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return f"unix:{address}" if address else "unix"
