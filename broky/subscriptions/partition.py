"""The durable subscriptions of one partition, driven by one task.

Ownership: the worker that owns a partition log owns its subscriptions'
dispatchers (one per subscription), their state store (a sqlite file in the
partition's directory, under the partition's lock, so the state moves with
the log when ``--workers`` changes) and the task that drives them. Every
change to a dispatcher happens on the trio thread without an await inside
(attach, settle, credit: called by connection tasks; feeding and timers: by
this task), so "choose a consumer, record it pending" stays one step.

One round of the task:

1. ``tick`` every dispatcher (ack deadlines, evictions, due redeliveries);
2. read what the dispatchers ``want`` from the log, in one request to the
   partition's owner (one thread hop), and ``feed`` it; offsets whose key is
   outside a subscription's pattern are ``skip``ped (acked without delivery);
3. take the dispatchers' events: deliveries are read from the batches in
   hand (or, for redeliveries, from the log in a second request) and queued
   to each consumer's connection in decision order; dead letters are
   appended to the dead-letter topic; evictions close the consumer;
4. hand changed dispatchers to the group committer.

The task wakes on an append to the partition (``appended``), a change from
a connection (``wake``), a commit (whose gates may release deliveries) or
the earliest dispatcher timer.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import trio

from broky.durable.owner import PartitionOwner
from broky.protocol.constants import StartKind
from broky.router.matcher import SubscriptionIndex
from broky.security.acl import covers
from broky.storage.batch_reading import BatchSpan
from broky.storage.errors import StorageError
from broky.storage.log import PartitionLog
from broky.storage.state import StateStore
from broky.subscriptions.commits import GroupCommitter
from broky.subscriptions.definition import Definition, DefinitionError
from broky.subscriptions.delivery import BatchCache, segment_frames
from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.feeding import feed_batches
from broky.subscriptions.model import DeadLetter, Deliver, Evict
from broky.subscriptions.round_events import event_bounds, needed_spans, sort_segments
from broky.subscriptions.round_reads import READ_GAP, read_new, read_ranges
from broky.subscriptions.slots import NOBODY
from broky.subscriptions.tracker import SubscriptionImage

if TYPE_CHECKING:
    from broky.subscriptions.replica import SubscriptionReplica
    from broky.subscriptions.service import SubscriptionService

log = logging.getLogger("broky.subscriptions")

#: The state store's file name inside the partition's directory.
STATE_FILE: Final = "subscriptions.sqlite"


class PartitionSubscriptions:
    """See the module docstring."""

    def __init__(
        self,
        service: SubscriptionService,
        owner: PartitionOwner,
        store: StateStore,
    ) -> None:
        self.service = service
        self.owner = owner
        self.topic = owner.topic.name
        self.partition = owner.partition
        self.committer = GroupCommitter(store)
        self.committer.on_commit = self.wake
        self.dispatchers: dict[str, Dispatcher] = {}
        self.definitions: dict[str, Definition] = {}
        #: Each subscription's key filter; None when its pattern covers the
        #: topic's (``add``): it takes every key stored here.
        self._filters: dict[str, SubscriptionIndex[int] | None] = {}
        self._wake = trio.Event()
        #: The time the last round ticked the dispatchers at.
        self._ticked_at = float("-inf")
        #: Offsets whose dead-letter append failed, retried next round.
        self.dead_letter_retry: list[tuple[str, DeadLetter]] = []
        #: A replicated partition's role (None: not replicated, always serving).
        self.role: SubscriptionReplica | None = None
        #: Bumped when every dispatcher is dropped: a round that awaited
        #: across it stops (its dispatchers are gone).
        self.generation = 0
        #: The batches the rounds read, kept while messages wait (within
        #: the service's ``KeptBudget``), read when the log's ``rewrites``
        #: count was this.
        self._kept = BatchCache()
        self._kept_rewrites = owner.rewrites

    @classmethod
    def open(cls, service: SubscriptionService, owner: PartitionOwner) -> PartitionSubscriptions:
        """Open the partition's state store and load its subscriptions
        (blocking: call in a thread, before serving)."""
        directory = os.path.join(service.store.data_dir, owner.topic.name, str(owner.partition))
        store = StateStore.open(os.path.join(directory, STATE_FILE))
        partition = cls(service, owner, store)
        images = partition.committer.load()
        for name, text in partition.committer.load_definitions().items():
            try:
                definition = Definition.from_json(text)
            except DefinitionError as exc:
                raise StorageError(
                    f"{directory}/{STATE_FILE}: subscription {name!r}: {exc}"
                ) from exc
            image = images.get((name, partition.topic, partition.partition))
            if image is None:
                continue  # written together; a definition alone was never committed
            partition.add(definition, image)
        return partition

    # --- subscriptions ----------------------------------------------------------

    def add(self, definition: Definition, image: SubscriptionImage) -> Dispatcher:
        """Serve ``definition`` here from ``image`` (a loaded or a new one)."""
        owner = self.owner
        dispatcher = Dispatcher(definition.options, image, owner.readable_end, owner.partition)
        name = definition.name
        self.dispatchers[name] = dispatcher
        self.definitions[name] = definition
        matcher: SubscriptionIndex[int] | None = None
        # The store routes a key to the topic whose pattern matches it, so
        # a subscription whose pattern covers the topic's takes every key
        # read here: no filter, and a read is fed without a look at its
        # keys (with keys that change on every message, one match call a
        # message was ~3 % of a key-shared broker's CPU).
        if not covers(definition.pattern, owner.topic.pattern):
            matcher = SubscriptionIndex()
            matcher.add(definition.pattern, 0)
        self._filters[name] = matcher
        return dispatcher

    @property
    def serving(self) -> bool:
        """Consumers may attach here (False: a replicated partition this
        node does not lead)."""
        return self.role is None or self.role.serving

    def drop_all(self) -> None:
        """Forget every subscription in memory (a replicated partition this
        node stopped leading: broky.subscriptions.replica); the state store
        keeps them, and uncommitted changes are not written any more."""
        self.generation += 1
        self._drop_kept()
        self.dispatchers.clear()
        self.definitions.clear()
        self._filters.clear()
        self.dead_letter_retry.clear()
        self.committer.discard_changes()

    def create(self, definition: Definition, cursor: int) -> Dispatcher:
        """A new subscription starting at ``cursor``: its definition and
        first image are written by the next group commit."""
        dispatcher = self.add(definition, SubscriptionImage(cursor, limit=cursor))
        self.committer.define(definition.name, definition.to_json())
        self.changed(definition.name)
        return dispatcher

    def remove(self, name: str) -> None:
        """Stop serving ``name`` here and delete its state with the next
        group commit (``committer.after_commit`` tells when that is durable).
        Its consumers must be detached first. A round in progress drops
        what it read for it (``_round`` checks the dispatcher it started with)."""
        self.dispatchers.pop(name, None)
        self.definitions.pop(name, None)
        self._filters.pop(name, None)
        self.dead_letter_retry = [entry for entry in self.dead_letter_retry if entry[0] != name]
        self.committer.forget(name)
        self.wake()

    def start_position(self, definition: Definition) -> Callable[[PartitionLog], int]:
        """Where ``definition`` starts in this partition (run by the owner)."""

        def position(partition_log: PartitionLog) -> int:
            if definition.start is StartKind.TIME:
                return partition_log.offset_for_time(definition.start_time)
            return self._bounded_start(
                definition, partition_log.start_offset, partition_log.end_offset
            )

        return position

    def start_position_now(self, definition: Definition) -> int | None:
        """Where ``definition`` starts, from the log's offsets as its owner
        last copied them (``PartitionOwner.refresh``), with no hand-off to
        the owner's thread; None for a start by time (the owner reads the
        log's time index). A hand-off waits for the owner's round, which
        may be an fsync (~10 ms here), for every partition of a
        subscription's first attach."""
        if definition.start is StartKind.TIME:
            return None
        return self._bounded_start(definition, self.owner.start_offset, self.owner.end_offset)

    def _bounded_start(self, definition: Definition, start: int, end: int) -> int:
        kind = definition.start
        if kind is StartKind.EARLIEST:
            return start
        if kind is StartKind.OFFSET:
            offsets = definition.start_offsets
            wanted = offsets[self.partition] if self.partition < len(offsets) else start
            return min(max(wanted, start), end)
        return end

    def changed(self, name: str, acks: int = 0, *, hurry: bool = False) -> None:
        """``name``'s dispatcher changed: commit it (at once with ``hurry``:
        ``GroupCommitter.changed``) and let the task look."""
        self._commit_soon(name, acks, hurry=hurry)
        self.wake()

    def _commit_soon(self, name: str, acks: int = 0, *, hurry: bool = False) -> None:
        """Hand ``name``'s dispatcher to the committer without waking the
        task: the task's own rounds use this, else a dispatcher that stays
        dirty while its commit is in flight would wake it again at once."""
        dispatcher = self.dispatchers.get(name)
        if dispatcher is not None:
            self.committer.changed(
                (name, self.topic, self.partition), dispatcher, acks, hurry=hurry
            )

    def wake(self) -> None:
        self._wake.set()

    def appended(self, end_offset: int) -> None:
        """The partition's log grew to ``end_offset`` (its durability point).
        Without subscriptions nothing here reads the log, so the task is
        not woken: a round per append of every durable partition would be
        a task switch and an empty round per publish round (a subscription
        created later starts from the owner's ``readable_end``)."""
        if not self.dispatchers:
            return
        for dispatcher in self.dispatchers.values():
            dispatcher.end_offset = max(dispatcher.end_offset, end_offset)
        self._wake.set()

    # --- the task ------------------------------------------------------------------------

    async def run(self) -> None:
        """Drive the dispatchers until cancelled (then commit what is pending
        and close the state store)."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.committer.run)
                while True:
                    await self._wait()
                    try:
                        await self._round()
                    except (StorageError, OSError) as exc:
                        # The log could not be read: deliveries and dead
                        # letters decided wait for the next round.
                        log.error("subscriptions of %s/%d: %s", self.topic, self.partition, exc)
                        await trio.sleep(0.5)
        finally:
            self.committer.close()

    async def _wait(self) -> None:
        """Until woken, or the earliest timer the last round did not see
        due. A timer due by then was handled by it; if it is still pending (a
        redelivery for a consumer without room), only an event can change
        that, so it must not make this loop spin."""
        ticked = self._ticked_at
        wakes = [
            wake
            for dispatcher in self.dispatchers.values()
            if (wake := dispatcher.next_wake()) is not None and wake > ticked
        ]
        if self.dead_letter_retry:
            wakes.append(trio.current_time() + 1.0)
        deadline = min(wakes) if wakes else float("inf")
        with trio.move_on_at(deadline):
            await self._wake.wait()
        self._wake = trio.Event()

    def _kept_valid(self, rewrites: int) -> bool:
        """Whether the kept batches were read at the log's ``rewrites``
        count; if not, the log's tail was cut since (those offsets may hold
        other bytes now) and they are dropped."""
        if rewrites == self._kept_rewrites:
            return True
        self._drop_kept()
        self._kept_rewrites = rewrites
        return False

    def _drop_kept(self) -> None:
        self.service.kept.hold((self.topic, self.partition), self._kept.keep_from(None, 0))

    async def _round(self) -> None:
        now = self._ticked_at = trio.current_time()
        for name, dispatcher in self.dispatchers.items():
            dispatcher.tick(now)
            if dispatcher.tracker.dirty:
                self._commit_soon(name)
        cache = self._kept
        self._kept_valid(self.owner.rewrites)
        serving = dict(self.dispatchers)
        wanted = {
            name: (dispatcher.tracker.read_position, count)
            for name, dispatcher in serving.items()
            if (count := dispatcher.wants()) > 0
        }
        progressed = False
        generation = self.generation
        if wanted:
            rewrites, reads = await self.owner.call(
                lambda log: (log.rewrites, read_new(log, wanted))
            )
            if generation != self.generation:
                return
            self._kept_valid(rewrites)
            now = trio.current_time()
            for name, (log_start, batches) in reads.items():
                if self.dispatchers.get(name) is not serving[name]:
                    continue  # deleted (maybe recreated) while the log was read
                cache.add(batches)
                before = self.dispatchers[name].tracker.read_position
                self._feed(name, log_start, wanted[name][1], batches, now)
                progressed |= self.dispatchers[name].tracker.read_position > before
        events = {name: d.events for name, d in self.dispatchers.items() if d.events}
        for dispatcher in self.dispatchers.values():
            dispatcher.events = []
        retry, self.dead_letter_retry = self.dead_letter_retry, []
        # The usual round's deliveries all lie in batches it read: two bounds
        # show it, with no span listed per event (one a message or two).
        bounds = event_bounds(events.values())
        if not retry and (bounds is None or cache.holds(*bounds)):
            missing = []
        else:
            needed = needed_spans(events.values())
            needed.extend((event.offset, event.offset + 1) for _, event in retry)
            missing = cache.missing(needed, READ_GAP)
        if missing:
            try:
                rewrites, spans = await self.owner.call(
                    lambda log: (log.rewrites, read_ranges(log, missing))
                )
                if not self._kept_valid(rewrites):
                    # Cut since this round's reads: decide on fresh reads.
                    raise StorageError("the log's tail was cut while it was read")
                cache.add(spans)
            except (StorageError, OSError):
                # Nothing was carried out: the events wait for the next round.
                for name, taken in events.items():
                    self.dispatchers[name].events[:0] = taken
                self.dead_letter_retry[:0] = retry
                raise
            if generation != self.generation:
                return
        for name, batch in events.items():
            if self.dispatchers.get(name) is serving.get(name):
                self._carry_out(name, batch, cache)
        for name, event in retry:
            if name in self.dispatchers:
                self.service.dead_letters.send(self, name, event, cache)
        for name, dispatcher in self.dispatchers.items():
            if dispatcher.tracker.dirty:
                self._commit_soon(name)
        waiting = [
            low for d in self.dispatchers.values() if (low := d.lowest_waiting()) is not None
        ]
        key, budget = (self.topic, self.partition), self.service.kept
        budget.hold(key, cache.keep_from(min(waiting, default=None), budget.allowance(key)))
        if progressed:
            self.wake()  # a read stops at READ_BYTES: there may be more to read

    def _feed(
        self, name: str, log_start: int, count: int, batches: list[BatchSpan], now: float
    ) -> None:
        dispatcher = self.dispatchers[name]
        matcher = self._filters[name]
        position = dispatcher.tracker.read_position
        gap = range(position, min(log_start, position + count))
        if gap:
            # Removed by retention before this subscription read them.
            for skipped in gap:
                dispatcher.skip(skipped)
            self.service.counters(name).lost_to_retention += len(gap)
        feed_batches(dispatcher, matcher, batches, now)

    def _carry_out(
        self, name: str, events: list[Deliver | DeadLetter | Evict], cache: BatchCache
    ) -> None:
        """Send deliveries (per consumer, in decision order), dead letters, evictions."""
        service = self.service
        # One pass cuts each delivery along the held spans as it sorts it
        # (compiled: a key-shared round has one a message or two).
        per_consumer, delivered, redelivered, others = sort_segments(events, *cache.bounds())
        per_link = [
            (consumer, cache.spans_of(segments), lost)
            for consumer, (segments, lost) in per_consumer.items()
        ]
        for event in others:
            if isinstance(event, DeadLetter):
                service.dead_letters.send(self, name, event, cache)
            else:
                service.evict(event.consumer, self.dispatchers[name].options.ack_timeout)
        counters = service.counters(name)
        counters.delivered += delivered
        counters.redelivered += redelivered
        for consumer, segments, lost in per_link:
            link = service.consumers.get(consumer)
            if link is None:
                continue  # gone meanwhile: its detach released these
            frames = segment_frames(
                link.stream,
                self.topic,
                self.partition,
                segments,
                cache,
                link.max_frame_bytes,
                name_topic=link.named_topic != self.topic,
            )
            if frames:
                # Sent at once (no await in between): no other driver's
                # frames can come between the naming and these Delivers.
                link.named_topic = self.topic
            link.send(frames)
            if lost:
                self.trimmed(name, lost)

    def trimmed(self, name: str, offsets: list[int]) -> None:
        """``offsets`` are gone from the log (retention) before they were
        acked: there is nothing left to deliver, so they count as acked."""
        log.warning(
            "subscription %r: %d message(s) of %s/%d were removed by retention before "
            "they were acked",
            name,
            len(offsets),
            self.topic,
            self.partition,
        )
        dispatcher = self.dispatchers[name]
        dispatcher.ack(NOBODY, offsets, trio.current_time())
        self.service.counters(name).lost_to_retention += len(offsets)
        self.changed(name, len(offsets))

    def backlog(self, name: str) -> int:
        """Messages of ``name`` not acked yet, up to the log's end."""
        dispatcher = self.dispatchers[name]
        return dispatcher.tracker.unacked_below(max(dispatcher.end_offset, self.owner.end_offset))
