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
from broky.durable.forwarding import Forwarder
from broky.durable.owner import located_chunk
from broky.durable.relays import PartitionListing, overlapping_owners
from broky.durable.replay import Replay
from broky.durable.store import DurableStore
from broky.protocol.chunk_reading import read_chunk_run
from broky.protocol.chunks import CHUNK_TABLE_OFFSET
from broky.protocol.codec import encode_frame, runs_frame_parts
from broky.protocol.constants import BodyType, ErrorCode, LinkKind, StartKind
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import (
    EncodedRun,
    Error,
    Fetch,
    ListPartitions,
    Partitions,
    Publish,
    Run,
)
from broky.router.matcher import patterns_overlap, validate_pattern
from broky.router.outbox import Outlet, Subscription
from broky.router.router import Router
from broky.storage.errors import OffsetOutOfRangeError
from broky.storage.log import PartitionLog
from broky.storage.log_reads import DEFAULT_READ_BYTES


def _no_identities() -> None:
    """A Publish without ack is stored without producer identities."""


#: Why the connection's principal may not read a pattern (None: it may).
Refusal = Callable[[bytes], "str | None"]


class DurableRequests:
    """Serve one connection's requests that touch durable topics."""

    def __init__(
        self,
        router: Router,
        outlet: Outlet,
        store: DurableStore | None,
        refusal: Refusal,
        forwarder: Forwarder | None = None,
    ) -> None:
        self._router = router
        self._outlet = outlet
        self.store = store
        self._refusal = refusal
        #: Channels to the other workers' partitions (None: one worker).
        self._forwarder = forwarder
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
        producer = frame.producer_id
        if producer and frame.ack:
            resend_from = acks.resend_needed(producer, frame.first_sequence)
            if resend_from is not None:
                acks.open(frame.stream).refuse(
                    ErrorCode.OWNER_UNAVAILABLE,
                    f"an earlier frame of producer {producer:#x} failed retriably: resend "
                    f"from sequence {resend_from} first; nothing of this frame was stored",
                )
                acks.release()
                return
        ticket = acks.open(frame.stream, producer, frame.first_sequence) if frame.ack else None
        if ticket is not None and self._outlet.kind is LinkKind.DURABLE:
            ticket.per_run = True  # another worker's frame of many clients' runs (acks.py)
        if store is None:
            ephemeral = list(runs)
        elif frame.run_producers:  # forwarded by another worker: runs of many producers
            identities = frame.run_identities() if frame.ack else None
            ephemeral = store.append_frame(runs, ticket, acks if ticket else None, identities)
        else:
            ephemeral = store.append_publish(
                runs,
                ticket,
                acks if ticket else None,
                producer if frame.ack else 0,
                frame.first_sequence,
                frame.run_identities if frame.ack else _no_identities,
            )
        if self._forwarder is not None:
            self._forwarder.flush()
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
        if store is None or not store.any_durable(runs):
            self._router.publish(runs, self._outlet, stream)
            return
        decoded = []
        for run in runs:
            chunk_run = read_chunk_run(memoryview(run.chunk), CHUNK_TABLE_OFFSET)
            assert chunk_run is not None  # it was read as a chunk on receipt
            decoded.append(chunk_run)
        self.publish(Publish(stream, tuple(decoded)), decoded)

    @property
    def congested(self) -> bool:
        """Stop reading this connection: the logs' queue or an owner's credit is full."""
        store = self.store
        forwarder = self._forwarder
        return (store is not None and store.congested) or (
            forwarder is not None and forwarder.congested
        )

    async def wait_for_room(self) -> None:
        """Wait until ``congested`` is false (TCP pushes back on the publisher)."""
        while self.congested:
            if self.store is not None and self.store.congested:
                await self.store.wait_for_room()
            if self._forwarder is not None and self._forwarder.congested:
                await self._forwarder.wait_for_room()

    def _owners(self, pattern: bytes) -> set[int]:
        """The other workers owning partitions a client's ``pattern`` reads."""
        store = self.store
        if store is None or self._forwarder is None or self._outlet.kind is not LinkKind.CLIENT:
            return set()
        try:
            validate_pattern(pattern)
        except RemoteProtocolError:
            return set()  # the router refuses it
        return overlapping_owners(store.policies.policies, pattern, store.owner_index, store.worker)

    def queue_refusal(self, pattern: bytes, start: StartKind) -> str | None:
        """Why a queue-group subscription to ``pattern`` is refused (None:
        it is not): a group is live and at most once, so it may not replay,
        nor spread a durable topic, whose shared work queue is a durable
        ``shared`` subscription (``Consume``: acked, redelivered)."""
        if start is not StartKind.LATEST:
            return "a queue group is live only: subscribe with start Latest"
        store = self.store
        if store is None:
            return None
        for topic in store.policies.policies:
            if patterns_overlap(topic.pattern, pattern):
                return (
                    f"a queue group is for ephemeral topics; {pattern.decode(errors='replace')!r} "
                    f"overlaps durable topic {topic.name!r}: share its work with a durable "
                    "shared subscription (Consume) instead"
                )
        return None

    def remote_owners(self, pattern: bytes) -> int:
        """How many other workers must confirm a subscription to ``pattern``
        before its ``Subscribed`` (their live runs flow from then on)."""
        return len(self._owners(pattern))

    def replay(
        self,
        subscription: Subscription,
        start: StartKind,
        start_time: int,
        start_offsets: tuple[int, ...],
    ) -> None:
        """Start replaying the durable topics ``subscription`` matches: this
        worker's partitions here, the others' at their owners (relayed)."""
        store = self.store
        if store is None:
            return
        forwarder = self._forwarder
        owners = self._owners(subscription.pattern)
        if forwarder is not None and owners:
            forwarder.subscribe(subscription, owners, start, start_time, start_offsets)
        if start is StartKind.LATEST or subscription.closed:
            return
        store.spawn(Replay(store, subscription, start, start_time, start_offsets).run)

    def fetch(self, frame: Fetch) -> None:
        """Answer a Fetch from the partition's owner, without waiting here."""
        store = self.store
        topic = store.policies.named(frame.topic) if store is not None else None
        if store is None or topic is None or not 0 <= frame.partition < topic.partitions:
            self.stream_error(
                ErrorCode.UNKNOWN_TOPIC,
                f"no durable topic {frame.topic!r} with partition {frame.partition}",
                frame.stream,
            )
            return
        refusal = self._refusal(topic.pattern)
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
        owner = store.owners.get((frame.topic, partition))
        if owner is None:
            channel = (
                self._forwarder.channels.get(store.owner_index(topic.name, partition))
                if self._forwarder is not None
                else None
            )
            if channel is None or not channel.fetch(frame, budget, outlet):
                self.stream_error(
                    ErrorCode.OWNER_UNAVAILABLE,
                    f"the worker owning {frame.topic}/{partition} is unavailable; retry shortly",
                    frame.stream,
                )
            return

        readable = owner.readable_end  # the high watermark of a replicated partition

        def read(partition_log: PartitionLog) -> list[bytes]:
            return [
                located_chunk(batch.run, partition, batch.base_offset)
                for batch in partition_log.read(frame.offset, budget, stop_offset=readable)
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
        """Answer from the owners' cached offsets (no disk access): this
        worker's, and the other workers' asked over their channels."""
        store = self.store
        policies = store.policies.policies if store is not None else ()
        named = [topic for topic in policies if not frame.topic or topic.name == frame.topic]
        if store is None or not named:
            self.stream_error(
                ErrorCode.UNKNOWN_TOPIC, f"no durable topic named {frame.topic!r}", frame.stream
            )
            return
        # Listing all topics shows the readable ones; naming one unreadable is refused.
        readable = {topic.name for topic in named if self._refusal(topic.pattern) is None}
        if frame.topic and not readable:
            self.stream_error(
                ErrorCode.PERMISSION_DENIED,
                f"reading durable topic {frame.topic!r} is not allowed for this principal",
                frame.stream,
            )
            return
        order = {topic.name: position for position, topic in enumerate(policies)}
        local = [
            (owner.topic.name, owner.partition, owner.start_offset, owner.readable_end)
            for owner in store.topics(frame.topic)
        ]

        def answer(result: list[tuple[str, int, int, int]] | str) -> None:
            if isinstance(result, str):
                self.stream_error(ErrorCode.OWNER_UNAVAILABLE, result, frame.stream)
                return
            entries = sorted(
                (entry for entry in local + result if entry[0] in readable),
                key=lambda entry: (order[entry[0]], entry[1]),
            )
            self._outlet.send_control(
                encode_frame(
                    Partitions(
                        stream=frame.stream,
                        topics=tuple(entry[0] for entry in entries),
                        partitions=tuple(entry[1] for entry in entries),
                        start_offsets=tuple(entry[2] for entry in entries),
                        end_offsets=tuple(entry[3] for entry in entries),
                    )
                )
            )

        channels = (
            list(self._forwarder.channels.values())
            if self._forwarder is not None and self._outlet.kind is LinkKind.CLIENT
            else []
        )
        if not channels:
            answer([])
            return
        listing = PartitionListing(len(channels), answer)
        for channel in channels:
            channel.list_partitions(frame.topic, listing)
