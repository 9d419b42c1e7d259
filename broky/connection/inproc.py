"""An in-process byte pipe: the transport of embedded clients.

A pair of trio Streams joined by two bounded buffers. Embedded clients use it
to reach the broker without TCP, through exactly the connection and router
code a network client goes through. The bound (``max_buffer_bytes`` per
direction) gives the same backpressure a socket's buffer gives.
"""

from __future__ import annotations

from typing import Final

import trio

#: Bytes a pipe direction buffers before the writer waits; about a kernel
#: socket buffer's worth.
DEFAULT_PIPE_BYTES: Final = 1024 * 1024


class _Buffer:
    def __init__(self, max_bytes: int) -> None:
        self.data = bytearray()
        self.max_bytes = max_bytes
        self.closed = False
        self.readable = trio.lowlevel.ParkingLot()
        self.writable = trio.lowlevel.ParkingLot()


class PipeStream(trio.abc.HalfCloseableStream):
    """One end of an in-process pipe."""

    def __init__(self, incoming: _Buffer, outgoing: _Buffer) -> None:
        self._incoming = incoming
        self._outgoing = outgoing
        self._sending = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._sending = True
        try:
            view = memoryview(data)
            while view:
                out = self._outgoing
                if out.closed:
                    raise trio.ClosedResourceError("the pipe is closed")
                room = out.max_bytes - len(out.data)
                if room <= 0:
                    await out.writable.park()
                    continue
                out.data += view[:room]
                view = view[room:]
                out.readable.unpark_all()
            await trio.lowlevel.checkpoint()
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        while len(self._outgoing.data) >= self._outgoing.max_bytes and not self._outgoing.closed:
            await self._outgoing.writable.park()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        incoming = self._incoming
        while not incoming.data:
            if incoming.closed:
                await trio.lowlevel.checkpoint()
                return b""
            await incoming.readable.park()
        size = len(incoming.data) if max_bytes is None else min(max_bytes, len(incoming.data))
        chunk = bytes(incoming.data[:size])
        del incoming.data[:size]
        incoming.writable.unpark_all()
        await trio.lowlevel.checkpoint()
        return chunk

    async def send_eof(self) -> None:
        self._outgoing.closed = True
        self._outgoing.readable.unpark_all()
        self._outgoing.writable.unpark_all()
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        for buffer in (self._incoming, self._outgoing):
            buffer.closed = True
            buffer.readable.unpark_all()
            buffer.writable.unpark_all()
        await trio.lowlevel.checkpoint()


def pipe_pair(max_buffer_bytes: int = DEFAULT_PIPE_BYTES) -> tuple[PipeStream, PipeStream]:
    """Two connected in-process streams (client end, broker end)."""
    a_to_b, b_to_a = _Buffer(max_buffer_bytes), _Buffer(max_buffer_bytes)
    return PipeStream(b_to_a, a_to_b), PipeStream(a_to_b, b_to_a)
