"""Live-server fuzz: random and mutated bytes on fresh connections to a real broker.

Each input goes on its own TCP connection, sent whole or split into small
sends. The invariant, per connection: what the broker sends back parses as
broker-to-client frames; if the decoder would reject the input the broker
closes the connection within a second, after at most one connection Error
(stream 0) as its last frame; otherwise the connection may stay open and we
close it. After every batch a healthy client still completes a pub/sub round
trip: bad input never stops the broker serving others.
"""

from __future__ import annotations

import random
import socket

import trio

import broky
from broky import Broker
from broky.protocol.connection import ProtocolMachine, Role
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Error, Frame
from tests.conftest import address_of
from tests.fuzz.invariant import HANDSHAKE, make_input, outcome, split

BATCHES = 12
PER_BATCH = 50
#: How long the broker has to close a connection whose input it must reject.
CLOSE_WITHIN = 1.0


def _live_input(rng: random.Random) -> tuple[bytes, bool]:
    """An input and whether the broker must reject it (close the connection)."""
    kind = rng.random()
    if kind < 0.7:
        tail = make_input(rng)
        return HANDSHAKE + tail, outcome([tail]) is None
    if kind < 0.85:
        # A damaged preamble or Hello, then maybe more.
        head = bytearray(HANDSHAKE)
        for _ in range(rng.randint(1, 3)):
            head[rng.randrange(len(head))] ^= 1 << rng.randrange(8)
        data = bytes(head) + (make_input(rng) if rng.random() < 0.5 else b"")
        return data, _rejected_from_the_start(data)
    data = rng.randbytes(rng.randint(1, 64))
    return data, _rejected_from_the_start(data)


def _rejected_from_the_start(data: bytes) -> bool:
    machine = ProtocolMachine(Role.SERVER, DEFAULT_MAX_FRAME_BYTES)
    try:
        machine.receive_data(data)
    except RemoteProtocolError:
        return True
    return False


async def _send_and_watch(broker: Broker, data: bytes, must_close: bool, rng_seed: int) -> None:
    rng = random.Random(rng_seed)
    assert broker.address is not None
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    await sock.connect(broker.address)
    stream = trio.SocketStream(sock)
    received = bytearray()
    closed = False
    async with stream:
        try:
            pieces = [data] if rng.random() < 0.5 else split(rng, data)
            for piece in pieces:
                await stream.send_all(piece)
                await trio.sleep(0.001)  # separate segments, not one coalesced send
        except trio.BrokenResourceError:
            pass  # the broker closed first: its reply is still readable or lost to a reset
        with trio.move_on_after(CLOSE_WITHIN):
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    closed = True
                    break
                if not chunk:
                    closed = True
                    break
                received += chunk
    if must_close:
        assert closed, f"the broker kept a connection open after rejectable input {data!r}"
    frames = _broker_frames(bytes(received), data)
    if closed:
        errors = [frame for frame in frames if isinstance(frame, Error) and frame.stream == 0]
        assert len(errors) <= 1, frames
        if errors:
            assert frames[-1] is errors[0], frames


def _broker_frames(received: bytes, sent: bytes) -> list[Frame]:
    """The broker's reply as frames; it must parse when our preamble was valid."""
    if not sent.startswith(HANDSHAKE[:8]):
        return []  # a foreign preamble may get a plain-text hint instead of frames
    machine = ProtocolMachine(Role.CLIENT, DEFAULT_MAX_FRAME_BYTES)
    return machine.receive_data(received)


async def _round_trip(address: str, batch: int) -> None:
    async with broky.connect(address) as client, client.subscription("fuzz.alive") as sub:
        await client.publish("fuzz.alive", str(batch).encode())
        async for message in sub:
            assert message.payload == str(batch).encode()
            break


async def test_broker_survives_fuzzed_connections(broker: Broker) -> None:
    seed = random.randrange(2**32)
    print(f"live fuzz seed {seed}")
    rng = random.Random(seed)
    address = address_of(broker)
    sent = rejected = 0
    with trio.fail_after(60):
        for batch in range(BATCHES):
            async with trio.open_nursery() as nursery:
                for _ in range(PER_BATCH):
                    data, must_close = _live_input(rng)
                    rejected += must_close
                    nursery.start_soon(
                        _send_and_watch, broker, data, must_close, rng.getrandbits(32)
                    )
                    sent += 1
            with trio.fail_after(2):
                await _round_trip(address, batch)
    print(f"live fuzz: {sent} inputs, {rejected} rejectable")
    assert sent == BATCHES * PER_BATCH
    assert rejected > sent // 4
