"""Direct socket reads (broky.socket_reads): same bytes,
same errors as ``receive_some``, and a drained socket parks the reader
before anyone else runs, so a woken consumer goes first."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import trio

from broky.socket_reads import DirectReceiver, stream_receiver


@contextmanager
def pair() -> Iterator[tuple[trio.SocketStream, socket.socket]]:
    """Our end as a trio stream, the peer's as a plain socket; both closed after."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        yield trio.SocketStream(trio.socket.from_stdlib_socket(ours)), theirs


async def test_reads_every_byte_in_order_across_full_and_short_reads() -> None:
    with pair() as (stream, peer), trio.fail_after(5):
        receive = stream_receiver(stream, 1000)
        sent = bytes(range(256)) * 20  # 5,120 bytes: five full reads, then a short one
        peer.sendall(sent)
        received = b""
        while len(received) < len(sent):
            chunk = await receive()
            assert 0 < len(chunk) <= 1000
            received += chunk
        assert received == sent
        peer.sendall(b"later")
        assert await receive() == b"later"
        peer.close()
        assert await receive() == b""


async def test_a_drained_socket_parks_the_reader_before_the_next_read() -> None:
    with pair() as (stream, peer), trio.fail_after(5):
        receiver = DirectReceiver(stream.socket, 1000)
        peer.sendall(b"one")
        assert await receiver.receive() == b"one"
        order: list[str] = []

        async def read_next() -> None:
            order.append("reader parked" if not await receiver.receive() else "read")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_next)
            await trio.testing.wait_all_tasks_blocked()
            order.append("blocked")  # the short read sent it straight to wait
            peer.sendall(b"two")
        assert order == ["blocked", "read"]


async def test_a_full_read_checkpoints_so_other_tasks_run_between_reads() -> None:
    with pair() as (stream, peer), trio.fail_after(5):
        receiver = DirectReceiver(stream.socket, 10)
        peer.sendall(bytes(range(100)))
        assert await receiver.receive() == bytes(range(10))  # full: more may be waiting
        with trio.CancelScope() as scope:
            scope.cancel()
            await receiver.receive()  # a checkpoint, before anything is read
        assert scope.cancelled_caught
        assert await receiver.receive() == bytes(range(10, 20))


async def test_closing_the_stream_wakes_a_waiting_reader_with_closed_resource() -> None:
    with pair() as (stream, _peer), trio.fail_after(5):
        receive = stream_receiver(stream, 1000)
        errors: list[BaseException] = []

        async def read() -> None:
            try:
                await receive()
            except trio.ClosedResourceError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            await stream.aclose()
        assert len(errors) == 1
        with pytest.raises(trio.ClosedResourceError):
            await receive()


async def test_a_reset_connection_is_a_broken_resource() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        ours = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
    with ours, trio.fail_after(5):
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
        receive = stream_receiver(stream, 1000)
        # Closing with a zero linger time sends RST: the read fails with ECONNRESET.
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()
        with pytest.raises(trio.BrokenResourceError):
            await receive()


async def test_streams_other_than_plain_sockets_keep_receive_some() -> None:
    left, right = trio.testing.memory_stream_pair()
    with trio.fail_after(5):
        receive = stream_receiver(right, 1000)
        await left.send_all(b"hello")
        assert await receive() == b"hello"
