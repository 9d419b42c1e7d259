"""A replication connection's I/O: send one message, read one back.

Request/response, one outstanding request per connection: a follower keeps
one connection per leader node it follows partitions from, carrying them
all (broky.replication.node_link), and one more per partition while it
truncates. Reads go through broky.socket_reads: an answer is awaited after
each request, so a read that would find nothing is never tried.

Writes to a plain socket are one non-blocking ``os.write``
(broky.client.direct_send, as a publishing client's first write), falling back to
``send_all`` for what the socket did not take: trio's ``send_all`` costs
two checkpoints and a conflict detector per message, twice per round of
every link (a request and an answer), where the read that follows each
write parks the task anyway.
"""

from __future__ import annotations

import logging

import trio

from broky.client.direct_send import nonblocking_writer
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
        #: None on TLS: every write is ``send_all``.
        self._send_now = nonblocking_writer(stream)
        self._reader = FrameReader()
        self._ready: list[Message] = []

    async def send(self, message: Message) -> None:
        await self.send_frame(encode(message))

    async def send_frame(self, frame: bytes) -> None:
        """Write ``frame`` (see the module docstring). A cancelled caller
        sends nothing, as with ``send_all``."""
        await trio.lowlevel.checkpoint_if_cancelled()
        # A write that fails (closed, broken) takes nothing: send_all then
        # raises trio's own error for it.
        sent = self._send_now(frame) if self._send_now is not None else 0
        if sent < len(frame):
            await self.stream.send_all(memoryview(frame)[sent:])

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
        return await self.request_frame(encode(message))

    async def request_frame(self, frame: bytes) -> Message:
        """``request`` of a message already framed (a follower link's
        FetchMany, broky.replication.frames ``encode_fetch_many``)."""
        await self.send_frame(frame)
        answer = await self.receive()
        if answer is None:
            raise ReplicationProtocolError("the leader closed the replication link")
        return answer
