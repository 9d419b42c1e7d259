"""The client's outgoing side: the batching publisher and the send queue.

``publish`` encodes the message, adds it to the open run (consecutive
messages with one key) and returns without yielding unless the send buffer is
full. Runs close into run chunks, chunks into Publish frames, and control
frames queue behind them (``_send_raw``) so that the order on the wire is the
order of the calls. When the writer task is idle, the first message or frame
queued is written at once by the calling task (``_kick``); the rest, until the
writer has run, accumulates and the writer sends it the next time the
publishing task yields.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Final

import trio

from broky.client.acked import MAX_UNACKED_MESSAGES, AckedFrames, BatchAnswers, SentFrame
from broky.client.acked_runs import AckedRuns
from broky.client.errors import BrokyError, ConnectionClosed
from broky.protocol.chunks import encode_run_chunk_from
from broky.protocol.codec import encode_frame, runs_frame_parts
from broky.protocol.constants import (
    DEFAULT_MAX_FRAME_BYTES,
    MAX_KEY_BYTES,
    MIN_MAX_FRAME_BYTES,
    BodyType,
    ErrorCode,
)
from broky.protocol.errors import LocalProtocolError
from broky.protocol.frames import Frame, PublishAck
from broky.protocol.keys import encode_key
from broky.protocol.message import encode_message
from broky.protocol.producer_frames import producer_frame_parts

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
#: Seconds ``flush_acks`` keeps resending idempotent frames that failed
#: retriably (or whose connection was lost) before it gives up: several
#: restarts of a worker (about a second each) or of a whole broker.
DEFAULT_RETRY_TIMEOUT: Final = 30.0
#: Seconds ``flush_acks`` waits for the answer to an acked frame on an open
#: connection before raising AckTimeout (Kafka's ``request.timeout.ms``,
#: 30 s): well past a group commit's fsync and the broker's own 10 s stall
#: bound for a forwarding worker's owner, so only an owner that is stuck
#: (a hung disk, a stopped process, a broker bug) runs into it.
DEFAULT_ACK_TIMEOUT: Final = 30.0
#: Pauses between resends, doubling: a restarted worker serves again within
#: about a second, so the pause stays short.
_RETRY_PAUSE: Final = 0.02
_MAX_RETRY_PAUSE: Final = 0.5
#: Keys whose checked wire bytes a publisher remembers: one message per key
#: over a working set of keys (device ids, order ids) checks each key once,
#: not once per message.
KEY_CACHE_SIZE: Final = 4096


class Publisher:
    """The publishing half of ``Client`` (its base class): the open run,
    finished run chunks and frames waiting for the writer, and acked
    publishing. The connection (``Client``) owns ``closed`` and ``_error``
    and sets them when it ends."""

    closed: bool
    _error: BaseException | None

    def __init__(self, publish_stream: int, idempotent: bool = True) -> None:
        #: The stream id Publish frames carry, so that a stream Error can name them.
        self._publish_stream = publish_stream
        self._send_buffer_bytes = DEFAULT_SEND_BUFFER_BYTES
        # publish state: the open run, finished run chunks, finished frames
        self._run_key = b""
        self._run_key_text = ""
        #: Key text -> its checked wire bytes (KEY_CACHE_SIZE at most).
        self._keys: dict[str, bytes] = {}
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
        #: The writer task is inside ``send_all``: nobody else may write.
        self._sending = False
        #: Writes without blocking and returns how many bytes it wrote (0
        #: when it would block or failed: the writer reports failures); None
        #: when the stream allows no such write (TLS).
        self._send_now: Callable[[bytes], int] | None = None
        self._space = trio.Event()
        self._stamp = False
        # acked publishing: frames are either all acked or not; acks come in order
        self._ack_mode = False
        self._chunk_keys: list[str] = []
        self._chunk_messages = 0
        #: The acked frames in flight, their answers and what to resend.
        self._acks = AckedFrames(idempotent)
        self._acks_done = trio.Event()
        #: Seconds ``flush_acks`` retries idempotent frames (see DEFAULT_RETRY_TIMEOUT).
        self.retry_timeout = DEFAULT_RETRY_TIMEOUT
        #: Seconds an acked frame may go unanswered (see DEFAULT_ACK_TIMEOUT).
        self.ack_timeout = DEFAULT_ACK_TIMEOUT
        #: Opens a new connection after a lost one (set by ``broky.connect``;
        #: None: a lost connection ends acked publishing with ConnectionClosed).
        self._reopen: Callable[[], Awaitable[None]] | None = None

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
        if self.closed and not (ack and self._acks.producer_id and self._reopen is not None):
            raise self._error or ConnectionClosed("the client is closed")
        if ack is not self._ack_mode:
            self._close_run()
            self._close_frame()
            self._ack_mode = ack
        if key != self._run_key_text:
            encoded = self._keys.get(key)
            if encoded is None:
                encoded = encode_key(key, ErrorCode.INVALID_KEY)
                if len(self._keys) >= KEY_CACHE_SIZE:
                    self._keys.clear()  # a publisher of ever new keys: start over
                self._keys[key] = encoded
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
        self._kick()
        if self._run_bytes >= self._run_limit:
            await self._run_full()
        if ack and self._acks.unacked_messages >= MAX_UNACKED_MESSAGES:
            await self._settle_acks()  # stay inside the partitions' windows

    def _set_frame_limit(self, max_frame_bytes: int, max_message_bytes: int = 0) -> None:
        """Size runs and frames to fit frames of ``max_frame_bytes`` and
        messages of ``max_message_bytes`` (the broker's; 0: no limit of its own)."""
        frame_limit = max(max_frame_bytes, MIN_MAX_FRAME_BYTES)
        self._chunk_budget = (
            (min(PUBLISH_FRAME_BYTES, frame_limit) - _FRAME_HEADER_BYTES) * 16 // 17
        )
        self._run_budget = (self._chunk_budget - _RUN_OVERHEAD_BYTES) * 14 // 15
        # A message bigger than a run's budget travels alone: one run, one frame.
        self._frame_message_bytes = frame_limit - _FRAME_HEADER_BYTES - _RUN_OVERHEAD_BYTES - 4
        self._max_message_bytes = min(self._frame_message_bytes, max_message_bytes or frame_limit)
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
        if self.closed and self._ack_mode and self._acks.producer_id and self._reopen:
            await self._settle_acks()  # reconnects, resends, and the buffer drains
        if self.closed:
            raise self._error or ConnectionClosed("the client is closed")
        self._update_run_limit()

    def _close_run(self) -> None:
        if self._run_messages:
            chunk = encode_run_chunk_from(self._run_key, self._run_sizes, self._run_messages)
            count = len(self._run_sizes)
            self._run_sizes = []
            self._run_messages = []
            self._run_bytes = 0
            if self._chunk_bytes + len(chunk) > self._chunk_budget:
                self._close_frame()
            if self._ack_mode:
                self._chunk_keys.append(self._run_key_text)
                self._chunk_messages += count
            self._chunks.append(chunk)
            self._chunk_bytes += len(chunk)
            self._buffered += len(chunk)
        self._update_run_limit()

    def _close_frame(self) -> None:
        if not self._chunks:
            return
        if self._ack_mode:
            self._close_acked_frame()
            return
        parts = runs_frame_parts(BodyType.PUBLISH, self._publish_stream, self._chunks, self._stamp)
        self._buffered += sum(len(part) for part in parts) - self._chunk_bytes
        self._frames.extend(parts)
        self._chunks = []
        self._chunk_bytes = 0

    def _close_acked_frame(self) -> None:
        """An acked frame, numbered when the producer is idempotent and kept
        until answered (``AckedFrames``)."""
        acks = self._acks
        count = self._chunk_messages
        if acks.producer_id:
            first = acks.number(count)
            parts = producer_frame_parts(
                self._publish_stream,
                self._chunks,
                stamp_ts_broker=self._stamp,
                producer_id=acks.producer_id,
                first_sequence=first,
            )
        else:
            first = 0
            parts = runs_frame_parts(
                BodyType.PUBLISH, self._publish_stream, self._chunks, self._stamp, True
            )
        data = b"".join(parts)
        acks.opened(count)
        if acks.batch is not None:
            acks.batch.frames += 1
        frame = SentFrame(data, self._chunk_keys, first, count, batch=acks.batch)
        acks.sent(frame, trio.current_time())
        self._chunk_keys = []
        self._chunk_messages = 0
        self._buffered += len(data) - self._chunk_bytes
        self._frames.append(data)
        self._chunks = []
        self._chunk_bytes = 0

    def continue_producer(self, producer_id: int, next_sequence: int) -> None:
        """Send the next acked messages as ``producer_id``, numbered from
        ``next_sequence``: for a publisher whose batches travel over several
        connections and numbers them itself, one batch at a time, so that a
        batch retried on another node carries the identity it was first
        sent with and that node stores it once (``publish_batch`` keeps
        several in flight). Call with nothing acked pending (after
        ``flush_acks``); the client must be idempotent."""
        acks = self._acks
        if not acks.producer_id or not producer_id:
            raise ValueError("continue_producer needs an idempotent client and producer id")
        if acks.pending or (self._ack_mode and (self._chunks or self._run_messages)):
            raise RuntimeError("continue_producer called with acked messages pending")
        acks.producer_id = producer_id
        acks.next_sequence = next_sequence

    async def publish_batch(
        self,
        key: str,
        payloads: Sequence[bytes],
        producer_id: int,
        first_sequence: int,
        *,
        key_partition: bytes = b"",
        tags: Iterable[tuple[str, str]] = (),
        uid: bytes = b"",
    ) -> BatchAnswers:
        """Queue ``payloads`` on ``key`` as acked frames of their own, sent as
        ``producer_id`` (0 on a client that is not idempotent) numbered from
        ``first_sequence``, and return their answers (``wait_batch``).

        For a publisher whose batches travel over several connections
        (broky.client.cluster): it numbers them itself, so that a batch
        retried on another node carries the identity it was first sent with
        and is stored once, and keeps several in flight on one connection,
        each answered on its own. These frames are never resent by this
        client and never returned by ``flush_acks``. Nothing else may
        publish on this client until it returns (it may wait for buffer space).
        """
        if self.closed:
            raise self._error or ConnectionClosed("the client is closed")
        acks = self._acks
        if bool(producer_id) is not bool(acks.producer_id):
            raise ValueError("publish_batch: a producer id exactly if the client is idempotent")
        self._close_run()
        self._close_frame()  # what was queued before travels in its own frames
        batch = acks.batch = BatchAnswers()
        if producer_id:
            acks.producer_id = producer_id
            acks.next_sequence = first_sequence
        try:
            for payload in payloads:
                await self.publish(
                    key, payload, key_partition=key_partition, tags=tags, uid=uid, ack=True
                )
            self._close_run()
            self._close_frame()
        finally:
            acks.batch = None
        self._kick()
        return batch

    async def wait_batch(self, batch: BatchAnswers) -> AckedRuns:
        """The offsets of ``batch`` (from ``publish_batch``) once every frame
        of it is acked. Raises the error in place of one of its frames, or
        ConnectionClosed if the connection ends first (its outcome is then
        unknown). Not bounded in time: the caller's deadline bounds it."""
        while not batch.complete:
            if self.closed:
                raise self._error or ConnectionClosed("the client is closed")
            if self._acks_done.is_set():
                self._acks_done = trio.Event()
            await self._acks_done.wait()
        if batch.error is not None:
            raise batch.error
        return AckedRuns(batch.acks)

    async def flush_acks(self) -> AckedRuns:
        """Send what ``publish(..., ack=True)`` queued and wait for every ack.

        Returns the offsets of everything acked since the last call, in
        publish order per partition (ephemeral keys get no entry). An ack
        means the message reached its topic's durability point (fsync
        ``always``: on disk). Raises BrokyError if the broker could not store
        some of it; what was acked before stays acked.

        Idempotent (the default): frames answered with the retriable
        ``OwnerUnavailable``, or lost with the connection, are sent again
        with the same producer id and sequences, so they are stored once,
        until ``retry_timeout`` seconds have passed; a client from
        ``broky.connect`` reconnects to its address for that.

        A frame left unanswered on an open connection for ``ack_timeout``
        seconds (counted from its sending, or from this call for a frame an
        earlier call waited for; a stuck fsync, a stopped owner, a broker bug) raises
        AckTimeout, naming how many frames and which keys wait. The frames
        are not given up: they stay in flight under the same producer id,
        so a later ``flush_acks`` keeps waiting for their answers, and a
        lost connection resends them, stored once. Raising rather than
        dropping the connection and resending (Kafka's
        ``request.timeout.ms``): a reconnect cannot cure a stalled owner,
        whose socket still holds the frames and stores them once it runs
        again, and it would end the connection's subscriptions too; the
        caller chooses to wait longer or to close the client.
        """
        await self._settle_acks()
        error = self._acks.take_error()
        if error is not None:
            raise error
        return self._acks.take_acked()

    async def _settle_acks(self) -> None:
        """Send everything acked and wait until every frame is answered,
        resending what failed retriably (module docstring of ``acked``)."""
        acks = self._acks
        called = trio.current_time()
        deadline = called + self.retry_timeout
        pause = _RETRY_PAUSE
        while True:
            self._close_run()
            self._close_frame()
            self._kick()
            while acks.in_flight and not self.closed:
                self._acks_done = trio.Event()
                oldest = acks.oldest_sent_at
                assert oldest is not None  # in flight
                # From its send, or from this call for a frame an earlier one waited for.
                with trio.move_on_at(max(oldest, called) + self.ack_timeout) as waiting:
                    await self._acks_done.wait()
                if waiting.cancelled_caught:
                    raise acks.timed_out(self.ack_timeout)
            if self.closed:
                acks.connection_lost()
                if not acks.producer_id or self._reopen is None:
                    raise self._error or ConnectionClosed("the client is closed")
            if not acks.pending:
                return
            if trio.current_time() >= deadline:
                lost = acks.abandon()
                cause = acks.last_retriable or self._error
                raise BrokyError(
                    ErrorCode.OWNER_UNAVAILABLE,
                    f"{lost} acked messages still not stored after retrying for "
                    f"{self.retry_timeout} s (last: {cause})",
                )
            await trio.sleep(pause)
            pause = min(2 * pause, _MAX_RETRY_PAUSE)
            if self.closed:
                assert self._reopen is not None
                try:
                    await self._reopen()
                except (BrokyError, OSError) as exc:
                    acks.last_retriable = BrokyError(ErrorCode.OWNER_UNAVAILABLE, str(exc))
                    continue
            for frame in acks.take_resend():
                acks.sent(frame, trio.current_time())
                self._frames.append(frame.data)
                self._buffered += len(frame.data)

    def _handle_ack(self, frame: PublishAck) -> None:
        self._acks.acked(frame)
        self._acks_done.set()

    def _send_raw(self, data: bytes) -> None:
        self._close_run()
        self._close_frame()
        self._frames.append(data)
        self._buffered += len(data)
        self._kick()

    def _kick(self) -> None:
        """Get what is queued on its way.

        If the writer is idle and has nothing in flight, this task writes it
        at once (one non-blocking send), so a lone message or control frame
        does not wait a scheduling round for the writer task. The writer is
        woken either way: it sends any remainder, and until it has run,
        ``_writer_idle`` stays false, so further messages queue behind and
        batch as before (at most one direct write per writer round). Bytes
        never interleave: a direct write happens only while no ``send_all``
        is under way, and it sends everything queued, in order. Acked
        publishing never writes directly: an acked frame holds everything
        published until the task yields, and is acked or refused whole.
        """
        if not self._writer_idle:
            return
        self._writer_idle = False
        if self._send_now is not None and not self._sending and not self._ack_mode:
            self._close_run()
            self._close_frame()
            data = b"".join(self._frames)
            written = self._send_now(data)
            self._frames = [data[written:]] if written < len(data) else []
            self._buffered -= written
            self._update_run_limit()
        self._wake_writer.set()

    def _send_control(self, frame: Frame) -> None:
        self._send_raw(encode_frame(frame))
