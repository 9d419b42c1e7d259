"""The publisher's direct write: a lone message leaves during ``publish``
itself, and bytes never interleave with the writer task's.

The broker is played by the other end of a socket pair, read with a
server-side ProtocolMachine so that every byte is checked as a broker would.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from broky.client.client import Client
from broky.protocol.codec import encode_frame
from broky.protocol.connection import ProtocolMachine, Role
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES
from broky.protocol.frames import Publish, Welcome
from broky.protocol.framing import encode_preamble
from broky.protocol.message import decode_run


class Peer:
    """The broker's end: takes bytes, gives published payloads in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.machine = ProtocolMachine(Role.SERVER, DEFAULT_MAX_FRAME_BYTES)
        self.payloads: list[bytes] = []

    def take(self, data: bytes) -> None:
        for frame in self.machine.receive_data(data):
            if isinstance(frame, Publish):
                self.payloads += [m.payload for run in frame.runs for m in decode_run(run)]

    def take_waiting(self) -> None:
        """Whatever the socket holds now, without waiting."""
        while True:
            try:
                data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            self.take(data)


@asynccontextmanager
async def client_and_peer(buffer_bytes: int = 0) -> AsyncIterator[tuple[Client, Peer]]:
    ours, theirs = socket.socketpair()
    if buffer_bytes:
        for sock, option in ((ours, socket.SO_SNDBUF), (theirs, socket.SO_RCVBUF)):
            sock.setsockopt(socket.SOL_SOCKET, option, buffer_bytes)
    with theirs:
        theirs.sendall(encode_preamble() + encode_frame(Welcome()))
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
        async with Client.over(stream) as client:
            peer = Peer(theirs)
            await trio.lowlevel.wait_readable(theirs)
            peer.take_waiting()  # preamble and Hello
            yield client, peer
            client.closed = True  # no closing flush: this peer answers no Ping


async def test_a_lone_message_is_written_during_publish() -> None:
    with trio.fail_after(5):
        async with client_and_peer() as (client, peer):
            await client.publish("k", b"first")
            peer.take_waiting()  # no checkpoint since publish: the writer task has not run
            assert peer.payloads == [b"first"]
            await client.publish("k", b"second")
            await client.publish("k", b"third")  # the writer has not run: queued
            peer.take_waiting()
            assert peer.payloads == [b"first"]
            await trio.sleep(0.01)
            peer.take_waiting()
            assert peer.payloads == [b"first", b"second", b"third"]


async def test_bytes_never_interleave_with_a_blocked_writer() -> None:
    """A slow peer keeps the writer inside send_all; publishes meanwhile
    must queue behind it, and everything arrives whole and in order."""
    count = 3000
    with trio.fail_after(20):
        async with client_and_peer(buffer_bytes=4096) as (client, peer):

            async def read_slowly() -> None:
                while len(peer.payloads) < count:
                    await trio.lowlevel.wait_readable(peer.sock)
                    peer.take(peer.sock.recv(2048))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_slowly)
                for number in range(count):
                    await client.publish("k", b"%d" % number + b"." * 500)
                    if number % 7 == 0:
                        await trio.lowlevel.checkpoint()
    assert [int(payload.rstrip(b".")) for payload in peer.payloads] == list(range(count))
