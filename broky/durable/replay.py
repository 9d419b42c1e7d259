"""Replay: a subscription that starts in the past and continues live.

The seam, without gap or duplicate: the subscription is registered with the
router *before* the first log read, holding its live runs
(``Subscription.holding``). The replay reads every partition from its start
position to the end the log had at that read, through the partition's owner
(so reads and appends never race). Runs appended after a read are fanned out
after it, so they are held; runs appended before it are read. At the switch
(synchronous, on the trio thread) held durable runs below the replay's
position in their partition are duplicates and are skipped (or sliced);
the rest are queued in order, and the subscription goes live. If held runs
had to be discarded (the bound), the replay reads the log again first.

The replay never overfills the outbox: it waits while the subscription holds
more than half its bound, so a slow subscriber slows its own replay, never
the router.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Final

import trio

from broky.durable.owner import PartitionOwner, located_chunk
from broky.durable.store import DurableStore
from broky.protocol.codec import split_run_chunk
from broky.protocol.constants import StartKind
from broky.protocol.frames import EncodedRun
from broky.router.durable_runs import DurableEncodedRun
from broky.router.matcher import SubscriptionIndex, patterns_overlap
from broky.router.outbox import Subscription
from broky.storage.batch import StoredBatch
from broky.storage.errors import StorageError
from broky.storage.log import PartitionLog

log = logging.getLogger("broky.durable")

#: Bytes of stored batches one replay read asks for: a quarter of the
#: default outbox, so a read always fits beside what is queued.
REPLAY_READ_BYTES: Final = 1024 * 1024
#: A replay waiting for outbox room wakes on each drain, and at least this
#: often (the subscription may have been closed meanwhile).
ROOM_RECHECK_SECONDS: Final = 0.5


class Replay:
    """Bring one subscription from its start position to live (see module docstring)."""

    def __init__(
        self,
        store: DurableStore,
        subscription: Subscription,
        start: StartKind,
        start_time: int,
        start_offsets: tuple[int, ...],
    ) -> None:
        self._store = store
        self._subscription = subscription
        self._start = start
        self._start_time = start_time
        self._start_offsets = start_offsets
        matcher: SubscriptionIndex[int] = SubscriptionIndex()
        matcher.add(subscription.pattern, 0)
        self._matcher = matcher
        self.positions: dict[PartitionOwner, int] = {}
        subscription.holding = []

    def _wanted(self, key: bytes) -> bool:
        return bool(self._matcher.match(key))

    def _first_position(self, owner: PartitionOwner, partition_log: PartitionLog) -> int:
        start = self._start
        if start is StartKind.EARLIEST:
            return partition_log.start_offset
        if start is StartKind.TIME:
            return min(partition_log.offset_for_time(self._start_time), owner.readable_end)
        if start is StartKind.OFFSET:
            offsets = self._start_offsets
            wanted = offsets[owner.partition] if owner.partition < len(offsets) else 0
            return min(max(wanted, partition_log.start_offset), owner.readable_end)
        return owner.readable_end

    async def run(self) -> None:
        """Replay, then switch to live; a closed subscription just stops."""
        subscription = self._subscription
        try:
            pattern = subscription.pattern
            for owner in self._store.topics():
                if not patterns_overlap(owner.topic.pattern, pattern):
                    continue  # none of this topic's keys can match
                if self._start is StartKind.LAST:
                    batches, end = await owner.call(self._read_last)
                    self._push(owner, batches)
                    self.positions[owner] = end
                else:
                    self.positions[owner] = await owner.call(partial(self._first_position, owner))
            while not subscription.closed:
                discards = subscription.holding_discards
                for owner in self.positions:
                    await self._catch_up(owner)
                if subscription.holding_discards == discards:
                    break
        except StorageError as exc:
            log.error("replay of stream %d stopped: %s", subscription.stream, exc)
        self._go_live()

    def _read_last(self, partition_log: PartitionLog) -> tuple[list[StoredBatch], int]:
        return partition_log.read_last(self._wanted), partition_log.end_offset

    async def _catch_up(self, owner: PartitionOwner) -> None:
        subscription = self._subscription
        while not subscription.closed:
            await self._wait_for_room()
            batches, end = await owner.call(
                partial(
                    _read,
                    self.positions[owner],
                    min(REPLAY_READ_BYTES, subscription.max_bytes // 4),
                    owner.readable_end,
                )
            )
            self._push(owner, batches)
            if batches:
                self.positions[owner] = batches[-1].next_offset
            if self.positions[owner] >= end or not batches:
                return

    async def _wait_for_room(self) -> None:
        """Wait until the outbox is at most half full (the writer drains it)."""
        subscription = self._subscription
        while (
            subscription.pending_bytes * 2 > subscription.max_bytes
            or subscription.pending_messages * 2 > subscription.max_messages
        ) and not subscription.closed:
            drained = trio.Event()
            subscription.drained = drained.set
            with trio.move_on_after(ROOM_RECHECK_SECONDS):
                await drained.wait()
            subscription.drained = None

    def _push(self, owner: PartitionOwner, batches: list[StoredBatch]) -> None:
        subscription = self._subscription
        for batch in batches:
            if not self._wanted(batch.key):
                continue
            run = batch.run
            chunk = located_chunk(run, owner.partition, batch.base_offset)
            queue_live(
                subscription, DurableEncodedRun(run.key, run.count, chunk, owner, batch.base_offset)
            )

    def _go_live(self) -> None:
        """The seam: queue held runs not already replayed, then go live."""
        subscription = self._subscription
        held = subscription.holding or []
        subscription.holding = None
        subscription.holding_bytes = 0
        if subscription.closed:
            return
        for run in held:
            if isinstance(run, DurableEncodedRun) and isinstance(run.log, PartitionOwner):
                position = self.positions.get(run.log, 0)
                if run.base_offset + run.count <= position:
                    continue  # replayed already
                fresh = run
                if run.base_offset < position:
                    _, tail = split_run_chunk(run.chunk, position - run.base_offset)
                    fresh = DurableEncodedRun(
                        run.key, run.base_offset + run.count - position, tail, run.log, position
                    )
                self.positions[run.log] = run.base_offset + run.count
                subscription.push(fresh)
            else:
                subscription.push(run)


def _read(
    position: int, budget: int, stop: int, partition_log: PartitionLog
) -> tuple[list[StoredBatch], int]:
    """A replay read (in the owner's thread): batches from ``position`` up to
    ``stop`` (the owner's ``readable_end``), and where reading ends."""
    start = max(position, partition_log.start_offset)
    stop = min(stop, partition_log.end_offset)
    return partition_log.read(start, budget, stop_offset=stop), stop


def queue_live(subscription: Subscription, run: EncodedRun) -> None:
    """Queue a replayed run past the holding area (nothing once the
    subscription is closed: its outbox was freed and must stay empty)."""
    if subscription.closed:
        return
    holding = subscription.holding
    subscription.holding = None
    try:
        subscription.push(run)
    finally:
        subscription.holding = holding
