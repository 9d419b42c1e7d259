"""The trio client: batching publisher, credit-based subscriber iterators.

One connection multiplexes any number of subscriptions and publishes. Two
background tasks own the socket: the writer (the only task that writes) and
the reader (the only task that reads). ``publish`` encodes the message, adds
it to the current run and returns without yielding unless the send buffer is
full: the writer sends whatever accumulated the next time the publishing task
yields, so a busy publisher batches naturally and an idle one adds no delay.
Call ``flush`` to wait until the broker has routed everything published.
"""

from __future__ import annotations

import itertools
import logging
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Final

import attrs
import trio

from broky.client.durable import AckedRun, PartitionInfo, Start
from broky.client.errors import (
    AuthenticationError,
    BrokyError,
    ConnectionClosed,
    PublishRefused,
    SubscriptionError,
)
from broky.protocol.codec import encode_frame, encode_run_chunk, runs_frame_parts
from broky.protocol.connection import ProtocolMachine, Role
from broky.protocol.constants import (
    DEFAULT_MAX_FRAME_BYTES,
    MAX_KEY_BYTES,
    MIN_MAX_FRAME_BYTES,
    BodyType,
    ErrorCode,
    SlowConsumerPolicy,
)
from broky.protocol.errors import LocalProtocolError, RemoteProtocolError
from broky.protocol.frames import (
    Deliver,
    Error,
    Fetch,
    Fetched,
    Flow,
    Frame,
    Hello,
    ListPartitions,
    Notice,
    Partitions,
    Ping,
    Pong,
    PublishAck,
    Run,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Welcome,
)
from broky.protocol.keys import encode_key
from broky.protocol.message import Message, decode_run, encode_message, pack_sizes
from broky.security.tls import client_handshake

log = logging.getLogger("broky.client")

#: Bytes a client buffers for sending before ``publish`` waits: enough for
#: the writer to send large batches while the publisher keeps encoding.
DEFAULT_SEND_BUFFER_BYTES: Final = 1024 * 1024
#: Largest Publish frame the client builds (less if the broker's Welcome
#: announces a smaller maximum): big enough that per-frame costs vanish, small
#: enough that a frame never waits long for the next one to start.
PUBLISH_FRAME_BYTES: Final = 256 * 1024
#: Bytes a Publish frame adds around its run chunks: the header (56 bytes)
#: and 4 bytes per run, which is at most 1/16 of a run chunk (>= 64 bytes).
_FRAME_HEADER_BYTES: Final = 64
#: Bytes a run chunk adds around its messages besides the 4-byte size per
#: message (at most 1/14 of a message, which is >= 56 bytes): header,
#: padding and the key with its length and NUL.
_RUN_OVERHEAD_BYTES: Final = 80 + MAX_KEY_BYTES
#: Default flow-control window per subscription, in messages: bounds the
#: client's memory per subscription (~20k x message size) while keeping
#: several write batches in flight.
DEFAULT_CREDIT: Final = 20_000
RECEIVE_BYTES: Final = 256 * 1024
CONNECT_TIMEOUT: Final = 5.0


@attrs.frozen
class SubscriptionStatistics:
    """Counters of one client subscription."""

    received: int
    dropped_by_broker: int
    buffered_messages: int


class Subscription:
    """An open subscription; iterate it with ``async for``.

    Messages are decoded a run at a time, when the iterator reaches the run,
    and flow-control credit is returned to the broker as runs are consumed.
    """

    def __init__(self, client: Client, stream: int, pattern: str, credit: int) -> None:
        self._client = client
        self.stream = stream
        self.pattern = pattern
        self._credit = credit
        self._runs: deque[Run] = deque()
        self._buffered = 0
        self._batch: list[Message] = []
        self._position = 0
        self._ready = trio.Event()
        self._confirmed = trio.Event()
        self._error: BaseException | None = None
        self._closed = False
        self._ungranted = 0
        self.received = 0
        self.dropped_by_broker = 0

    # called by the client's reader task --------------------------------------

    def _deliver(self, runs: tuple[Run, ...]) -> None:
        self._runs.extend(runs)
        self._buffered += sum(run.count for run in runs)
        self._ready.set()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._confirmed.set()
        self._ready.set()

    # the consumer's side ------------------------------------------------------

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        position = self._position
        if position < len(self._batch):
            self._position = position + 1
            return self._batch[position]
        return await self._next_batch()

    async def _next_batch(self) -> Message:
        waited = False
        while not self._runs:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StopAsyncIteration
            self._ready = trio.Event()
            await self._ready.wait()
            waited = True
        if not waited:
            await trio.lowlevel.checkpoint()  # one checkpoint per run, not per message
        run = self._runs.popleft()
        self._buffered -= run.count
        self.received += run.count
        if self._credit:
            self._ungranted += run.count
            if self._ungranted * 2 >= self._credit:
                self._client._send_control(Flow(self.stream, self._ungranted))
                self._ungranted = 0
        try:
            self._batch = decode_run(run)
        except RemoteProtocolError as exc:
            log.warning("subscription %d: dropped an undecodable run: %s", self.stream, exc)
            self._batch = []
        if not self._batch:
            return await self._next_batch()
        self._position = 1
        return self._batch[0]

    def statistics(self) -> SubscriptionStatistics:
        """What this subscription received, lost and holds."""
        return SubscriptionStatistics(
            received=self.received,
            dropped_by_broker=self.dropped_by_broker,
            buffered_messages=self._buffered + len(self._batch) - self._position,
        )

    async def unsubscribe(self) -> None:
        """Stop the subscription; iteration ends after what is already buffered."""
        if not self._closed:
            self._closed = True
            self._ready.set()
            self._client._forget(self)
            if not self._client.closed:
                self._client._send_control(Unsubscribe(self.stream))
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.unsubscribe()


class Client:
    """A connection to a broker. Create it with :func:`connect` or ``Broker.connect``."""

    def __init__(self, stream: trio.abc.Stream, name: str = "") -> None:
        self._stream = stream
        self.name = name
        #: The broker's Welcome (its limits, who it authenticated us as).
        self.server: Welcome | None = None
        self._machine = ProtocolMachine(Role.CLIENT, DEFAULT_MAX_FRAME_BYTES)
        self._send_buffer_bytes = DEFAULT_SEND_BUFFER_BYTES
        # publish state: the open run, finished run chunks, finished frames
        self._run_key = b""
        self._run_key_text = ""
        self._run_sizes: list[int] = []
        self._run_messages: list[bytes] = []
        self._run_bytes = 0
        self._chunks: list[bytes] = []
        self._chunk_bytes = 0
        self._frames: list[bytes] = []
        #: Bytes in _chunks and _frames plus those being written (not the open run).
        self._buffered = 0
        self._set_frame_limit(DEFAULT_MAX_FRAME_BYTES)
        self._writer_idle = True
        self._wake_writer = trio.Event()
        self._space = trio.Event()
        self._stamp = False
        # acked publishing: frames are either all acked or not; acks come in order
        self._ack_mode = False
        self._chunk_keys: list[str] = []
        self._ack_sequence = 0
        self._ack_frames: dict[int, list[str]] = {}
        self._acked: list[AckedRun] = []
        self._acks_done = trio.Event()
        self._ack_error: BaseException | None = None
        # request/response streams (ListPartitions, Fetch)
        self._requests: dict[int, tuple[trio.Event, list[Frame]]] = {}
        # streams: one label for publishes (so a stream Error can name it), then subscriptions
        self._streams = itertools.count(1)
        self._publish_stream = next(self._streams)
        self._subscriptions: dict[int, Subscription] = {}
        self._pings: dict[int, trio.Event] = {}
        self._nonces = itertools.count(1)
        self._welcome = trio.Event()
        self.closed = False
        self._error: BaseException | None = None
        #: The first publish refusal since the last flush (flush raises it).
        self._refused: PublishRefused | None = None
        self.on_error: Callable[[Error], None] = self._log_error

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
    ) -> AsyncIterator[Client]:
        """Run a client over an already connected stream, with optional credentials."""
        client = cls(stream, name)
        client._stamp = stamp_ts_broker
        refused: BaseException | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._writer)
            nursery.start_soon(client._reader)
            client._send_raw(client._machine.initiate())
            client._send_control(Hello(client_name=name, user=user, password=password, token=token))
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    await client._welcome.wait()
                # A refused handshake is raised below, outside the nursery, so
                # that callers catch AuthenticationError itself, not a group.
                refused = client._error
                if refused is None:
                    yield client
                    if not client.closed:
                        await client.flush()
            finally:
                client._shutdown(ConnectionClosed("the client was closed"))
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await stream.aclose()
                nursery.cancel_scope.cancel()
        if refused is not None:
            raise refused

    # --- publishing ---------------------------------------------------------

    async def publish(
        self,
        key: str,
        payload: bytes,
        *,
        key_partition: bytes = b"",
        tags: Iterable[tuple[str, str]] = (),
        ts_producer: int = 0,
        uid: bytes = b"",
        ack: bool = False,
    ) -> None:
        """Queue one message; waits only when the send buffer is full.

        At-most-once: the message is on its way when this returns; ``flush``
        confirms the broker has routed it. With ``ack=True`` the message goes
        in an acked Publish frame: ``flush_acks`` then waits for the broker's
        acks (one per frame: batch-first) and returns the offsets durable
        topics gave. A key the broker would refuse for its characters (a
        control character, whitespace, a lone surrogate) raises
        LocalProtocolError here; its token structure is the broker's to judge.
        """
        if self.closed:
            raise self._error or ConnectionClosed("the client is closed")
        if ack is not self._ack_mode:
            self._close_run()
            self._close_frame()
            self._ack_mode = ack
        if key != self._run_key_text:
            encoded = encode_key(key, ErrorCode.INVALID_KEY)
            self._close_run()
            self._run_key_text = key
            self._run_key = encoded
        message = encode_message(payload, key_partition, ts_producer, uid, tags)
        size = len(message)
        if size > self._max_message_bytes:
            raise LocalProtocolError(self._too_large(size))
        self._run_messages.append(message)
        self._run_sizes.append(size)
        self._run_bytes += size
        if self._writer_idle:
            self._writer_idle = False
            self._wake_writer.set()
        if self._run_bytes >= self._run_limit:
            await self._run_full()

    def _set_frame_limit(self, max_frame_bytes: int) -> None:
        """Size runs and frames to fit frames of ``max_frame_bytes`` (the broker's)."""
        frame_limit = max(max_frame_bytes, MIN_MAX_FRAME_BYTES)
        self._chunk_budget = (
            (min(PUBLISH_FRAME_BYTES, frame_limit) - _FRAME_HEADER_BYTES) * 16 // 17
        )
        self._run_budget = (self._chunk_budget - _RUN_OVERHEAD_BYTES) * 14 // 15
        # A message bigger than a run's budget travels alone: one run, one frame.
        self._frame_message_bytes = frame_limit - _FRAME_HEADER_BYTES - _RUN_OVERHEAD_BYTES - 4
        server_limit = self.server.max_message_bytes if self.server is not None else 0
        self._max_message_bytes = min(self._frame_message_bytes, server_limit or frame_limit)
        self._update_run_limit()

    def _too_large(self, size: int) -> str:
        if size > self._frame_message_bytes:
            return (
                f"a message of {size} encoded bytes does not fit the broker's frames "
                f"(at most {self._frame_message_bytes} bytes)"
            )
        return (
            f"a message of {size} encoded bytes exceeds the broker's max_message_bytes "
            f"({self._max_message_bytes})"
        )

    def _update_run_limit(self) -> None:
        # The open run is closed at _run_budget, and publish waits once the
        # open run would push the send buffer past its size.
        self._run_limit = min(self._run_budget, self._send_buffer_bytes - self._buffered)

    async def _run_full(self) -> None:
        """The open run reached its size limit or filled the send buffer."""
        size = self._run_sizes[-1]
        if self._run_bytes > self._run_budget and len(self._run_sizes) > 1:
            # Close the run before the message that overflowed it, which starts the next.
            message = self._run_messages.pop()
            self._run_sizes.pop()
            self._run_bytes -= size
            self._close_run()
            self._run_messages.append(message)
            self._run_sizes.append(size)
            self._run_bytes = size
        if self._run_bytes >= self._run_budget:
            self._close_run()
        while self._buffered + self._run_bytes >= self._send_buffer_bytes and not self.closed:
            self._space = trio.Event()
            await self._space.wait()
        if self.closed:
            raise self._error or ConnectionClosed("the client is closed")
        self._update_run_limit()

    def _close_run(self) -> None:
        if self._run_messages:
            chunk = encode_run_chunk(
                self._run_key, 0, pack_sizes(self._run_sizes), b"".join(self._run_messages)
            )
            self._run_sizes = []
            self._run_messages = []
            self._run_bytes = 0
            if self._chunk_bytes + len(chunk) > self._chunk_budget:
                self._close_frame()
            if self._ack_mode:
                self._chunk_keys.append(self._run_key_text)
            self._chunks.append(chunk)
            self._chunk_bytes += len(chunk)
            self._buffered += len(chunk)
        self._update_run_limit()

    def _close_frame(self) -> None:
        if self._chunks:
            parts = runs_frame_parts(
                BodyType.PUBLISH, self._publish_stream, self._chunks, self._stamp, self._ack_mode
            )
            if self._ack_mode:
                self._ack_sequence += 1
                self._ack_frames[self._ack_sequence] = self._chunk_keys
                self._chunk_keys = []
            self._buffered += sum(len(part) for part in parts) - self._chunk_bytes
            self._frames.extend(parts)
            self._chunks = []
            self._chunk_bytes = 0

    async def flush_acks(self) -> list[AckedRun]:
        """Send what ``publish(..., ack=True)`` queued and wait for every ack.

        Returns the offsets of everything acked since the last call, in
        publish order per partition (ephemeral keys get no entry). An ack
        means the message reached its topic's durability point (fsync
        ``always``: on disk). Raises BrokyError if the broker could not store
        some of it; what was acked before stays acked.
        """
        self._close_run()
        self._close_frame()
        if self._writer_idle:
            self._writer_idle = False
            self._wake_writer.set()
        while self._ack_frames and not self.closed:
            self._acks_done = trio.Event()
            await self._acks_done.wait()
        error, self._ack_error = self._ack_error, None
        if error is None and self._ack_frames:
            error = self._error or ConnectionClosed("the client is closed")
        if error is not None:
            raise error
        acked, self._acked = self._acked, []
        return acked

    def _handle_ack(self, frame: PublishAck) -> None:
        keys = self._ack_frames.pop(frame.sequence, [])
        for run, partition, first, last in zip(
            frame.runs, frame.partitions, frame.first_offsets, frame.last_offsets, strict=True
        ):
            key = keys[run] if run < len(keys) else ""  # a broker bug must not kill the reader
            self._acked.append(AckedRun(key, partition, first, last))
        self._acks_done.set()

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

    # --- subscribing ------------------------------------------------------------

    async def subscribe(
        self,
        pattern: str,
        *,
        credit: int = DEFAULT_CREDIT,
        slow_consumer: SlowConsumerPolicy = SlowConsumerPolicy.DROP,
        start: Start | None = None,
    ) -> Subscription:
        """Subscribe and wait for the broker's confirmation.

        Once this returns, every matching message the broker receives is
        delivered. Use as ``async with await client.subscribe(...)`` or
        ``async with client.subscription(...)``. ``credit`` is the flow-control
        window in messages (0: none, the broker sends as fast as TCP takes).
        ``start`` says where durable topics matching the pattern begin
        (``Start.earliest()``, ``Start.offset({0: 42})``, ``Start.time(ns)``,
        ``Start.last()``); the default is live only. A pattern with a control
        character, whitespace or a lone surrogate raises LocalProtocolError.
        """
        if self.closed:
            raise self._error or ConnectionClosed("the client is closed")
        encoded = encode_key(pattern, ErrorCode.INVALID_PATTERN)
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
            )
        )
        await subscription._confirmed.wait()
        if subscription._error is not None:
            self._subscriptions.pop(stream, None)
            raise subscription._error
        return subscription

    @asynccontextmanager
    async def subscription(
        self,
        pattern: str,
        *,
        credit: int = DEFAULT_CREDIT,
        slow_consumer: SlowConsumerPolicy = SlowConsumerPolicy.DROP,
        start: Start | None = None,
    ) -> AsyncIterator[Subscription]:
        """``async with client.subscription("orders.>") as sub: async for msg in sub``."""
        subscription = await self.subscribe(
            pattern, credit=credit, slow_consumer=slow_consumer, start=start
        )
        try:
            yield subscription
        finally:
            await subscription.unsubscribe()

    def _forget(self, subscription: Subscription) -> None:
        self._subscriptions.pop(subscription.stream, None)

    # --- the socket's two owners ------------------------------------------------

    def _send_raw(self, data: bytes) -> None:
        self._close_run()
        self._close_frame()
        self._frames.append(data)
        self._buffered += len(data)
        if self._writer_idle:
            self._writer_idle = False
            self._wake_writer.set()

    def _send_control(self, frame: Frame) -> None:
        self._send_raw(encode_frame(frame))

    async def _writer(self) -> None:
        stream = self._stream
        try:
            while True:
                if self._writer_idle:
                    await self._wake_writer.wait()
                    self._wake_writer = trio.Event()
                self._close_run()
                self._close_frame()
                data = b"".join(self._frames)
                self._frames = []
                self._writer_idle = True
                if data:
                    await stream.send_all(data)
                    self._buffered -= len(data)
                    self._update_run_limit()
                self._space.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            cause = exc.__cause__ or exc
            self._shutdown(ConnectionClosed(self._lost(f"connection lost while sending: {cause}")))

    async def _reader(self) -> None:
        stream = self._stream
        machine = self._machine
        try:
            while True:
                data = await stream.receive_some(RECEIVE_BYTES)
                if not data:
                    self._shutdown(ConnectionClosed(self._lost("the broker closed the connection")))
                    return
                for frame in machine.receive_data(data):
                    self._handle(frame)
        except RemoteProtocolError as exc:
            self._shutdown(BrokyError(exc.code, f"the broker broke the protocol: {exc}"))
            self._send_raw(encode_frame(Error(exc.code, str(exc))))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._shutdown(ConnectionClosed(self._lost(f"connection lost: {exc.__cause__ or exc}")))

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

    def _handle(self, frame: Frame) -> None:
        if type(frame) is Deliver:
            subscription = self._subscriptions.get(frame.stream)
            if subscription is not None:
                subscription._deliver(frame.runs)
        elif type(frame) is Subscribed:
            subscription = self._subscriptions.get(frame.stream)
            if subscription is not None:
                subscription._confirmed.set()
        elif type(frame) is Pong:
            event = self._pings.pop(frame.nonce, None)
            if event is not None:
                event.set()
        elif type(frame) is Ping:
            self._send_control(Pong(frame.nonce))
        elif type(frame) is Notice:
            subscription = self._subscriptions.get(frame.stream)
            if subscription is not None:
                subscription.dropped_by_broker += frame.count
            log.warning("stream %d: the broker dropped %d messages", frame.stream, frame.count)
        elif type(frame) is PublishAck:
            self._handle_ack(frame)
        elif type(frame) is Fetched or type(frame) is Partitions:
            self._answer(frame.stream, frame)
        elif type(frame) is Error:
            self._handle_error(frame)
        elif type(frame) is Welcome:
            self.server = frame
            self._set_frame_limit(frame.max_frame_bytes or DEFAULT_MAX_FRAME_BYTES)
            self._welcome.set()

    def _handle_error(self, frame: Error) -> None:
        if frame.stream == 0:
            if frame.code is ErrorCode.AUTHENTICATION_FAILED:
                if self.server is not None:
                    # Welcomed earlier: the broker revoked these credentials
                    # since (a configuration reload), the login itself was fine.
                    message = f"the broker closed the connection: {frame.message}"
                else:
                    message = (
                        f"the broker refused the connection: {frame.message} (pass user= and "
                        "password=, or token=, to broky.connect, or a client certificate the "
                        "broker maps to a user; --user/--password/--token on the command line)"
                    )
                self._shutdown(AuthenticationError(frame.code, message))
                return
            self._shutdown(
                BrokyError(frame.code, f"the broker closed the connection: {frame.message}")
            )
            return
        subscription = self._subscriptions.get(frame.stream)
        if subscription is not None:
            self._subscriptions.pop(frame.stream, None)
            subscription._fail(SubscriptionError(frame.code, frame.message))
        elif frame.stream in self._requests:
            self._answer(frame.stream, frame)
        elif frame.stream == self._publish_stream and (
            frame.code is ErrorCode.STORAGE_FAILURE
            or (frame.code in _REFUSALS and self._ack_frames)
        ):
            # The broker answers a failed or refused acked frame with an error in its place.
            if self._ack_frames:
                del self._ack_frames[min(self._ack_frames)]
            self._ack_error = BrokyError(frame.code, frame.message)
            self._acks_done.set()
        elif frame.stream == self._publish_stream and frame.code in _REFUSALS:
            log.warning("the broker refused published messages: %s", frame.message)
            self._refused = self._refused or PublishRefused(frame.code, frame.message)
        else:
            self.on_error(frame)

    def _answer(self, stream: int, frame: Frame) -> None:
        request = self._requests.pop(stream, None)
        if request is not None:
            request[1].append(frame)
            request[0].set()

    @staticmethod
    def _log_error(frame: Error) -> None:
        log.warning(
            "broker error on stream %d: %s: %s", frame.stream, frame.code.name, frame.message
        )

    def _shutdown(self, error: BaseException) -> None:
        if self.closed:
            return
        self.closed = True
        self._error = error
        for subscription in list(self._subscriptions.values()):
            subscription._fail(error)
        for event in self._pings.values():
            event.set()
        for done, _ in self._requests.values():
            done.set()
        self._acks_done.set()
        self._welcome.set()
        self._space.set()


#: Publish-stream errors about messages this client may not send.
_REFUSALS: Final = (ErrorCode.PERMISSION_DENIED, ErrorCode.LIMIT_EXCEEDED)


def parse_address(address: str) -> tuple[str, int]:
    """Split "HOST:PORT" (IPv6 as "[::1]:PORT")."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address must be HOST:PORT, got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


@asynccontextmanager
async def connect(
    address: str,
    *,
    name: str = "",
    stamp_ts_broker: bool = False,
    ssl_context: ssl.SSLContext | None = None,
    user: str = "",
    password: str = "",
    token: str = "",
) -> AsyncIterator[Client]:
    """Connect to a broker over TCP: ``async with broky.connect("127.0.0.1:7722") as client``.

    With ``ssl_context`` (see ``broky.security.tls.client_context``) the
    connection speaks TLS, checking the broker's certificate against ``host``;
    a failed TLS handshake raises ConnectionClosed saying why. ``user`` and
    ``password``, or ``token``, authenticate (send them over TLS only); wrong
    or missing credentials raise AuthenticationError.
    """
    host, port = parse_address(address)
    with trio.fail_after(CONNECT_TIMEOUT):
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        if ssl_context is not None:
            stream = await _tls_handshake(stream, ssl_context, host, address)
    async with Client.over(
        stream,
        name=name,
        stamp_ts_broker=stamp_ts_broker,
        user=user,
        password=password,
        token=token,
    ) as client:
        yield client


async def _tls_handshake(
    stream: trio.abc.Stream, context: ssl.SSLContext, host: str, address: str
) -> trio.SSLStream[trio.abc.Stream]:
    try:
        return await client_handshake(stream, context, host)
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise ConnectionClosed(
            f"TLS handshake with {address} failed ({exc.__cause__ or exc}): is that the "
            "broker's TLS port, and does it trust this client's certificate?"
        ) from exc
