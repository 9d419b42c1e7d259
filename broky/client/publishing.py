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

from collections.abc import Callable, Iterable
from typing import Final

import trio

from broky.client.durable import AckedRun
from broky.client.errors import ConnectionClosed
from broky.protocol.codec import encode_frame, encode_run_chunk, runs_frame_parts
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
from broky.protocol.message import encode_message, pack_sizes

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


class Publisher:
    """The publishing half of ``Client`` (its base class): the open run,
    finished run chunks and frames waiting for the writer, and acked
    publishing. The connection (``Client``) owns ``closed`` and ``_error``
    and sets them when it ends."""

    closed: bool
    _error: BaseException | None

    def __init__(self, publish_stream: int) -> None:
        #: The stream id Publish frames carry, so that a stream Error can name them.
        self._publish_stream = publish_stream
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
        self._ack_sequence = 0
        self._ack_frames: dict[int, list[str]] = {}
        self._acked: list[AckedRun] = []
        self._acks_done = trio.Event()
        self._ack_error: BaseException | None = None

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
        self._kick()
        if self._run_bytes >= self._run_limit:
            await self._run_full()

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
        self._kick()
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
