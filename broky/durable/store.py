"""The broker's durable topics: one owner task per partition log.

Ownership: a ``PartitionLog`` is single-owner and blocking, so each one gets
an owner task (``PartitionOwner.run``). Everything that touches the log —
appends, fsyncs, reads for Fetch and replays, ``tick`` — is queued to the
owner and done in one ``trio.to_thread.run_sync`` call per round, so the
event loop keeps serving while a disk works, and no two threads ever touch
one log. Results come back to the trio thread, where the router is called
(never awaited) and acks are released.

Group commit: a round appends everything queued since the last round with
one ``append`` (one write) and, with ``fsync = "always"``, one ``sync()``.
While that fsync runs, new publishes queue up and become the next round's
batch, so the fsync rate adapts to the load instead of following frames.

Ordering: runs of one partition are appended and fanned out in arrival
order. A durable run reaches live subscribers after its durability point
(after the fsync with ``always``), so a subscriber never sees a message that
a crash could take back; ephemeral runs of the same Publish frame are routed
at once and may overtake it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import attrs
import trio

from broky.durable.acks import AckQueue, AckTicket
from broky.durable.ownership import PartitionLock, partition_owner
from broky.protocol.codec import encode_durable_run_chunk
from broky.protocol.constants import ErrorCode
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Run
from broky.router.outbox import DurableEncodedRun, EncodedRun
from broky.router.router import Router
from broky.storage.config import FsyncPolicy
from broky.storage.errors import StorageError
from broky.storage.log import LogStatistics, PartitionLog, RecoveryReport
from broky.storage.topics import TopicPolicies, TopicPolicy, partition_run

log = logging.getLogger("broky.durable")

#: Bytes of publishes queued for the logs before publishers wait (TCP
#: backpressure): 64 MiB is ~0.2 s of the fastest disk we target and bounds
#: the broker's memory for durable traffic whatever the number of partitions.
DEFAULT_PENDING_BYTES: Final = 64 * 1024 * 1024
#: Seconds between ``tick()`` calls of an idle partition (interval fsync,
#: time rolls, retention): a fraction of the default 1 s fsync interval.
TICK_SECONDS: Final = 0.2

#: A request run by the owner on its thread; gets the log, returns anything.
LogRequest = Callable[[PartitionLog], Any]
#: Takes a run part bound for a partition another worker owns:
#: ``(topic, partition, run, ticket, acks, run_index)`` (broky.durable.forwarding).
RemoteAppend = Callable[[TopicPolicy, int, Run, "AckTicket | None", "AckQueue | None", int], None]


@attrs.frozen
class DurableStatistics:
    """Totals over every partition log of one broker."""

    partitions: int
    appended_messages: int
    appended_bytes: int
    fsyncs: int
    size_bytes: int
    segments: int
    recovery_truncated_bytes: int
    recovery_indexes_rebuilt: int
    recovery_corrupt_segments: int
    #: Acked messages this worker forwarded to other workers' partitions.
    forwarded_messages: int = 0


@attrs.define(slots=True, eq=False)
class _PendingRun:
    run: Run
    ticket: AckTicket | None
    acks: AckQueue | None
    run_index: int


def located_chunk(run: Run, partition: int, base_offset: int) -> bytes:
    """The chunk of ``run`` as stored from ``base_offset`` of ``partition``:
    what Deliver and Fetched carry for durable topics."""
    return encode_durable_run_chunk(
        Run(run.key, run.ts_broker, run.count, run.sizes, run.messages, partition, base_offset)
    )


class PartitionOwner:
    """The one task allowed to touch a partition log (see the module docstring)."""

    def __init__(
        self, store: DurableStore, topic: TopicPolicy, partition: int, partition_log: PartitionLog
    ) -> None:
        self.store = store
        self.topic = topic
        self.partition = partition
        self._log = partition_log
        self.recovery: RecoveryReport = partition_log.recovery
        self.statistics: LogStatistics = partition_log.statistics()
        #: Cached after each round, for ListPartitions without a thread hop.
        self.start_offset = partition_log.start_offset
        self.end_offset = partition_log.end_offset
        self._pending: list[_PendingRun] = []
        self._requests: list[tuple[LogRequest, Callable[[Any], None]]] = []
        self._wake = trio.Event()
        self._fsync_always = topic.log.fsync is FsyncPolicy.ALWAYS

    def append(
        self, run: Run, ticket: AckTicket | None, acks: AckQueue | None, run_index: int
    ) -> None:
        """Queue a run for the next round (never waits)."""
        self._pending.append(_PendingRun(run, ticket, acks, run_index))
        self.store.pending_bytes += len(run.messages)
        self._wake.set()

    def submit(self, request: LogRequest, done: Callable[[Any], None]) -> None:
        """Run ``request(log)`` in the next round; ``done`` gets its result or
        the exception it raised, on the trio thread."""
        self._requests.append((request, done))
        self._wake.set()

    async def call(self, request: LogRequest) -> Any:
        """``submit`` and wait: the result, or the exception re-raised."""
        finished = trio.Event()
        box: list[Any] = []

        def done(result: Any) -> None:
            box.append(result)
            finished.set()

        self.submit(request, done)
        await finished.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    async def run(self) -> None:
        """Serve rounds until cancelled; a round in a thread is not interrupted."""
        next_tick = time.monotonic()
        while True:
            if not (self._pending or self._requests):
                with trio.move_on_at(trio.current_time() + TICK_SECONDS):
                    await self._wake.wait()
            self._wake = trio.Event()
            pending, self._pending = self._pending, []
            requests, self._requests = self._requests, []
            tick = time.monotonic() >= next_tick
            if not (tick or pending or requests):
                continue
            if tick:
                next_tick = time.monotonic() + TICK_SECONDS
            runs = [item.run for item in pending]
            outcome, results = await trio.to_thread.run_sync(self._round, runs, requests, tick)
            self._finish(pending, outcome)
            for (_, done), result in zip(requests, results, strict=True):
                done(result)

    def _round(
        self, runs: list[Run], requests: list[tuple[LogRequest, Callable[[Any], None]]], tick: bool
    ) -> tuple[int | StorageError | OSError | None, list[Any]]:
        """One round, in a worker thread: append + fsync, requests, tick."""
        partition_log = self._log
        outcome: int | StorageError | OSError | None = None
        if runs:
            try:
                outcome = partition_log.append(runs).first_offset
                if self._fsync_always:
                    partition_log.sync()
            except (StorageError, OSError) as exc:
                log.error("append to %s failed: %s", partition_log.directory, exc)
                outcome = exc
        results: list[Any] = []
        for request, _ in requests:
            try:
                results.append(request(partition_log))
            except (StorageError, OSError) as exc:
                results.append(exc)
        if tick:
            try:
                partition_log.tick()
            except (StorageError, OSError) as exc:
                log.error("housekeeping of %s failed: %s", partition_log.directory, exc)
        self.start_offset = partition_log.start_offset
        self.end_offset = partition_log.end_offset
        self.statistics = partition_log.statistics()
        return outcome, results

    def _finish(self, pending: list[_PendingRun], outcome: int | Exception | None) -> None:
        """Back on the trio thread: fan the appended runs out, release acks."""
        if not pending:
            return
        store = self.store
        store.pending_bytes -= sum(len(item.run.messages) for item in pending)
        store.room_changed()
        queues: set[AckQueue] = set()
        if not isinstance(outcome, int):
            reason = f"could not store {self.topic.name}/{self.partition}: {outcome}"
            for item in pending:
                if item.ticket is not None and item.acks is not None:
                    item.ticket.failed(reason)
                    queues.add(item.acks)
        else:
            offset = outcome
            encoded: list[EncodedRun] = []
            for item in pending:
                run = item.run
                chunk = located_chunk(run, self.partition, offset)
                encoded.append(DurableEncodedRun(run.key, run.count, chunk, self, offset))
                if item.ticket is not None and item.acks is not None:
                    item.ticket.done(item.run_index, self.partition, offset, offset + run.count - 1)
                    queues.add(item.acks)
                offset += run.count
            store.router.publish(encoded)
        for queue in queues:
            queue.release()

    def close(self) -> None:
        """Sync and close the log (the owner task has stopped)."""
        self._log.close()


class DurableStore:
    """The durable topics of one broker: policies, partition owners, backpressure."""

    def __init__(
        self,
        data_dir: str,
        policies: Sequence[TopicPolicy],
        router: Router,
        clock: Callable[[], int] = time.time_ns,
        pending_limit: int = DEFAULT_PENDING_BYTES,
        worker: int = 0,
        workers: int = 1,
    ) -> None:
        self.data_dir = data_dir
        #: This worker's index and the node's worker count: it opens only the
        #: partitions it owns (broky.durable.ownership).
        self.worker = worker
        self.workers = max(workers, 1)
        #: Where runs for other workers' partitions go (None: one worker, or
        #: no forwarding: such runs fail with OwnerUnavailable).
        self.forward: RemoteAppend | None = None
        self._locks: list[PartitionLock] = []
        self.policies = TopicPolicies(policies)
        self.router = router
        self._clock = clock
        self.pending_limit = pending_limit
        self.pending_bytes = 0
        self._room = trio.Event()
        self.owners: dict[tuple[str, int], PartitionOwner] = {}
        self._nursery: trio.Nursery | None = None

    def open(self) -> None:
        """Open (and recover) every partition log this worker owns, each under
        its directory's lock; blocking, call it in a thread."""
        for topic in self.policies.policies:
            for partition in range(topic.partitions):
                if self.owner_index(topic.name, partition) != self.worker:
                    continue
                directory = os.path.join(self.data_dir, topic.name, str(partition))
                self._locks.append(PartitionLock(directory))
                partition_log = PartitionLog.open(directory, topic.log, self._clock)
                self.owners[(topic.name, partition)] = PartitionOwner(
                    self, topic, partition, partition_log
                )
        repaired = [owner.recovery for owner in self.owners.values() if not owner.recovery.clean]
        log.info(
            "durable topics: %d partitions opened in %s, %d repaired",
            len(self.owners),
            self.data_dir,
            len(repaired),
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the logs, serve them until cancelled, then close them."""
        await trio.to_thread.run_sync(self.open)
        try:
            async with trio.open_nursery() as nursery:
                for owner in self.owners.values():
                    nursery.start_soon(owner.run)
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._close_all)

    def spawn(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run a task (a replay) beside the owners, until it ends or the store stops."""
        if self._nursery is not None:
            self._nursery.start_soon(task)

    def _close_all(self) -> None:
        for owner in self.owners.values():
            try:
                owner.close()
            except (StorageError, OSError) as exc:
                log.error("closing %s/%d failed: %s", owner.topic.name, owner.partition, exc)
        for lock in self._locks:
            lock.release()
        self._locks.clear()

    def owner_index(self, topic: str, partition: int) -> int:
        """The worker that owns ``partition`` of ``topic`` on this node."""
        return partition_owner(topic, partition, self.workers)

    # --- publishing (on the trio thread, never waiting) --------------------

    def match(self, key: bytes) -> TopicPolicy | None:
        """The durable topic of ``key``, or None (ephemeral; invalid keys too,
        so that the router answers them as it always has)."""
        try:
            return self.policies.match(key)
        except RemoteProtocolError:
            return None

    def append(
        self,
        topic: TopicPolicy,
        run: Run,
        stamp: int,
        ticket: AckTicket | None,
        acks: AckQueue | None,
        run_index: int,
    ) -> None:
        """Queue a published run for its partitions, stamped with ``stamp``."""
        if not run.count:
            return  # nothing to store (and a batch holds at least one message)
        original = run
        run = Run(run.key, stamp, run.count, run.sizes, run.messages)
        parts = partition_run(run, topic.partitions)
        for partition, part in parts:
            if ticket is not None:
                ticket.remaining += 1
            owner = self.owners.get((topic.name, partition))
            if owner is not None:
                owner.append(part, ticket, acks, run_index)
            elif self.forward is not None:
                # The owner restamps ts_broker: a whole run goes as it arrived.
                self.forward(
                    topic, partition, original if len(parts) == 1 else part, ticket, acks, run_index
                )
            elif ticket is not None and acks is not None:
                ticket.failed(
                    f"worker {self.worker} does not own {topic.name}/{partition}",
                    ErrorCode.OWNER_UNAVAILABLE,
                )

    def now(self) -> int:
        """The broker time stamped on durable runs (``ts_broker``)."""
        return self._clock()

    @property
    def congested(self) -> bool:
        """Publishers should wait (``wait_for_room``) before reading more."""
        return self.pending_bytes >= self.pending_limit

    async def wait_for_room(self) -> None:
        """Wait until the queued durable bytes fall under the bound."""
        while self.congested:
            if self._room.is_set():
                self._room = trio.Event()  # one event shared by every waiting reader
            await self._room.wait()

    def room_changed(self) -> None:
        if not self.congested:
            self._room.set()

    # --- introspection ----------------------------------------------------------

    def topics(self, name: str = "") -> list[PartitionOwner]:
        """The owners of topic ``name`` (every topic for ""), in order."""
        return [owner for (topic, _), owner in self.owners.items() if not name or topic == name]

    def statistics(self) -> DurableStatistics:
        owners = self.owners.values()
        return DurableStatistics(
            partitions=len(self.owners),
            appended_messages=sum(o.statistics.appended_messages for o in owners),
            appended_bytes=sum(o.statistics.appended_bytes for o in owners),
            fsyncs=sum(o.statistics.fsyncs for o in owners),
            size_bytes=sum(o.statistics.size_bytes for o in owners),
            segments=sum(o.statistics.segments for o in owners),
            recovery_truncated_bytes=sum(o.recovery.truncated_bytes for o in owners),
            recovery_indexes_rebuilt=sum(o.recovery.indexes_rebuilt for o in owners),
            recovery_corrupt_segments=sum(len(o.recovery.corrupt_segments) for o in owners),
        )
