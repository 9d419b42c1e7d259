"""Shared fixtures: a broker on port 0 and a raw protocol socket.

Every test bounds itself with ``trio.fail_after``; these fixtures only start
and stop things.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling

from broky import Broker, Config
from broky.protocol.codec import encode_frame
from broky.protocol.connection import ProtocolMachine, Role
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES
from broky.protocol.frames import Error, Frame, Hello, Run, Welcome
from broky.protocol.framing import encode_preamble
from broky.protocol.message import encode_message, pack_sizes

StartBroker = Callable[[Config], Awaitable[Broker]]

#: Test directories whose files share one expensive session fixture and so
#: run in one pytest-xdist worker: tests/spark's SparkSession is a JVM that
#: takes 18-27 s to start, and spread over both workers a run started it
#: two or three times.
ONE_WORKER_DIRECTORIES = ("tests/spark/",)


class TogetherScheduling(LoadFileScheduling):  # type: ignore[misc]  # xdist is untyped
    """``--dist loadfile`` (the Makefile's), except that each directory of
    ``ONE_WORKER_DIRECTORIES`` is one unit of work instead of a unit per file."""

    def _split_scope(self, nodeid: str) -> str:
        for directory in ONE_WORKER_DIRECTORIES:
            if nodeid.startswith(directory):
                return directory
        return str(super()._split_scope(nodeid))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> object:
    """Schedules ``--dist loadfile`` runs with ``TogetherScheduling``."""
    if config.getoption("dist", None) != "loadfile":
        return None
    return TogetherScheduling(config, log)


async def eventually(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds; the caller bounds the wait with fail_after.

    For state that has no event to wait on (statistics snapshots).
    """
    while not condition():  # noqa: ASYNC110 - polling a snapshot, no event exists
        await trio.sleep(0.005)


@pytest.fixture
def start_broker(nursery: trio.Nursery) -> StartBroker:
    """Start a broker with the given config in the test's nursery; it stops with the test."""

    async def start(config: Config) -> Broker:
        broker = Broker(config)
        await nursery.start(broker.serve)
        return broker

    return start


@pytest.fixture
async def broker(start_broker: StartBroker) -> Broker:
    """A broker on 127.0.0.1, on a free port, with default limits."""
    return await start_broker(Config(port=0))


@pytest.fixture
def address(broker: Broker) -> str:
    """The "127.0.0.1:PORT" of the ``broker`` fixture."""
    return address_of(broker)


def address_of(broker: Broker) -> str:
    """A started broker's "HOST:PORT"."""
    assert broker.address is not None, "the broker does not listen"
    host, port = broker.address
    return f"{host}:{port}"


def raw_run(key: bytes, *payloads: bytes) -> Run:
    """A Publish run of plain messages on any ``key`` bytes, for raw frames
    carrying what the client library would refuse to send."""
    messages = [encode_message(payload) for payload in payloads]
    return Run(key, 0, len(messages), pack_sizes([len(m) for m in messages]), b"".join(messages))


class ConnectionEnded(Exception):
    """The broker closed (or reset) the raw connection."""


class RawConnection:
    """A client socket that speaks the protocol frame by frame, with no help.

    It reads with a client-side ProtocolMachine, so the broker's preamble and
    the handshake order are checked as any client would check them.
    """

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.machine = ProtocolMachine(Role.CLIENT, DEFAULT_MAX_FRAME_BYTES)
        self._frames: deque[Frame] = deque()

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send_frame(self, frame: Frame) -> None:
        await self.stream.send_all(encode_frame(frame))

    async def handshake(self, name: str = "raw") -> Welcome:
        """Send the preamble and Hello; return the broker's Welcome."""
        await self.send(encode_preamble() + encode_frame(Hello(client_name=name)))
        welcome = await self.receive_frame()
        assert isinstance(welcome, Welcome), welcome
        return welcome

    async def receive_frame(self) -> Frame:
        """The next frame; raises ConnectionEnded at EOF or on a reset."""
        while not self._frames:
            try:
                data = await self.stream.receive_some(256 * 1024)
            except trio.BrokenResourceError as exc:
                raise ConnectionEnded(f"reset: {exc}") from exc
            if not data:
                raise ConnectionEnded("EOF")
            self._frames.extend(self.machine.receive_data(data))
        return self._frames.popleft()

    async def receive_error(self) -> Error:
        """Skip other frames up to the next Error frame."""
        while True:
            frame = await self.receive_frame()
            if isinstance(frame, Error):
                return frame

    async def frames_until_closed(self) -> list[Frame]:
        """Every frame the broker sends until it closes the connection."""
        frames = []
        while True:
            try:
                frames.append(await self.receive_frame())
            except ConnectionEnded:
                return frames

    async def wait_closed(self) -> None:
        """Read and discard everything until the broker closes the socket."""
        while True:
            try:
                data = await self.stream.receive_some(256 * 1024)
            except trio.BrokenResourceError:
                return
            if not data:
                return


@asynccontextmanager
async def raw_connection(
    broker: Broker, *, receive_buffer: int | None = None
) -> AsyncIterator[RawConnection]:
    """Open a TCP connection to ``broker`` without sending anything.

    ``receive_buffer`` shrinks the socket's kernel receive buffer (SO_RCVBUF),
    so that a reader that stops reading stalls the broker's writes quickly.
    """
    assert broker.address is not None, "the broker does not listen"
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    await sock.connect(broker.address)
    stream = trio.SocketStream(sock)
    try:
        yield RawConnection(stream)
    finally:
        await stream.aclose()
