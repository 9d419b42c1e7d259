"""Dead letters: a message that spent ``max_deliveries`` (or was termed)
goes to its subscription's dead-letter topic, then is acked where it was.

The order is what makes it safe: the copy is appended to the durable topic
the subscription chose at creation (``Consume.dead_letter_topic``, under a
key its pattern matches, ``Definition.dead_letter_key``), else the one that
holds ``_dlq.<subscription>.<topic>`` (a configured one, else the built-in
``_dlq`` topic), through the ordinary durable publish path, and
only once that append reached its durability point is the original acked
(by the next group commit). A crash in between leaves the original unacked:
it is dead-lettered again after the restart, so the dead-letter topic is
at-least-once and its tags (topic, partition, offset) are the key to
de-duplicate on. An append that fails is retried by the partition's next
rounds; the original stays unacked meanwhile. In a replicated cluster an
append refused with ``NotLeader`` (another node leads the dead-letter
partition) is published to that leader instead
(broky.subscriptions.leader_deadletters), and the original is acked once
the leader acked the copy.
"""

from __future__ import annotations

import logging
import ssl
from collections import deque
from typing import TYPE_CHECKING

import trio

from broky.client.cluster import leader_address
from broky.client.credentials import Credentials
from broky.durable.acks import AckQueue, AckTicket
from broky.durable.store import DurableStore
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import Run
from broky.protocol.message import decode_run
from broky.subscriptions.delivery import BatchCache, dead_letter_run
from broky.subscriptions.dispatch import Dispatcher
from broky.subscriptions.leader_deadletters import LeaderDeadLetters
from broky.subscriptions.model import DeadLetter

if TYPE_CHECKING:
    from broky.subscriptions.partition import PartitionSubscriptions
    from broky.subscriptions.service import SubscriptionService

log = logging.getLogger("broky.subscriptions")

#: The tags a dead letter carries besides the message's own.
TAG_TOPIC = "dlq.topic"
TAG_PARTITION = "dlq.partition"
TAG_OFFSET = "dlq.offset"
TAG_SUBSCRIPTION = "dlq.subscription"
TAG_DELIVERIES = "dlq.deliveries"
TAG_ERROR = "dlq.error"


class _Appends(AckQueue):
    """The dead-letter appends in flight: an ack queue whose "acks" go back
    to the dead-letter machinery instead of to a connection, in any order."""

    def __init__(self, finished: DeadLetters) -> None:  # no outlet: nothing is sent
        self._finished = finished
        self._open: deque[AckTicket] = deque()
        self._sequence = 0

    def open(self, stream: int, producer: int = 0, first_sequence: int = 0) -> AckTicket:
        """A ticket for one dead-letter append: the broker's own, never an
        idempotent producer's (``producer`` stays 0: nothing to resend)."""
        assert not producer, "dead letters have no producer id"
        self._sequence += 1
        ticket = AckTicket(stream, self._sequence, first_sequence=first_sequence)
        self._open.append(ticket)
        return ticket

    def release(self) -> None:
        still: deque[AckTicket] = deque()
        for ticket in self._open:
            if ticket.remaining > 0:
                still.append(ticket)
            else:
                self._finished.appended(ticket)
        self._open = still


class DeadLetters:
    """Carries out the dispatchers' ``DeadLetter`` events (see the module docstring)."""

    def __init__(
        self,
        store: DurableStore,
        service: SubscriptionService,
        credentials: Credentials,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``credentials`` and ``ssl_context`` (None: plain TCP): the node's
        own, presented to other nodes' leaders."""
        self._store = store
        self._service = service
        self._appends = _Appends(self)
        #: Appends in flight by ticket, with the dispatcher that decided them
        #: and the run appended (sent to another leader if refused here).
        self._waiting: dict[
            int, tuple[PartitionSubscriptions, str, Dispatcher, DeadLetter, Run]
        ] = {}
        self.leaders = LeaderDeadLetters(f"dead-letters-{store.worker}", credentials, ssl_context)

    def send(
        self,
        partition: PartitionSubscriptions,
        name: str,
        event: DeadLetter,
        cache: BatchCache,
    ) -> None:
        """Append ``event``'s message to the dead-letter topic (never waits)."""
        batch = cache.find(event.offset)
        if batch is None:
            partition.trimmed(name, [event.offset])
            return
        store = self._store
        definition = partition.definitions[name]
        chosen = definition.dead_letter_topic
        if chosen:
            topic = store.policies.named(chosen)
            key = definition.dead_letter_key(partition.topic, topic.pattern if topic else b"")
        else:
            key = definition.dead_letter_key(partition.topic)
            topic = store.match(key)
        if topic is None:
            log.error("no durable topic %r holds %r: dead letters of %r wait", chosen, key, name)
            partition.dead_letter_retry.append((name, event))
            return
        tags = (
            (TAG_TOPIC, partition.topic),
            (TAG_PARTITION, str(partition.partition)),
            (TAG_OFFSET, str(event.offset)),
            (TAG_SUBSCRIPTION, name),
            (TAG_DELIVERIES, str(event.count)),
            (TAG_ERROR, event.error),
        )
        run = dead_letter_run(batch, event.offset, key, tags)
        ticket = self._appends.open(0)
        self._waiting[ticket.sequence] = (
            partition,
            name,
            partition.dispatchers[name],
            event,
            run,
        )
        store.append_frame([run], ticket, self._appends)
        self._appends.release()  # a refusal is known at once

    def appended(self, ticket: AckTicket) -> None:
        """A dead-letter append finished: ack the original, or retry."""
        partition, name, decided_by, event, run = self._waiting.pop(ticket.sequence)
        leader = leader_address(ticket.failure) if ticket.code is ErrorCode.NOT_LEADER else None
        if leader is not None and partition.dispatchers.get(name) is decided_by:
            [message] = decode_run(run)

            def done(failure: str) -> None:
                ticket.failure = failure
                self._finish(partition, name, decided_by, event, ticket)

            self.leaders.send(leader, message.key, message, done)
            return
        self._finish(partition, name, decided_by, event, ticket)

    def _finish(
        self,
        partition: PartitionSubscriptions,
        name: str,
        decided_by: Dispatcher,
        event: DeadLetter,
        ticket: AckTicket,
    ) -> None:
        """The copy is durable (ack the original) or failed (retry it)."""
        dispatcher = partition.dispatchers.get(name)
        if dispatcher is not decided_by:
            return  # the subscription was deleted (and maybe recreated) meanwhile
        if ticket.failure:
            log.error(
                "dead letter of %s/%d@%d for %r not stored (%s): retried",
                partition.topic,
                partition.partition,
                event.offset,
                name,
                ticket.failure,
            )
            partition.dead_letter_retry.append((name, event))
            partition.wake()
            return
        dispatcher.dead_lettered([event.offset], trio.current_time())
        partition.changed(name, 1)
        self._service.dead_lettered(partition, name, event, ticket)
