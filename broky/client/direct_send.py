"""A send that never blocks, for the publishing task's first write (``Publisher._kick``)."""

from __future__ import annotations

import os
from collections.abc import Callable

import trio


def nonblocking_writer(stream: trio.abc.Stream) -> Callable[[bytes], int] | None:
    """A write that never blocks on a plain TCP stream (POSIX), for
    ``Publisher._kick``; None for TLS, whose records trio's SSLStream owns.

    It looks the descriptor up on each call, so once the stream is closed it
    writes nothing (fileno -1) rather than to a reused descriptor.
    """
    if os.name != "posix" or not isinstance(stream, trio.SocketStream):
        return None
    sock = stream.socket

    def send_now(data: bytes) -> int:
        try:
            return os.write(sock.fileno(), data)
        except OSError:  # would block, or broken: the writer sends it, or reports why not
            return 0

    return send_now
