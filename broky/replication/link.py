"""A replication connection's I/O: send one message, read one back.

Request/response, one outstanding request per connection: a follower keeps
one connection per leader node it follows partitions from, carrying them
all (broky.replication.node_link), and one more per partition while it
truncates. Reads go through broky.socket_reads: an answer is awaited after
each request, so a read that would find nothing is never tried.
"""

from __future__ import annotations

import logging

import trio

from broky.replication.frames import FrameReader, encode
from broky.replication.wire import Message, ReplicationProtocolError
from broky.socket_reads import stream_receiver

log = logging.getLogger("broky.replication")

#: Bytes read per receive.
RECEIVE_BYTES = 256 * 1024


async def open_stream(address: str) -> trio.SocketStream:
    """A TCP connection to a replication listener at ``host:port`` (OSError
    if it cannot be reached)."""
    host, _, port = address.rpartition(":")
    return await trio.open_tcp_stream(host, int(port))


class ReplicationLink:
    """Frames over one stream (either side)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._receive = stream_receiver(stream, RECEIVE_BYTES)
        self._reader = FrameReader()
        self._ready: list[Message] = []

    async def send(self, message: Message) -> None:
        await self.stream.send_all(encode(message))

    async def receive(self) -> Message | None:
        """The next message, or None when the peer closed the stream.
        ReplicationProtocolError for garbage (the caller closes)."""
        while not self._ready:
            data = await self._receive()
            if not data:
                return None
            self._ready.extend(self._reader.feed(bytes(data)))
        return self._ready.pop(0)

    async def request(self, message: Message) -> Message:
        """Send and wait for the answer (the caller bounds the time);
        ReplicationProtocolError if the peer closed or sent garbage."""
        await self.send(message)
        answer = await self.receive()
        if answer is None:
            raise ReplicationProtocolError("the leader closed the replication link")
        return answer
