"""A connection's durable-topic requests: acked publishes, replays, Fetch
and ListPartitions.

Split from the connection handler so that the handler stays the owner of the
socket, the liveness clocks and admission, while everything that talks to
the :class:`DurableStore` (partition owners, acks, replays) lives here. The
connection owns one ``DurableRequests`` and calls it from its reader task;
nothing here awaits, so a request is queued to its partition owner in the
same step that decoded it and frames stay in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from broky.durable.acks import AckQueue
from broky.durable.replay import Replay
from broky.durable.store import DurableStore, located_chunk
from broky.protocol.chunks import CHUNK_TABLE_OFFSET, read_chunk_run
from broky.protocol.codec import encode_frame, runs_frame_parts
from broky.protocol.constants import BodyType, ErrorCode, StartKind
from broky.protocol.frames import (
    EncodedRun,
    Error,
    Fetch,
    ListPartitions,
    Partitions,
    Publish,
    Run,
)
from broky.router.outbox import Outlet, Subscription
from broky.router.router import Router
from broky.storage.errors import OffsetOutOfRangeError
from broky.storage.log import DEFAULT_READ_BYTES, PartitionLog

#: Why the connection's principal may not read a pattern (None: it may).
Refusal = Callable[[bytes], "str | None"]


class DurableRequests:
    """Serve one connection's requests that touch durable topics."""

    def __init__(
        self, router: Router, outlet: Outlet, store: DurableStore | None, refusal: Refusal
    ) -> None:
        self._router = router
        self._outlet = outlet
        self.store = store
        self._refusal = refusal
        #: Created on the first acked publish or refusal.
        self._acks: AckQueue | None = None

    def _ack_queue(self) -> AckQueue:
        acks = self._acks
        if acks is None:
            acks = self._acks = AckQueue(self._outlet)
        return acks

    def stream_error(self, code: ErrorCode, message: str, stream: int) -> None:
        self._outlet.send_control(encode_frame(Error(code, message, stream)))

    def refuse_acked(self, stream: int, code: ErrorCode, message: str) -> None:
        """Answer an acked Publish with an error in its ack's place."""
        acks = self._ack_queue()
        acks.open(stream).refuse(code, message)
        acks.release()

    def publish(self, frame: Publish, runs: Sequence[Run]) -> None:
        """A Publish with durable runs or an ack request: durable runs go to
        their partitions' owners, the rest is routed at once."""
        router = self._router
        store = self.store
        acks = self._ack_queue()
        ticket = acks.open(frame.stream) if frame.ack else None
        ephemeral: list[Run] = []
        stamp = 0
        for index, run in enumerate(runs):
            topic = store.match(run.key) if store is not None else None
            if topic is None or store is None:
                ephemeral.append(run)
                continue
            stamp = stamp or store.now()
            store.append(topic, run, stamp, ticket, acks if ticket else None, index)
        if ephemeral:
            router.publish(
                router.encode(ephemeral, frame.stamp_ts_broker), self._outlet, frame.stream
            )
        if ticket is not None:
            acks.release()

    def forward(self, stream: int, runs: list[EncodedRun]) -> None:
        """Unacked Publish runs read as forwardable chunks: routed as they
        are unless one of them belongs to a durable topic; then the runs
        are read back from their chunks and take the durable path, in order."""
        store = self.store
        if store is None or not any(store.match(run.key) for run in runs):
            self._router.publish(runs, self._outlet, stream)
            return
        decoded = []
        for run in runs:
            chunk_run = read_chunk_run(memoryview(run.chunk), CHUNK_TABLE_OFFSET)
            assert chunk_run is not None  # it was read as a chunk on receipt
            decoded.append(chunk_run)
        self.publish(Publish(stream, tuple(decoded)), decoded)

    def replay(
        self,
        subscription: Subscription,
        start: StartKind,
        start_time: int,
        start_offsets: tuple[int, ...],
    ) -> None:
        """Start replaying the durable topics ``subscription`` matches."""
        store = self.store
        if store is None or start is StartKind.LATEST:
            return
        store.spawn(Replay(store, subscription, start, start_time, start_offsets).run)

    def fetch(self, frame: Fetch) -> None:
        """Answer a Fetch from the partition's owner, without waiting here."""
        store = self.store
        owner = store.owners.get((frame.topic, frame.partition)) if store is not None else None
        if owner is None:
            self.stream_error(
                ErrorCode.UNKNOWN_TOPIC,
                f"no durable topic {frame.topic!r} with partition {frame.partition}",
                frame.stream,
            )
            return
        refusal = self._refusal(owner.topic.pattern)
        if refusal is not None:
            self.stream_error(
                ErrorCode.PERMISSION_DENIED,
                f"reading durable topic {frame.topic!r}: {refusal}",
                frame.stream,
            )
            return
        outlet = self._outlet
        # Leave room for the frame's header and one run's overhead.
        budget = min(frame.max_bytes or DEFAULT_READ_BYTES, outlet.max_frame_bytes // 2)
        partition = frame.partition

        def read(partition_log: PartitionLog) -> list[bytes]:
            return [
                located_chunk(batch.run, partition, batch.base_offset)
                for batch in partition_log.read(frame.offset, budget)
            ]

        def done(result: list[bytes] | BaseException) -> None:
            if isinstance(result, OffsetOutOfRangeError):
                self.stream_error(ErrorCode.OFFSET_OUT_OF_RANGE, str(result), frame.stream)
            elif isinstance(result, BaseException):
                self.stream_error(ErrorCode.STORAGE_FAILURE, str(result), frame.stream)
            else:
                outlet.send_control(
                    b"".join(runs_frame_parts(BodyType.FETCHED, frame.stream, result))
                )

        owner.submit(read, done)

    def list_partitions(self, frame: ListPartitions) -> None:
        """Answer from the owners' cached offsets (no disk access)."""
        owners = self.store.topics(frame.topic) if self.store is not None else []
        if not owners:
            self.stream_error(
                ErrorCode.UNKNOWN_TOPIC, f"no durable topic named {frame.topic!r}", frame.stream
            )
            return
        # Listing all topics shows the readable ones; naming one unreadable is refused.
        readable = [owner for owner in owners if self._refusal(owner.topic.pattern) is None]
        if frame.topic and not readable:
            self.stream_error(
                ErrorCode.PERMISSION_DENIED,
                f"reading durable topic {frame.topic!r} is not allowed for this principal",
                frame.stream,
            )
            return
        self._outlet.send_control(
            encode_frame(
                Partitions(
                    stream=frame.stream,
                    topics=tuple(owner.topic.name for owner in readable),
                    partitions=tuple(owner.partition for owner in readable),
                    start_offsets=tuple(owner.start_offset for owner in readable),
                    end_offsets=tuple(owner.end_offset for owner in readable),
                )
            )
        )
