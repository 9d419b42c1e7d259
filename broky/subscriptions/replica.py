"""A replicated partition's durable subscriptions follow the partition's leader.

In a cluster (broky.replication) the subscription state of a partition —
each subscription's definition and image: cursor, acked ranges, delivery
counts — moves with the partition (docs/subscription-replication.md):

- the **leader** serves the subscriptions: consumers attach there only, and
  every group commit's rows (broky.subscriptions.commits) go into a
  ``StateJournal``, which followers read with their fetches (the
  replication link carries them next to the log's runs);
- a **follower** serves none: it stores the rows it fetches in its own state
  store, in one transaction per answer, before its next fetch reports them
  as stored;
- a follower that **takes the lead** reads its state store back and serves
  the subscriptions from there: whatever its last fetch had stored;
- a leader that **steps down** stops serving at once: its dispatchers are
  dropped (they would keep committing a state that the new leader does not
  see) and its consumers are told to attach to the new leader.

The window, at-least-once: an ack whose receipt (``Settled``) the leader
sent but whose row no follower had fetched when the leader died is lost
with it, and the new leader redelivers that message. A follower's fetch
asks again at once after an answer, and the leader wakes waiting fetches
after each commit, so the window is one fetch round trip plus the
follower's sqlite commit (milliseconds), at most ``REQUEST_TIMEOUT`` (2 s)
when a follower is slow to answer. Nothing unacked is lost: the new leader
redelivers every message above its copy's cursor that its copy does not
show acked.

``SubscriptionReplica`` is what ``broky.replication.gate.PartitionReplica``
calls (its ``SubscriptionRole``); it lives on the trio thread, beside the
partition's ``PartitionSubscriptions``, which owns the dispatchers.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from broky.protocol.constants import ErrorCode
from broky.replication.wire import StateUpdate
from broky.storage.errors import StorageError
from broky.subscriptions.commits import ImageKey
from broky.subscriptions.definition import Definition, DefinitionError
from broky.subscriptions.image import encode_image
from broky.subscriptions.journal import StateJournal

if TYPE_CHECKING:
    from broky.replication.gate import PartitionReplica
    from broky.subscriptions.partition import PartitionSubscriptions

log = logging.getLogger("broky.subscriptions")


class SubscriptionReplica:
    """See the module docstring."""

    def __init__(self, partition: PartitionSubscriptions, replica: PartitionReplica) -> None:
        self.partition = partition
        self.replica = replica
        #: The leadership whose state this node serves (None: not serving).
        self.journal: StateJournal | None = None
        self._leading = trio.Lock()
        partition.committer.on_rows = self._committed

    @property
    def serving(self) -> bool:
        return self.journal is not None

    def refusal(self) -> str:
        """Why a consumer cannot attach to this partition here."""
        return self.replica.not_leading()

    # --- SubscriptionRole (broky.replication.gate) ---------------------------------------

    async def lead(self, epoch: int) -> None:
        """Serve the subscriptions from the state this node has stored."""
        async with self._leading:
            self.step_down()
            partition = self.partition
            try:
                images, definitions = await partition.committer.reload()
            except StorageError as exc:
                # Not serving: consumers are refused until the next leadership.
                log.error(
                    "%s/%d: subscription state unreadable, not serving it: %s",
                    partition.topic,
                    partition.partition,
                    exc,
                )
                return
            leading = self.replica.leading
            if leading is None or leading.term.epoch != epoch:
                return  # deposed while reading: the next role serves
            rows = []
            for name, text in sorted(definitions.items()):
                image = images.get((name, partition.topic, partition.partition))
                try:
                    definition = Definition.from_json(text)
                except DefinitionError as exc:
                    log.error("subscription %r: stored definition refused: %s", name, exc)
                    continue
                if image is None:
                    continue  # written together; a definition alone was never committed
                partition.add(definition, image)
                rows.append((name, text, encode_image(image)))
            self.journal = StateJournal(epoch, rows)
            log.info(
                "%s/%d: serving %d subscription(s) as leader at epoch %d",
                partition.topic,
                partition.partition,
                len(rows),
                epoch,
            )
            partition.wake()

    def step_down(self) -> None:
        """Stop serving: drop the dispatchers, close their consumers' streams."""
        partition = self.partition
        self.journal = None
        if not partition.dispatchers:
            return
        service = partition.service
        key = (partition.topic, partition.partition)
        for link in list(service.consumers.values()):
            if key in link.partitions:
                link.error(
                    ErrorCode.NOT_LEADER, f"subscription {link.subscription!r}: {self.refusal()}"
                )
                service.detach(link)
        partition.drop_all()

    def state_since(self, epoch: int, version: int) -> StateUpdate | None:
        journal = self.journal
        return None if journal is None else journal.since(epoch, version)

    def readable(self, high_watermark: int) -> None:
        if self.journal is not None:
            self.partition.appended(high_watermark)

    async def store(self, update: StateUpdate) -> None:
        partition = self.partition
        await partition.committer.store_rows(update, partition.topic, partition.partition)

    # --- the leader's commits ------------------------------------------------------------

    def _committed(self, rows: list[tuple[ImageKey, bytes]], deleted: set[str]) -> None:
        journal = self.journal
        if journal is None:
            return  # not leading: nothing of ours is followed
        journal.deleted(sorted(deleted))
        definitions = self.partition.definitions
        journal.committed(
            (name, definitions[name].to_json(), image)
            for (name, _, _), image in rows
            if name in definitions
        )
        self.replica.state_changed()
