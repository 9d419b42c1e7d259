"""NATS JetStream driven like Broky's durable benchmarks drive Broky.

The comparison the durable rows need (issue 12's acked publishes, issue
13's consume-and-ack): a ``nats-server -js`` process with a file-backed
stream on ``bench.>``, loaded and consumed over the raw protocol
(``natsproto``) so that the client is never the bottleneck:

- ``publish_rate``: publishers on their own connections pipeline windows of
  ``PUB bench.<key> <inbox>`` and wait for every window's acks, as
  ``benchmarks.bench_durable`` waits for ``flush_acks``; a message counts
  once its ack (``{"stream":..,"seq":..}``) arrived, an error ack is lost.
- ``consume_rate``: consumers of one durable pull consumer (explicit acks;
  JetStream's counterpart of a shared subscription) keep pull requests
  outstanding, ack every message (``+ACK`` to its reply subject, a batch
  per read) and end once the consumer's ack floor reached the last message
  (``CONSUMER.INFO``): acked *and* taken into account by the server, as the
  Broky side ends with the broker's receipts.

nats-server 2.9 (Debian's) has no ``sync_interval``/``always`` setting: its
file store does not fsync per ack (it writes to the page cache and syncs
later), so the fair Broky column is ``fsync = "interval"``; the benchmark
reports ``always`` too.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from typing import Final

import trio

from broky.loadtest.natsproto import CONNECT, Err, Info, Msg, NatsParser, Ping, Pong, pub, sub

STREAM: Final = "bench"
CONSUMER: Final = "work"
#: Messages a pull request asks for; a new one goes out when half arrived.
PULL_BATCH: Final = 2000


class NatsError(Exception):
    """A JetStream API call or the connection failed."""


class NatsConnection:
    """One client connection: send bytes, receive events (PINGs answered)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._parser = NatsParser()
        self._next_sid = 1
        self._send_lock = trio.Lock()

    @classmethod
    async def open(cls, address: tuple[str, int]) -> NatsConnection:
        connection = cls(await trio.open_tcp_stream(*address))
        await connection.send(CONNECT)
        while True:
            events = await connection.receive()
            if any(isinstance(event, Pong) for event in events):
                return connection

    def new_sid(self) -> int:
        sid = self._next_sid
        self._next_sid += 1
        return sid

    async def send(self, data: bytes) -> None:
        async with self._send_lock:
            await self._stream.send_all(data)

    async def receive(self) -> list[Msg | Info | Pong]:
        """The next events (at least one unless the connection closed)."""
        while True:
            data = await self._stream.receive_some(1 << 20)
            if not data:
                raise NatsError("the server closed the connection")
            kept: list[Msg | Info | Pong] = []
            for event in self._parser.feed(data):
                if isinstance(event, Ping):
                    with trio.CancelScope(shield=True):  # a cut write would garble the stream
                        await self.send(b"PONG\r\n")
                elif isinstance(event, Err):
                    raise NatsError(f"server error: {event.text}")
                elif isinstance(event, Msg | Info | Pong):
                    kept.append(event)
            if kept:
                return kept

    async def request(
        self, subject: str, body: dict[str, object] | None = None
    ) -> dict[str, object]:
        """A JetStream API call: one request, its JSON answer (errors raise)."""
        inbox = b"_INBOX.api.%d" % self.new_sid()
        sid = self.new_sid()
        payload = json.dumps(body).encode() if body is not None else b""
        await self.send(sub(inbox, sid) + pub(subject.encode(), payload, inbox))
        with trio.fail_after(10):
            while True:
                for event in await self.receive():
                    if isinstance(event, Msg) and event.subject == inbox:
                        await self.send(b"UNSUB %d\r\n" % sid)
                        answer: dict[str, object] = json.loads(event.payload)
                        if "error" in answer:
                            raise NatsError(f"{subject}: {answer['error']}")
                        return answer

    async def aclose(self) -> None:
        await self._stream.aclose()


async def recreate_stream(
    address: tuple[str, int], *, replicas: int = 1, subjects: str = "bench.>"
) -> None:
    """A fresh file-backed stream on ``subjects`` (the old one deleted),
    with ``replicas`` copies (more than one needs a cluster:
    ``broky.loadtest.jetstream_cluster``)."""
    connection = await NatsConnection.open(address)
    try:
        with contextlib.suppress(NatsError):  # there was none
            await connection.request(f"$JS.API.STREAM.DELETE.{STREAM}")
        await connection.request(
            f"$JS.API.STREAM.CREATE.{STREAM}",
            {
                "name": STREAM,
                "subjects": [subjects],
                "storage": "file",
                "num_replicas": replicas,
            },
        )
    finally:
        await connection.aclose()


async def _publisher(
    address: tuple[str, int],
    index: int,
    subjects: list[bytes],
    payload: bytes,
    deadline: float,
    limit: int,
    counts: list[int],
) -> None:
    """Windows of pipelined publishes (``subjects``, in turn), each waited
    for, until ``deadline`` or, with a ``limit``, until that many were
    published; ``counts`` gets [published, acked] added."""
    connection = await NatsConnection.open(address)
    inbox = b"_INBOX.pub.%d" % index
    await connection.send(sub(inbox, connection.new_sid()))
    full = b"".join(pub(subject, payload, inbox) for subject in subjects)
    try:
        while (counts[0] < limit) if limit else (time.monotonic() < deadline):
            size = min(len(subjects), limit - counts[0]) if limit else len(subjects)
            window = (
                full
                if size == len(subjects)
                else b"".join(pub(subject, payload, inbox) for subject in subjects[:size])
            )
            acked = answered = 0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(connection.send, window)
                while answered < size:
                    for event in await connection.receive():
                        if isinstance(event, Msg) and event.subject == inbox:
                            answered += 1
                            acked += b'"error"' not in event.payload
            counts[0] += size
            counts[1] += acked
    finally:
        await connection.aclose()


async def publish(
    address: tuple[str, int],
    publishers: int,
    subjects_of: Callable[[int], list[bytes]],
    payload: bytes,
    *,
    duration: float = 0.0,
    messages: int = 0,
    spread: Sequence[tuple[str, int]] = (),
) -> tuple[int, int, float]:
    """``publishers`` connections publishing for ``duration`` seconds or,
    with ``messages``, exactly that many in all; returns (published, acked,
    seconds). With ``spread`` (a cluster's servers), publisher ``i``
    connects to ``spread[i % len(spread)]`` instead of ``address``."""
    counts = [[0, 0] for _ in range(publishers)]
    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        for index in range(publishers):
            limit = messages // publishers + (index < messages % publishers) if messages else 0
            if messages and not limit:
                continue
            nursery.start_soon(
                _publisher,
                spread[index % len(spread)] if spread else address,
                index,
                subjects_of(index),
                payload,
                start + duration,
                limit,
                counts[index],
            )
    elapsed = time.monotonic() - start
    return sum(c[0] for c in counts), sum(c[1] for c in counts), elapsed


async def _consumer(
    address: tuple[str, int], index: int, seen: list[int], done: trio.Event
) -> None:
    """Pull, ack every message, pull again at half a batch; until ``done``."""
    connection = await NatsConnection.open(address)
    inbox = b"_INBOX.pull.%d" % index
    sid = connection.new_sid()
    await connection.send(sub(inbox, sid))
    # Pulled messages keep their own subject: they are told apart by the sid.
    sid_bytes = b"%d" % sid
    next_request = pub(
        f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{CONSUMER}".encode(),
        json.dumps({"batch": PULL_BATCH, "expires": 1_000_000_000}).encode(),
        inbox,
    )
    await connection.send(next_request + next_request)
    outstanding = 2 * PULL_BATCH
    try:
        with trio.move_on_at(trio.current_time() + 120) as scope:
            while not done.is_set():
                events: list[Msg | Info | Pong] = []
                with trio.move_on_after(0.2):  # look at ``done`` now and then
                    events = await connection.receive()
                acks: list[bytes] = []
                for event in events:
                    if not isinstance(event, Msg) or event.sid != sid_bytes:
                        continue
                    if event.headers:  # a status: 404 no messages, 408 expired
                        outstanding = max(outstanding - PULL_BATCH, 0)
                        continue
                    outstanding -= 1
                    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
                    seen.append(int(event.reply.split(b".")[5]))
                    acks.append(pub(event.reply, b""))
                if outstanding < PULL_BATCH:
                    acks.append(next_request)
                    outstanding += PULL_BATCH
                if acks:  # never under a timeout: a cut write would garble the stream
                    await connection.send(b"".join(acks))
        if scope.cancelled_caught:
            raise NatsError("consumer gave up after 120 s")
    finally:
        await connection.aclose()


async def consume(
    address: tuple[str, int], consumers: int, expected: int
) -> tuple[list[int], float]:
    """A durable pull consumer with explicit acks read by ``consumers``
    connections until its ack floor reaches ``expected`` messages; returns
    the stream sequences delivered and the seconds it took."""
    api = await NatsConnection.open(address)
    await api.request(
        f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.{CONSUMER}",
        {
            "stream_name": STREAM,
            "config": {
                "durable_name": CONSUMER,
                "ack_policy": "explicit",
                "deliver_policy": "all",
                "max_ack_pending": 20_000 * consumers,
                "max_waiting": 512,
            },
        },
    )
    seen: list[int] = []
    done = trio.Event()
    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        for index in range(consumers):
            nursery.start_soon(_consumer, address, index, seen, done)
        with trio.move_on_after(120):
            while True:
                if len(seen) >= expected:
                    info = await api.request(f"$JS.API.CONSUMER.INFO.{STREAM}.{CONSUMER}")
                    floor = info.get("ack_floor")
                    if isinstance(floor, dict) and floor.get("stream_seq", 0) >= expected:
                        break
                await trio.sleep(0.005)
        done.set()
    elapsed = time.monotonic() - start
    await api.aclose()
    return seen, elapsed
