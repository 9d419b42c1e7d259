"""The trio client: one connection, its two socket tasks, and what the broker answers.

One connection multiplexes any number of subscriptions and publishes. Two
background tasks own the socket: the writer and the reader (the only task
that reads). ``publish`` (``publishing.py``) encodes the message, adds it to
the current run and returns without yielding unless the send buffer is full.
If the writer is idle with nothing in flight, that first message is written
at once by the publishing task (one non-blocking send, plain TCP only); the
writer sends whatever accumulated after it the next time the publishing task
yields, so a busy publisher batches naturally and an idle one adds no delay.
Call ``flush`` to wait until the broker has routed everything published.
The reader hands delivered runs to their ``Subscription``
(``subscription.py``); ``tcp.py`` opens TCP and TLS connections.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Final, Unpack

import trio

from broky.client.consumer import Consumer, open_consumer
from broky.client.consumer_options import ConsumerSettings, SubscriptionType, consumer_options
from broky.client.direct_send import nonblocking_writer
from broky.client.durable import PartitionInfo, Start, SubscriptionDeletion
from broky.client.errors import (
    BrokyError,
    ConnectionClosed,
    deadline,
    unwrapped,
)
from broky.client.receiving import Receiver
from broky.client.subscription import PendingSubscription, Subscription
from broky.protocol.codec import encode_frame
from broky.protocol.connection import ProtocolMachine, Role
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES, ErrorCode, SlowConsumerPolicy
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import (
    DeletedSubscription,
    DeleteSubscription,
    Error,
    Fetch,
    Fetched,
    Frame,
    Hello,
    ListPartitions,
    Partitions,
    Ping,
    Run,
    Subscribe,
)
from broky.protocol.keys import encode_key
from broky.protocol.message import Message, decode_run
from broky.socket_reads import stream_receiver

log = logging.getLogger("broky.client")

#: Default flow-control window per subscription, in messages: bounds the
#: client's memory per subscription (~20k x message size) while keeping
#: several write batches in flight.
DEFAULT_CREDIT: Final = 20_000
RECEIVE_BYTES: Final = 256 * 1024
CONNECT_TIMEOUT: Final = 5.0
#: Default seconds leaving a client waits for the broker to answer its
#: closing flush before the connection is given up (``Client.abort``): a
#: broker that stops answering with its socket open (SIGSTOPped, swapping,
#: its host gone without a reset) would otherwise hold the application's
#: exit for ever. A few times a loaded broker's round trip, like the 3 s
#: ``ClusterConsumer`` gives a node's ping (``NODE_TIMEOUT``).
CLOSE_TIMEOUT: Final = 3.0
#: Seconds closing the socket itself may take once the client has ended (a
#: TLS close_notify that a silent broker's full buffer cannot take).
_SOCKET_CLOSE_TIMEOUT: Final = 1.0


def check_close_timeout(close_timeout: float) -> None:
    """Raise ValueError unless ``close_timeout`` is seconds >= 0 (not NaN)."""
    if not close_timeout >= 0:
        raise ValueError(f"close_timeout must be seconds >= 0, not {close_timeout!r}")


class Client(Receiver):
    """A connection to a broker. Create it with :func:`connect` or ``Broker.connect``."""

    def __init__(self, stream: trio.abc.Stream, name: str = "", idempotent: bool = True) -> None:
        # streams: one label for publishes (so a stream Error can name it), then subscriptions
        self._streams = itertools.count(1)
        super().__init__(publish_stream=next(self._streams), idempotent=idempotent)
        self._stream = stream
        self.name = name
        self._machine = ProtocolMachine(Role.CLIENT, DEFAULT_MAX_FRAME_BYTES)
        self._nonces = itertools.count(1)
        self._send_now = nonblocking_writer(stream)
        self._hello = Hello(client_name=name)
        self._nursery: trio.Nursery | None = None
        #: Seconds leaving waits for the broker's answer (see CLOSE_TIMEOUT).
        self.close_timeout = CLOSE_TIMEOUT

    @classmethod
    @asynccontextmanager
    async def over(
        cls,
        stream: trio.abc.Stream,
        name: str = "",
        stamp_ts_broker: bool = False,
        *,
        user: str = "",
        password: str = "",
        token: str = "",
        peer: str = "the broker",
        idempotent: bool = True,
        reconnect: Callable[[], Awaitable[trio.abc.Stream]] | None = None,
        close_timeout: float = CLOSE_TIMEOUT,
    ) -> AsyncIterator[Client]:
        """Run a client over an already connected stream, with optional credentials.

        What escapes is the exception itself, never a group: a BrokyError
        (ConnectionClosed if ``peer`` sends no Welcome in CONNECT_TIMEOUT
        seconds, AuthenticationError if it refuses us), or whatever the
        caller's ``async with`` body raised, unchanged. ``idempotent`` acked
        publishing (the default) resends what failed retriably; with
        ``reconnect`` (a new stream to the same broker) it also resends what
        a lost connection left unanswered, over a new connection.

        Leaving the block flushes (``flush``: the broker has routed what was
        published), waiting at most ``close_timeout`` seconds (also the
        ``close_timeout`` attribute; 0: not at all) for the broker's answer,
        then gives the connection up (``abort``) and returns: a paused or
        wedged broker cannot hold the caller's exit. Closing the socket
        takes at most a second more. Acked frames still unanswered are not
        waited for (call ``flush_acks`` first to know their fate): leaving
        neither resends nor reports them, so each is stored once or not at
        all, as far as the broker got with it. Wrong values raise ValueError.
        """
        check_close_timeout(close_timeout)
        client = cls(stream, name, idempotent)
        client.close_timeout = close_timeout
        client._stamp = stamp_ts_broker
        client._hello = Hello(client_name=name, user=user, password=password, token=token)
        with unwrapped():
            async with trio.open_nursery() as nursery:
                client._nursery = nursery
                if reconnect is not None:
                    client._reopen = lambda: client._reconnect(reconnect, peer)
                try:
                    await client._start(stream, peer)
                    yield client
                    await client._leave(peer)
                finally:
                    client._reopen = None
                    client._shutdown(ConnectionClosed("the client was closed"))
                    with trio.CancelScope(shield=True), trio.move_on_after(_SOCKET_CLOSE_TIMEOUT):
                        await client._stream.aclose()
                    nursery.cancel_scope.cancel()

    async def _leave(self, peer: str) -> None:
        """The graceful end of ``over``: flush, waiting at most
        ``close_timeout`` for ``peer``'s answer, else abort."""
        if self.closed:
            return
        with trio.move_on_after(self.close_timeout) as waiting:
            await self.flush()
        if waiting.cancelled_caught:
            log.warning("%s did not answer the closing flush within %s s", peer, self.close_timeout)
            self.abort(f"{peer} did not answer the closing flush within {self.close_timeout} s")

    async def _start(self, stream: trio.abc.Stream, peer: str) -> None:
        """Run the socket tasks over ``stream`` and wait for the Welcome."""
        assert self._nursery is not None
        self._nursery.start_soon(self._writer, stream)
        self._nursery.start_soon(self._reader, stream)
        self._send_raw(self._machine.initiate())
        self._send_control(self._hello)
        with deadline(
            CONNECT_TIMEOUT,
            f"no Welcome from {peer} within {CONNECT_TIMEOUT} s: "
            "is a Broky broker listening there?",
        ):
            await self._welcome.wait()
        if self._error is not None:
            raise self._error

    async def _reconnect(
        self, connect: Callable[[], Awaitable[trio.abc.Stream]], peer: str
    ) -> None:
        """Replace a lost connection with a new one (acked publishing only:
        subscriptions, pings and requests of the old one have failed).

        What was queued for the old connection is dropped: acked frames are
        resent by the caller (``_settle_acks``), the rest was at most once.
        """
        old = self._stream
        stream = await connect()
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await old.aclose()
        self._wake_writer.set()  # the old writer sees it is stale and ends
        self._stream = stream
        self._machine = ProtocolMachine(Role.CLIENT, DEFAULT_MAX_FRAME_BYTES)
        self.server = None
        self.closed = False
        self._error = None
        self._frames = []
        self._buffered = 0
        self._writer_idle = True
        self._sending = False
        self._wake_writer = trio.Event()
        self._welcome = trio.Event()
        self._space = trio.Event()
        self._send_now = nonblocking_writer(stream)
        try:
            await self._start(stream, peer)
        except BrokyError:
            self._shutdown(ConnectionClosed(f"could not reconnect to {peer}"))
            raise

    async def _request(self, frame_for: Callable[[int], Frame]) -> Frame:
        """Send a request frame on a fresh stream id and wait for its answer."""
        if self.closed:
            raise self._error or ConnectionClosed("the client is closed")
        stream = next(self._streams)
        done = trio.Event()
        box: list[Frame] = []
        self._requests[stream] = (done, box)
        self._send_control(frame_for(stream))
        await done.wait()
        if not box:
            raise self._error or ConnectionClosed("the client is closed")
        answer = box[0]
        if isinstance(answer, Error):
            raise BrokyError(answer.code, answer.message)
        return answer

    async def partitions(self, topic: str = "") -> list[PartitionInfo]:
        """The partitions of durable topic ``topic`` ("" for all) and their offsets."""
        answer = await self._request(lambda stream: ListPartitions(stream, topic))
        assert isinstance(answer, Partitions)
        return [
            PartitionInfo(*entry)
            for entry in zip(
                answer.topics,
                answer.partitions,
                answer.start_offsets,
                answer.end_offsets,
                strict=True,
            )
        ]

    async def delete_subscription(
        self, name: str, pattern: str | None = None, *, force: bool = False
    ) -> SubscriptionDeletion:
        """Delete durable subscription ``name`` (with ``pattern``: only if it
        reads exactly that), on every worker; returns once it is durably gone.
        Refused (``BrokyError``, ``SubscriptionRefused``) while consumers are
        attached unless ``force`` (they end with ``SubscriptionDeleted``);
        ``UnknownSubscription`` if there is none. Consuming the name again
        creates a new subscription."""
        wire_pattern = b"" if pattern is None else encode_key(pattern, ErrorCode.INVALID_PATTERN)
        answer = await self._request(
            lambda stream: DeleteSubscription(stream, name, wire_pattern, force)
        )
        assert isinstance(answer, DeletedSubscription)
        return SubscriptionDeletion(answer.partitions, answer.consumers)

    async def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int = 0
    ) -> list[Message]:
        """Messages of a durable partition from ``offset`` (at most about
        ``max_bytes`` of stored batches, 0: the broker's default), each with
        its ``partition`` and ``offset``; empty at the end of the partition."""
        return [
            message
            for run in await self.fetch_runs(topic, partition, offset, max_bytes)
            for message in decode_run(run)
        ]

    async def fetch_runs(
        self, topic: str, partition: int, offset: int, max_bytes: int = 0
    ) -> tuple[Run, ...]:
        """``fetch`` without decoding: the stored runs, each with its
        ``partition`` and ``base_offset``, for readers that decode in bulk
        (the Spark connector builds Arrow columns straight from them)."""
        answer = await self._request(
            lambda stream: Fetch(stream, topic, partition, offset, max_bytes)
        )
        assert isinstance(answer, Fetched)
        return answer.runs

    async def flush(self) -> None:
        """Wait until the broker has received and routed everything published so far.

        Raises PublishRefused if the broker refused some of it since the last
        flush (a key this principal may not publish to, a message over the
        broker's max_message_bytes); the rest was routed and the client stays
        usable.
        """
        await self.ping()
        refused, self._refused = self._refused, None
        if refused is not None:
            raise refused

    async def ping(self) -> float:
        """Round trip to the broker, in seconds; doubles as a flush barrier."""
        if self.closed:
            raise self._error or ConnectionClosed("the client is closed")
        nonce = next(self._nonces)
        done = self._pings[nonce] = trio.Event()
        start = trio.current_time()
        self._send_control(Ping(nonce))
        await done.wait()
        if self._error is not None and self.closed:
            raise self._error
        return trio.current_time() - start

    def abort(self, reason: str) -> None:
        """Give the connection up at once: everything waiting on it (pings,
        requests, subscriptions, consumers, acks) fails with
        ConnectionClosed(``reason``), and leaving the ``async with`` sends
        nothing more. For a broker that stopped answering (paused, or its
        host gone without a reset), where a graceful close would wait on it.
        """
        self._shutdown(ConnectionClosed(reason))

    # --- subscribing ------------------------------------------------------------

    def subscribe(
        self,
        pattern: str,
        *,
        credit: int = DEFAULT_CREDIT,
        slow_consumer: SlowConsumerPolicy = SlowConsumerPolicy.DROP,
        start: Start | None = None,
        queue: str | None = None,
    ) -> PendingSubscription:
        """Subscribe; the subscription is active once the broker confirms it.

        ``async with client.subscribe("orders.>") as sub:`` unsubscribes when
        the block ends; ``sub = await client.subscribe(...)`` leaves that to
        ``sub.unsubscribe()``. Either waits for the broker's confirmation, and
        from then on every matching message the broker receives is delivered.
        ``credit`` is the flow-control window in messages (0: none, the broker
        sends as fast as TCP takes). ``start`` says where durable topics
        matching the pattern begin (``Start.earliest()``,
        ``Start.offset({0: 42})``, ``Start.time(ns)``, ``Start.last()``); the
        default is live only. ``queue`` joins that queue group on the
        pattern: each message goes to one member of the group (on any worker
        or node), at most once and live only; ephemeral topics only. A
        pattern or queue name with a control character, whitespace or a lone
        surrogate raises LocalProtocolError.
        """
        return PendingSubscription(self._subscribe(pattern, credit, slow_consumer, start, queue))

    #: The older name of ``subscribe``, kept for ``async with client.subscription(...)``.
    subscription = subscribe

    async def _subscribe(
        self,
        pattern: str,
        credit: int,
        slow_consumer: SlowConsumerPolicy,
        start: Start | None,
        queue: str | None = None,
    ) -> Subscription:
        if self.closed:
            raise self._error or ConnectionClosed("the client is closed")
        encoded = encode_key(pattern, ErrorCode.INVALID_PATTERN)
        queue_name = encode_key(queue, ErrorCode.INVALID_PATTERN) if queue else b""
        stream = next(self._streams)
        subscription = Subscription(self, stream, pattern, credit)
        self._subscriptions[stream] = subscription
        start = start or Start()
        self._send_control(
            Subscribe(
                stream,
                encoded,
                slow_consumer,
                credit,
                start.kind,
                start.time_ns,
                start.offsets,
                queue_name,
            )
        )
        await subscription._confirmed.wait()
        if subscription._error is not None:
            self._subscriptions.pop(stream, None)
            raise subscription._error
        return subscription

    def _forget(self, subscription: object) -> None:
        if isinstance(subscription, Subscription | Consumer):
            self._subscriptions.pop(subscription.stream, None)

    # --- durable subscriptions ----------------------------------------------------

    def consumer(
        self,
        pattern: str,
        *,
        subscription: str,
        type: SubscriptionType = "shared",
        **settings: Unpack[ConsumerSettings],
    ) -> AbstractAsyncContextManager[Consumer]:
        """Attach a consumer to durable subscription ``subscription`` of the
        durable topics matching ``pattern`` (created on first attach); see
        ``broky.client.consumer``. ``type``: ``"shared"``, ``"exclusive"``,
        ``"failover"`` or ``"key-shared"``; other options: ``ConsumerSettings``.
        Wrong options raise ValueError at once, a broker's refusal raises
        ConsumerRefused on entering the block. Leaving it sends the batched
        acks and waits (at most 5 s) for their receipts; what the consumer
        held unacked is redelivered.
        """
        return open_consumer(self, consumer_options(pattern, subscription, type, settings))

    def _next_stream(self) -> int:
        return next(self._streams)

    def _adopt(self, consumer: Consumer) -> None:
        self._subscriptions[consumer.stream] = consumer

    # --- the socket's two owners ------------------------------------------------

    async def _writer(self, stream: trio.abc.Stream) -> None:
        try:
            while True:
                if self._writer_idle:
                    await self._wake_writer.wait()
                    if self._stream is not stream:
                        return  # replaced by a new connection (_reconnect)
                    self._wake_writer = trio.Event()
                self._close_run()
                self._close_frame()
                data = b"".join(self._frames)
                self._frames = []
                self._writer_idle = True
                if data:
                    self._sending = True
                    await stream.send_all(data)
                    self._sending = False
                    self._buffered -= len(data)
                    self._update_run_limit()
                self._space.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            cause = exc.__cause__ or exc
            if self._stream is stream:
                self._shutdown(
                    ConnectionClosed(self._lost(f"connection lost while sending: {cause}"))
                )

    async def _reader(self, stream: trio.abc.Stream) -> None:
        machine = self._machine
        receive = stream_receiver(stream, RECEIVE_BYTES)
        try:
            while True:
                data = await receive()
                if not data:
                    self._shutdown(ConnectionClosed(self._lost("the broker closed the connection")))
                    return
                for frame in machine.receive_deliveries(data):
                    self._handle(frame)
        except RemoteProtocolError as exc:
            self._shutdown(BrokyError(exc.code, f"the broker broke the protocol: {exc}"))
            self._send_raw(encode_frame(Error(exc.code, str(exc))))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            if self._stream is stream:
                self._shutdown(
                    ConnectionClosed(self._lost(f"connection lost: {exc.__cause__ or exc}"))
                )

    def _lost(self, what: str) -> str:
        """``what`` went wrong, and, before the broker's Welcome, the likely why."""
        if self.server is not None:
            return what
        if isinstance(self._stream, trio.SSLStream):
            # With TLS 1.3 the broker checks the client certificate after the
            # client's handshake has finished: its refusal arrives here, as an
            # alert or an EOF on the first read.
            return (
                f"{what}: the broker rejected this client right after the TLS handshake. "
                "A broker with tls_client_ca set requires a client certificate signed by "
                "that CA (mTLS): connect with ssl_context=client_context(ca=..., cert=..., "
                "key=...), or from the command line with --tls-cert and --tls-key"
            )
        return f"{what} during the handshake (a TLS-only port? connect with ssl_context=...)"
