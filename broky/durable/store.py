"""The broker's durable topics: one owner task per partition log.

Ownership: a ``PartitionLog`` is single-owner and blocking, so each one gets
an owner task (``PartitionOwner.run``). Everything that touches the log —
appends, fsyncs, reads for Fetch and replays, ``tick`` — is queued to the
owner and done in one thread call (broky.durable.thread_hop) per round, so the
event loop keeps serving while a disk works, and no two threads ever touch
one log. Results come back to the trio thread, where the router is called
(never awaited) and acks are released.

Group commit: a round appends everything queued since the last round with
one ``append`` (one write) and, with ``fsync = "always"``, one ``sync()``.
While that fsync runs, new publishes queue up and become the next round's
batch, so the fsync rate adapts to the load instead of following frames.

Idempotent producers: a round holding runs of idempotent producers is first
sorted against the partition's ``ProducerWindow`` (broky.durable.rounds):
retries of stored runs are answered with their original offsets and never
appended again; the window is rebuilt from the log tail when the partition
is opened.

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
from itertools import repeat
from operator import attrgetter
from typing import Final

import attrs
import trio

from broky.durable.acks import AckQueue, AckTicket
from broky.durable.owner import PartitionOwner
from broky.durable.ownership import PartitionLock, partition_owner
from broky.durable.parts import Part
from broky.durable.producers import Identity
from broky.protocol.constants import ErrorCode
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import EncodedRun, Run
from broky.router.router import Router
from broky.storage.errors import StorageError
from broky.storage.grouping import MISSING, partition_groups
from broky.storage.log import PartitionLog
from broky.storage.topics import TopicPolicies, TopicPolicy, partition_for, partition_run

log = logging.getLogger("broky.durable")

#: Bytes of publishes queued for the logs before publishers wait (TCP
#: backpressure): 64 MiB is ~0.2 s of the fastest disk we target and bounds
#: the broker's memory for durable traffic whatever the number of partitions.
DEFAULT_PENDING_BYTES: Final = 64 * 1024 * 1024
#: Runs queued for the logs before publishers wait, whatever their bytes:
#: each queued run is a few Python objects (~0.5 KiB), and with one-message
#: runs (a key per message) the byte bound alone let ~200k of them pile up.
#: 32k runs is still several rounds of every partition.
DEFAULT_PENDING_RUNS: Final = 32 * 1024
#: Keys whose durable topic (or none) ``match`` remembers: ~100 bytes each.
TOPIC_CACHE_KEYS: Final = 65_536

#: What ``any_durable`` reads of each run, and its answer for a key not seen yet.
_KEY: Final = attrgetter("key")
_UNKNOWN: Final = object()

#: The built-in topic of dead letters, and a key it must hold (its pattern
#: is ``_dlq.>``: ``_dlq.<subscription>.<topic>``).
DEAD_LETTER_TOPIC: Final = "_dlq"
DEAD_LETTER_PROBE: Final = b"_dlq.subscription.topic"

#: Takes a run part bound for a partition another worker owns:
#: ``(topic, partition, run, ticket, acks, run_index, identity)`` (broky.durable.forwarding).
RemoteAppend = Callable[
    [TopicPolicy, int, Run, "AckTicket | None", "AckQueue | None", int, "Identity | None"], None
]


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


def with_dead_letters(policies: Sequence[TopicPolicy]) -> list[TopicPolicy]:
    """``policies`` plus the built-in dead-letter topic ``_dlq`` (keys
    ``_dlq.>``, one partition) unless a configured topic already holds
    dead-letter keys (broky.subscriptions.deadletters)."""
    found = TopicPolicies(policies)
    if found.match(DEAD_LETTER_PROBE) is not None or found.named(DEAD_LETTER_TOPIC) is not None:
        return list(policies)
    return [*policies, TopicPolicy(name=DEAD_LETTER_TOPIC, pattern=b"_dlq.>")]


class DurableStore:
    """The durable topics of one broker: policies, partition owners, backpressure."""

    def __init__(
        self,
        data_dir: str,
        policies: Sequence[TopicPolicy],
        router: Router,
        clock: Callable[[], int] = time.time_ns,
        pending_limit: int = DEFAULT_PENDING_BYTES,
        pending_runs_limit: int = DEFAULT_PENDING_RUNS,
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
        self.policies = TopicPolicies(with_dead_letters(policies))
        self.router = router
        self._clock = clock
        self.pending_limit = pending_limit
        self.pending_bytes = 0
        self.pending_runs_limit = pending_runs_limit
        self.pending_runs = 0
        self._room = trio.Event()
        self.owners: dict[tuple[str, int], PartitionOwner] = {}
        #: The same owners by topic name, indexed by partition (the append
        #: path); None for a partition another worker owns.
        self._partition_owners: dict[str, list[PartitionOwner | None]] = {}
        self._nursery: trio.Nursery | None = None
        #: ``locate``'s answers by key; the policies never change after start
        #: (a reload does not touch ``[[durable]]``: broky.reload).
        self._located: dict[bytes, tuple[TopicPolicy, int] | None] = {}

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
                owner = PartitionOwner(self, topic, partition, partition_log)
                owner.recover_producers(partition_log)
                self.owners[(topic.name, partition)] = owner
                self._partition_owners.setdefault(topic.name, [None] * topic.partitions)[
                    partition
                ] = owner
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
        located = self.locate(key)
        return None if located is None else located[0]

    def locate(self, key: bytes) -> tuple[TopicPolicy, int] | None:
        """The durable topic of ``key`` and the partition of its messages
        without a ``key_partition``, or None (ephemeral; invalid keys too).
        Remembered per key (bounded like the router's route cache): it is
        asked once per run, and the hash is the same every time."""
        located = self._located
        if key in located:
            return located[key]
        try:
            topic = self.policies.match(key)
        except RemoteProtocolError:
            topic = None
        found = None if topic is None else (topic, partition_for(key, topic.partitions))
        if len(located) >= TOPIC_CACHE_KEYS:
            located.clear()
        located[key] = found
        return found

    def any_durable(self, runs: Sequence[EncodedRun]) -> bool:
        """Whether some of ``runs`` belong to a durable topic. Keys already
        seen cost one C-level dict lookup each, so ephemeral traffic on a
        broker with durable topics pays next to nothing for the question."""
        answers = list(map(self._located.get, map(_KEY, runs), repeat(_UNKNOWN)))
        if _UNKNOWN in answers:
            answers = [self.locate(run.key) for run in runs]
        return any(answers)

    def append_publish(
        self,
        runs: Sequence[Run],
        ticket: AckTicket | None,
        acks: AckQueue | None,
        producer: int,
        first_sequence: int,
        identities: Callable[[], Sequence[Identity | None] | None],
    ) -> list[Run]:
        """``append_frame`` for a client's Publish frame (``producer`` and
        ``first_sequence`` its producer fields, 0: not idempotent), grouped
        by partition in one pass (broky.storage.grouping) when every durable
        run of it belongs to one topic whose partitions this worker owns and
        no run spans partitions; otherwise through ``append_frame``, given
        ``identities()`` (the frame's per-run identities). Same parts, same
        order per partition, same tickets either way."""
        if acks is None:
            ticket = None
        grouped = partition_groups(runs, self._located, first_sequence)
        if grouped is MISSING:
            for run in runs:
                self.locate(run.key)
            grouped = partition_groups(runs, self._located, first_sequence)
        if not isinstance(grouped, tuple):
            return self.append_frame(runs, ticket, acks, identities())
        ephemeral, topic, groups = grouped
        if topic is None:  # nothing durable to store
            return ephemeral
        owners = self._partition_owners.get(topic.name)
        if owners is None or None in owners:  # some go to other workers
            return self.append_frame(runs, ticket, acks, identities())
        stamp = self._clock()
        for owner, group in zip(owners, groups, strict=True):
            if group is None or owner is None:  # (owner: checked above)
                continue
            group_runs, counts, indexes, sequences, messages, nbytes = group
            part = Part(
                stamp,
                ticket,
                acks,
                producer,
                group_runs,
                counts,
                indexes,
                sequences if producer else [],
                messages,
                nbytes,
                sequences[-1] + counts[-1] if producer else 0,
            )
            if ticket is not None:
                ticket.remaining += 1
            owner.append_part(part)
        return ephemeral

    def append_frame(
        self,
        runs: Sequence[Run],
        ticket: AckTicket | None,
        acks: AckQueue | None,
        identities: Sequence[Identity | None] | None = None,
    ) -> list[Run]:
        """Queue a Publish frame's durable runs for their partitions and
        return the others (ephemeral: the caller routes them).

        The runs bound for one partition this worker owns go as one
        :class:`Part` (broky.durable.parts), queued when the frame is done;
        a run split by ``key_partition`` adds a piece to each partition it
        touches, each with the sequence of its first message. Runs for other
        workers' partitions go to ``forward`` one by one. ``identities``
        gives each run's ``(producer, first sequence)`` (None: not
        idempotent); ``ticket`` counts one pending piece per part and per
        forwarded or refused run.
        """
        if acks is None:
            ticket = None
        cache = self._located
        ephemeral: list[Run] = []
        parts: dict[PartitionOwner, Part] = {}
        stamp = 0
        for index, run in enumerate(runs):
            key = run.key
            located = cache[key] if key in cache else self.locate(key)
            if located is None:
                ephemeral.append(run)
                continue
            if not run.count:
                continue  # nothing to store (and a batch holds at least one message)
            topic, default = located
            stamp = stamp or self._clock()
            identity = identities[index] if identities is not None else None
            producer, sequence = identity or (0, 0)
            owners = self._partition_owners.get(topic.name)
            for partition, piece in partition_run(run, topic.partitions, default):
                owner = owners[partition] if owners is not None else None
                if owner is not None:
                    part = parts.get(owner)
                    if part is None or not (  # Part.accepts, inlined: once per run
                        part.producer == producer
                        and (not producer or sequence >= part.next_sequence)
                    ):
                        if part is not None:
                            owner.append_part(part)  # parts of one owner stay in order
                        part = parts[owner] = Part(stamp, ticket, acks, producer)
                        if ticket is not None:
                            ticket.remaining += 1
                    part.add(piece, index, sequence)
                else:
                    if ticket is not None:
                        ticket.remaining += 1
                    if self.forward is not None:
                        # The owner stamps ts_broker: a whole run goes as it arrived.
                        self.forward(
                            topic,
                            partition,
                            piece,
                            ticket,
                            acks,
                            index,
                            (producer, sequence) if producer else None,
                        )
                    elif ticket is not None:
                        ticket.failed(
                            f"worker {self.worker} does not own {topic.name}/{partition}",
                            ErrorCode.OWNER_UNAVAILABLE,
                            (index,),
                        )
                sequence += piece.count
        for owner, part in parts.items():
            owner.append_part(part)
        return ephemeral

    def now(self) -> int:
        """The broker time stamped on durable runs (``ts_broker``)."""
        return self._clock()

    @property
    def congested(self) -> bool:
        """Publishers should wait (``wait_for_room``) before reading more."""
        return (
            self.pending_bytes >= self.pending_limit or self.pending_runs >= self.pending_runs_limit
        )

    async def wait_for_room(self) -> None:
        """Wait until the queued durable bytes and runs fall under their bounds."""
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
