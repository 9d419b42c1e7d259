"""Deleting a durable subscription on every worker of a node.

A subscription's state lives with each partition's owner worker
(broky.subscriptions.deletion deletes one worker's share). The worker a
client's ``DeleteSubscription`` reaches asks every worker that owns some of
the partitions (of the request's pattern, or of every durable topic when it
names none): itself through its subscription service, the others over the
owner channels (a ``DeleteSubscription`` with a ``phase`` on a channel
stream, answered by ``DeletedSubscription`` or an ``Error`` there).

With one owner the deletion is one step. With several it has two phases
(broky.durable.deletion_round decides, this module sends): every owner
*prepares* (checks its share and refuses attaches), then all *commit*, or,
if one refused or was down, the prepared ones *abort* and the client gets
that owner's error with nothing deleted anywhere. The answer:

- every owner committed, some held it: ``DeletedSubscription`` with the
  partitions and consumers added up;
- no owner held it: ``UnknownSubscription``;
- an owner refused or was down at prepare: its error, nothing deleted;
- an owner went down between its prepare and its commit (the one partial
  outcome left): ``OwnerUnavailable`` naming the workers that deleted their
  share; deleting again finishes the job.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from broky.durable.deletion_round import Abort, Answer, Commit, DeletionRound
from broky.durable.forwarding import Forwarder
from broky.durable.owner_channel import OwnerChannel
from broky.durable.relays import ConsumerFrame
from broky.protocol.codec import encode_frame
from broky.protocol.constants import DeletePhase, ErrorCode
from broky.protocol.frames import DeletedSubscription, DeleteSubscription, Error
from broky.router.outbox import Outlet
from broky.subscriptions.consumers import Refused
from broky.subscriptions.deletion import Deletion
from broky.subscriptions.service import SubscriptionService


class _RemoteShare:
    """One other owner's answer to one phase, awaited on a stream of its channel."""

    def __init__(
        self, answered: Callable[[int, Answer], None], owner: int, channel: OwnerChannel
    ) -> None:
        self.answered = answered
        self.owner = owner
        self.channel = channel
        self.stream = channel.new_stream()

    def receive(self, frame: ConsumerFrame) -> None:
        self.channel.consumer_parts.pop(self.stream, None)
        if isinstance(frame, DeletedSubscription):
            self.answered(self.owner, Deletion(frame.partitions, frame.consumers))
        elif isinstance(frame, Error):
            self.answered(self.owner, Refused(frame.code, frame.message))

    def down(self) -> None:
        self.answered(self.owner, _unavailable(self.owner))


def _unavailable(owner: int) -> Refused:
    return Refused(
        ErrorCode.OWNER_UNAVAILABLE,
        f"worker {owner}, an owner of durable partitions, is unavailable (restarting?); "
        "delete again shortly",
    )


class SpreadDeletion:
    """A client's ``DeleteSubscription`` over the owner workers (module docstring)."""

    def __init__(
        self,
        frame: DeleteSubscription,
        outlet: Outlet,
        service: SubscriptionService,
        forwarder: Forwarder | None,
        owners: set[int],
    ) -> None:
        self._frame = frame
        self._outlet = outlet
        self._service = service
        self._forwarder = forwarder
        self._owners = owners
        self._round = DeletionRound(frame.subscription, owners)
        #: After an abort decision: the owners yet to drop their marks, and
        #: the refusal the client gets then.
        self._aborting: set[int] = set()
        self._refusal: Refused | None = None

    def start(self) -> None:
        if self._owners == {self._service.store.worker}:
            self._ask(self._service.store.worker, DeletePhase.WHOLE, self._answer)
            return
        for owner in sorted(self._owners):
            self._ask(owner, DeletePhase.PREPARE, self._prepared)

    def _ask(self, owner: int, phase: DeletePhase, answered: Callable[[int, Answer], None]) -> None:
        """Send ``owner`` this deletion's ``phase``; ``answered`` gets its answer
        (none for an abort)."""
        frame = self._frame
        if owner == self._service.store.worker:
            self._service.delete(
                frame.subscription,
                frame.pattern,
                frame.force,
                lambda answer: answered(owner, answer),
                phase,
            )
            return
        channel = self._forwarder.channels.get(owner) if self._forwarder else None
        if channel is None or not channel.connected:
            answered(owner, _unavailable(owner))
            return
        share = _RemoteShare(answered, owner, channel)
        channel.consumer_parts[share.stream] = share
        channel.send(encode_frame(attrs.evolve(frame, stream=share.stream, phase=phase)))

    def _prepared(self, owner: int, answer: Answer) -> None:
        decision = self._round.prepared(owner, answer)
        if isinstance(decision, Commit):
            for ready in decision.owners:
                self._ask(ready, DeletePhase.COMMIT, self._committed)
        elif isinstance(decision, Abort):
            # The client hears the refusal once every mark is dropped: a
            # Consume it sends next must not meet one.
            self._refusal = decision.refusal
            self._aborting = set(decision.owners)
            if not self._aborting:
                self._answer(owner, decision.refusal)
            for ready in decision.owners:
                self._ask(ready, DeletePhase.ABORT, self._aborted)

    def _aborted(self, owner: int, answer: Answer) -> None:
        """``owner`` dropped its mark (or went down, which drops it too)."""
        if owner not in self._aborting:
            return
        self._aborting.discard(owner)
        if not self._aborting and self._refusal is not None:
            self._answer(owner, self._refusal)

    def _committed(self, owner: int, answer: Answer) -> None:
        combined = self._round.committed(owner, answer)
        if combined is not None:
            self._answer(owner, combined)

    def _answer(self, owner: int, answer: Answer) -> None:
        """Send the client its one answer."""
        stream = self._frame.stream
        if isinstance(answer, Refused):
            frame: DeletedSubscription | Error = Error(answer.code, str(answer), stream)
        elif not answer.partitions:
            frame = Error(
                ErrorCode.UNKNOWN_SUBSCRIPTION,
                f"no durable subscription {self._frame.subscription!r} on this broker; "
                "nothing deleted",
                stream,
            )
        else:
            frame = DeletedSubscription(stream, answer.partitions, answer.consumers)
        self._outlet.send_control(encode_frame(frame))
