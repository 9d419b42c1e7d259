"""A replication connection's I/O: send one message, read one back.

Request/response, one outstanding request per connection: a follower keeps
one connection per leader node it follows partitions from, carrying them
all (broky.replication.node_link), and one more per partition while it
truncates. Reads go through broky.socket_reads: an answer is awaited after
each request, so a read that would find nothing is never tried.

A follower's link also sends from the worker thread of its append-and-fsync
call (``thread_sender``): its next fetch once the answer's runs are
appended, and its durable ends once the fsync returns. Sent from the trio
thread, each would wait for a hand-back from the thread and for a turn of a
node's busy event loop: 1-3 ms each under load, on the path of every acked
round (docs/cluster.md).
"""

from __future__ import annotations

import logging
import os
import select
from collections.abc import Callable

import trio

from broky.replication.frames import FrameReader, encode
from broky.replication.wire import Message, ReplicationProtocolError
from broky.socket_reads import stream_receiver

log = logging.getLogger("broky.replication")

#: Bytes read per receive.
RECEIVE_BYTES = 256 * 1024
#: Seconds a send from a worker thread waits for room in the socket's
#: buffer (a follower's messages are small, so it waits only when the
#: leader stopped reading): as long as a request may take.
THREAD_SEND_WAIT = 2.0


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

    def thread_sender(self) -> Callable[[Message], None] | None:
        """A send for a worker thread, or None for a stream that is not a
        plain socket (TLS, in-memory). The thread may send only while the
        task that owns this link waits for it, and so sends nothing itself,
        cannot close the stream (``run_in_thread`` waits for the thread
        even when cancelled), and reads nothing that depends on it."""
        stream = self.stream
        if os.name != "posix" or not isinstance(stream, trio.SocketStream):
            return None
        descriptor = stream.socket.fileno()
        return lambda message: send_blocking(descriptor, encode(message))

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


def send_blocking(descriptor: int, data: bytes) -> None:
    """Write all of ``data`` to a non-blocking socket from a worker thread,
    waiting for room up to THREAD_SEND_WAIT (then TimeoutError); OSError if
    the connection failed."""
    view = memoryview(data)
    poller: select.poll | None = None
    while view:
        try:
            view = view[os.write(descriptor, view) :]
        except BlockingIOError:
            if poller is None:
                poller = select.poll()
                poller.register(descriptor, select.POLLOUT)
            if not poller.poll(THREAD_SEND_WAIT * 1000):
                raise TimeoutError("the replication peer stopped reading") from None
