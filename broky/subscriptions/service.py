"""The durable subscriptions of one worker: attach, settle, credit, state.

One ``SubscriptionService`` per worker, beside its ``DurableStore``. It
holds a :class:`PartitionSubscriptions` (dispatchers, state store, driver
task) for every partition the worker owns, and the consumers attached
through this worker's connections. Connection tasks call it without
awaiting (``settle``, ``grant``, ``detach``); an attach runs as a task of
the service, because creating a subscription waits for its first commit
(the start position must be durable before ``Subscribed`` promises it).

What this worker serves: the partitions it owns. A client's ``Consume``
whose pattern reaches partitions other workers own is spread over those
owners by the connection (broky.durable.consumer_relays), which attaches
here with ``own_only`` for this worker's share, as each owner does for a
``Consume`` arriving over its owner channel; a ``Consume`` reaching other
workers' partitions without ``own_only`` (no channels to them) is refused
with ``SubscriptionRefused`` naming those workers.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from broky.client.credentials import ANONYMOUS, Credentials
from broky.durable.acks import AckTicket
from broky.durable.store import DurableStore
from broky.protocol.constants import DeletePhase, ErrorCode
from broky.protocol.frames import Consume, Settle
from broky.replication.gate import PartitionReplica
from broky.router.matcher import patterns_overlap
from broky.router.outbox import Outlet
from broky.storage.errors import StorageError
from broky.subscriptions.commits import all_committed
from broky.subscriptions.consumers import (
    ConsumerAnswers,
    ConsumerLink,
    Refused,
    SubscriptionCounters,
)
from broky.subscriptions.deadletters import DeadLetters
from broky.subscriptions.definition import Definition, DefinitionError
from broky.subscriptions.deletion import (
    Deletion,
    DeletionMarks,
    deletable,
    delete_subscription,
)
from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.model import Consumer, DeadLetter, SubscriptionBusy
from broky.subscriptions.partition import PartitionSubscriptions
from broky.subscriptions.replica import SubscriptionReplica
from broky.subscriptions.round_reads import KeptBudget
from broky.subscriptions.settling import apply_settle
from broky.subscriptions.watch import SubscriptionStatus, Watch

log = logging.getLogger("broky.subscriptions")

#: ``advise(kind, payload)``: publish a ``$SYS.events.<kind>`` advisory.
Advise = Callable[[str, dict[str, Any]], None]


class SubscriptionService:
    """See the module docstring."""

    def __init__(
        self,
        store: DurableStore,
        advise: Advise | None = None,
        credentials: Credentials = ANONYMOUS,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``credentials`` and ``ssl_context``: what this node presents to
        other nodes (its ``cluster_token``; ``Config.peer_client_context``)
        when it publishes a dead letter to their leaders."""
        self.store = store
        self.partitions: dict[tuple[str, int], PartitionSubscriptions] = {}
        self.consumers: dict[int, ConsumerLink] = {}
        self.dead_letters = DeadLetters(store, self, credentials, ssl_context)
        self.watch = Watch(self, advise)
        self._counters: dict[str, SubscriptionCounters] = {}
        self.deleting = DeletionMarks()
        self._next_consumer = 1
        self._attaching = trio.Lock()
        #: The bytes of read batches each partition keeps for parked messages.
        self.kept = KeptBudget()
        self._nursery: trio.Nursery | None = None

    # --- running ---------------------------------------------------------------------

    def _open(self) -> None:
        for owner in self.store.owners.values():
            partition = PartitionSubscriptions.open(self, owner)
            self.partitions[(owner.topic.name, owner.partition)] = partition
            owner.on_append = partition.appended

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load every owned partition's subscriptions, drive them until cancelled."""
        await trio.to_thread.run_sync(self._open)
        loaded = sorted({name for p in self.partitions.values() for name in p.dispatchers})
        if loaded:
            log.info("durable subscriptions loaded: %s", ", ".join(loaded))
        async with trio.open_nursery() as nursery:
            for partition in self.partitions.values():
                replica = partition.owner.replica
                if isinstance(replica, PartitionReplica):
                    # Served only while this node leads the partition.
                    role = partition.role = SubscriptionReplica(partition, replica)
                    partition.drop_all()
                    replica.subscriptions = role
                    if replica.leading is not None:
                        nursery.start_soon(role.lead, replica.leading.term.epoch)
            for partition in self.partitions.values():
                nursery.start_soon(partition.run)
            nursery.start_soon(self.watch.run)
            nursery.start_soon(self.dead_letters.leaders.run)
            self._nursery = nursery
            task_status.started()

    def start_soon(self, task: Callable[[], Awaitable[None]]) -> bool:
        """Run ``task`` beside the subscriptions until the service stops (a
        spread consumer's re-attach, broky.durable.consumer_relays); False
        when the service is not running."""
        if self._nursery is None:
            return False
        self._nursery.start_soon(task)
        return True

    def forget_counters(self, name: str) -> None:
        """``name`` was deleted: a subscription recreated under it counts from 0."""
        self._counters.pop(name, None)

    def counters(self, name: str) -> SubscriptionCounters:
        counters = self._counters.get(name)
        if counters is None:
            counters = self._counters[name] = SubscriptionCounters()
        return counters

    # --- consumers (called by connections, never waiting) ----------------------------

    def consume(
        self,
        frame: Consume,
        outlet: Outlet,
        *,
        own_only: bool = False,
        answers: ConsumerAnswers | None = None,
    ) -> ConsumerLink:
        """Start attaching a consumer for ``frame``; its ``Subscribed`` or
        stream error follows on ``outlet`` (or to ``answers``). ``own_only``:
        attach to the partitions this worker owns and ignore the others
        (another worker serves them: a part of a spread consumer)."""
        consumer_id = self._next_consumer
        self._next_consumer += 1
        state = Consumer(
            consumer_id, frame.priority, frame.credit, frame.max_in_flight, 0, trio.current_time()
        )
        link = ConsumerLink(
            consumer_id, frame.stream, frame.subscription, outlet, state, answers=answers
        )
        if self._nursery is None:
            link.closed = True
            link.error(ErrorCode.SERVER_SHUTDOWN, "the broker is not serving subscriptions")
            return link
        self._nursery.start_soon(self._attach, frame, link, own_only)
        return link

    async def _attach(self, frame: Consume, link: ConsumerLink, own_only: bool) -> None:
        try:
            async with self._attaching:
                try:
                    await self._attach_now(frame, link, own_only)
                except (StorageError, OSError) as exc:
                    log.error("subscription %r: attach failed: %s", frame.subscription, exc)
                    raise Refused(
                        ErrorCode.STORAGE_FAILURE,
                        f"subscription {frame.subscription!r}: the broker could not read or "
                        f"write its state ({exc}); retry later",
                    ) from exc
        except Refused as refused:
            link.closed = True
            link.error(refused.code, str(refused))
            return
        if not link.closed:  # else closed (Unsubscribe, disconnect) while attaching
            link.subscribed()

    def delete(
        self,
        name: str,
        pattern: bytes,
        force: bool,
        done: Callable[[Deletion | Refused], None],
        phase: DeletePhase = DeletePhase.WHOLE,
    ) -> None:
        """Start deleting ``name`` from this worker's partitions, or one
        phase of it (broky.subscriptions.deletion); ``done`` gets what was
        (or, prepared, will be) deleted once it is committed, or why not.
        An abort drops the mark at once and answers ``Deletion(0, 0)``."""
        if phase is DeletePhase.ABORT:
            self.deleting.unmark(name)
            done(Deletion(0, 0))
            return
        if self._nursery is None:
            done(Refused(ErrorCode.SERVER_SHUTDOWN, "the broker is not serving subscriptions"))
            return
        self._nursery.start_soon(self._delete, name, pattern, force, phase, done, self._nursery)

    async def _delete(
        self,
        name: str,
        pattern: bytes,
        force: bool,
        phase: DeletePhase,
        done: Callable[[Deletion | Refused], None],
        nursery: trio.Nursery,
    ) -> None:
        try:
            async with self._attaching:
                if phase is DeletePhase.PREPARE:
                    partitions, links = deletable(self, name, pattern, force)
                    self.deleting.mark(name, nursery)
                    done(Deletion(len(partitions), len(links)))
                    return
                if phase is DeletePhase.COMMIT:
                    self.deleting.unmark(name)
                deletion = await delete_subscription(self, name, pattern, force)
        except Refused as refused:
            done(refused)
            return
        if deletion.partitions:
            log.info(
                "subscription %r deleted from %d partition(s), %d consumer(s) ended",
                name,
                deletion.partitions,
                deletion.consumers,
            )
            self.watch.deleted(name, deletion.partitions, deletion.consumers)
        done(deletion)

    def _partitions_for(self, pattern: bytes) -> list[tuple[str, int]]:
        return [
            (topic.name, partition)
            for topic in self.store.policies.policies
            if patterns_overlap(topic.pattern, pattern)
            for partition in range(topic.partitions)
        ]

    async def _attach_now(self, frame: Consume, link: ConsumerLink, own_only: bool) -> None:
        name = frame.subscription
        self.deleting.refuse_attach(name)
        try:
            definition = Definition.from_consume(frame)
        except DefinitionError as exc:
            raise Refused(ErrorCode.SUBSCRIPTION_REFUSED, f"subscription {name!r}: {exc}") from exc
        self._check_dead_letter_topic(definition)
        wanted = self._partitions_for(frame.pattern)
        if not wanted:
            raise Refused(
                ErrorCode.SUBSCRIPTION_REFUSED,
                f"subscription {name!r}: pattern {frame.pattern.decode(errors='replace')!r} "
                "matches no durable topic",
            )
        worker = self.store.worker
        if own_only:
            wanted = [key for key in wanted if self.store.owner_index(*key) == worker]
        remote = sorted({self.store.owner_index(topic, p) for topic, p in wanted} - {worker})
        if remote:
            raise Refused(
                ErrorCode.SUBSCRIPTION_REFUSED,
                f"subscription {name!r}: its partitions are owned by workers "
                f"{', '.join(map(str, [self.store.worker, *remote]))} and this connection "
                f"reached worker {self.store.worker}; a consumer must reach every owner "
                "(run with --workers 1, or connect to each owner's port)",
            )
        partitions = [self.partitions[key] for key in wanted]
        served = [partition for partition in partitions if partition.serving]
        if not served:
            # A replicated topic: its subscriptions are served by the leaders.
            raise Refused(
                ErrorCode.NOT_LEADER,
                f"subscription {name!r}: "
                + "; ".join(p.role.refusal() for p in partitions if p.role is not None),
            )
        partitions = served
        for partition in partitions:
            existing = partition.definitions.get(name)
            mismatch = existing.mismatch(frame) if existing is not None else None
            if mismatch is not None:
                raise Refused(ErrorCode.SUBSCRIPTION_REFUSED, mismatch)
        await self._create_missing(definition, partitions)
        if link.closed:
            return  # the connection went away meanwhile
        now = trio.current_time()
        state = link.state
        state.last_progress = now
        attached: list[PartitionSubscriptions] = []
        try:
            for partition in partitions:
                partition.dispatchers[name].attach(
                    link.id,
                    now,
                    credit=state.credit,
                    max_in_flight=state.max_in_flight,
                    state=state,
                )
                attached.append(partition)
        except SubscriptionBusy as exc:
            for partition in attached:
                partition.dispatchers[name].detach(link.id, now)
            raise Refused(ErrorCode.SUBSCRIPTION_REFUSED, f"subscription {name!r}: {exc}") from exc
        link.partitions = [(p.topic, p.partition) for p in partitions]
        self.consumers[link.id] = link
        for partition in partitions:
            partition.changed(name)

    def _check_dead_letter_topic(self, definition: Definition) -> None:
        """Refuse a dead-letter topic that is not a durable topic, or that the
        subscription reads (its dead letters would come back to it)."""
        chosen = definition.dead_letter_topic
        if not chosen:
            return
        policies = self.store.policies
        topic = policies.named(chosen)
        name = definition.name
        if topic is None:
            known = ", ".join(sorted(policy.name for policy in policies.policies))
            raise Refused(
                ErrorCode.SUBSCRIPTION_REFUSED,
                f"subscription {name!r}: dead-letter topic {chosen!r} is not a durable topic "
                f"of this broker (its durable topics: {known})",
            )
        if patterns_overlap(topic.pattern, definition.pattern):
            raise Refused(
                ErrorCode.SUBSCRIPTION_REFUSED,
                f"subscription {name!r}: dead-letter topic {chosen!r} is read by the "
                f"subscription's own pattern {definition.pattern.decode(errors='replace')!r}: "
                "its dead letters would be delivered to it again",
            )

    async def _create_missing(
        self, definition: Definition, partitions: list[PartitionSubscriptions]
    ) -> None:
        """Create the subscription where it does not exist yet, and wait
        until its definition and start position are committed."""
        new = [p for p in partitions if definition.name not in p.dispatchers]
        if not new:
            return
        cursors: dict[int, int] = {}

        async def ask(index: int, partition: PartitionSubscriptions) -> None:
            cursors[index] = await partition.owner.call(partition.start_position(definition))

        # A start by time asks each owner's thread (its time index), all at
        # once: the answers then take one hand-off's time, not one each.
        async with trio.open_nursery() as nursery:
            for index, partition in enumerate(new):
                cursor = partition.start_position_now(definition)
                if cursor is None:
                    nursery.start_soon(ask, index, partition)
                else:
                    cursors[index] = cursor
        # Created after every answer came, with no await between: a failed
        # answer leaves none of them half-created.
        for index, partition in enumerate(new):
            if definition.name not in partition.dispatchers:
                partition.create(definition, cursors[index])
        await all_committed([partition.committer for partition in new])
        log.info(
            "subscription %r created on %d partition(s) (%s, start %s)",
            definition.name,
            len(new),
            definition.options.type.value,
            definition.start.name.lower(),
        )

    def _dispatchers(self, link: ConsumerLink) -> list[tuple[PartitionSubscriptions, Dispatcher]]:
        found = []
        for key in link.partitions:
            partition = self.partitions.get(key)
            if partition is not None and link.subscription in partition.dispatchers:
                found.append((partition, partition.dispatchers[link.subscription]))
        return found

    def detach(self, link: ConsumerLink) -> None:
        """The consumer closed or its connection ended: what it holds is due now."""
        link.closed = True
        if self.consumers.pop(link.id, None) is None:
            return
        now = trio.current_time()
        for partition, dispatcher in self._dispatchers(link):
            dispatcher.detach(link.id, now)
            partition.changed(link.subscription)

    def evict(self, consumer: int, ack_timeout: float) -> None:
        """A dispatcher evicted ``consumer`` (no progress for twice the ack timeout)."""
        link = self.consumers.get(consumer)
        if link is None:
            return
        self.detach(link)
        self.counters(link.subscription).evicted += 1
        message = (
            f"consumer of {link.subscription!r} evicted: it held messages and made no "
            f"progress for {2 * ack_timeout:g} s (twice the ack timeout)"
        )
        link.error(ErrorCode.SLOW_CONSUMER, message)
        self.watch.evicted(link, message)

    def grant(self, link: ConsumerLink, credit: int) -> None:
        """``Flow`` on the consumer's stream: more credit, for every partition."""
        link.state.credit += credit
        self.pump(link)

    def pump(self, link: ConsumerLink) -> None:
        """Let every dispatcher of ``link`` deliver what its credit now allows."""
        now = trio.current_time()
        for partition, dispatcher in self._dispatchers(link):
            dispatcher.pump(now)
            partition.wake()

    def settle(self, link: ConsumerLink, frame: Settle) -> None:
        """Apply a Settle; a ``Settled`` follows once it is committed if asked
        (broky.subscriptions.settling)."""
        apply_settle(self, link, frame)

    # --- dead letters and figures --------------------------------------------------------

    def dead_lettered(
        self,
        partition: PartitionSubscriptions,
        name: str,
        event: DeadLetter,
        ticket: AckTicket,
    ) -> None:
        """``event``'s message is durably in the dead-letter topic."""
        self.counters(name).dead_lettered += 1
        self.watch.dead_lettered(partition, name, event, ticket)

    def statistics(self) -> list[SubscriptionStatus]:
        """One status per subscription this worker serves (for listings and metrics)."""
        return self.watch.statuses()
