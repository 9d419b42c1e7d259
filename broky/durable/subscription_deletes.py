"""Deleting a durable subscription on every worker of a node.

A subscription's state lives with each partition's owner worker
(broky.subscriptions.deletion deletes one worker's share). The worker a
client's ``DeleteSubscription`` reaches asks every worker that owns some of
the partitions (of the request's pattern, or of every durable topic when it
names none): itself through its subscription service, the others over the
owner channels (a ``DeleteSubscription`` on a channel stream, answered by
``DeletedSubscription`` or an ``Error`` there). Once every owner answered,
the client gets one answer:

- every owner deleted (or did not hold it), some held it:
  ``DeletedSubscription`` with the partitions and consumers added up;
- no owner held it: ``UnknownSubscription``;
- some owner refused (consumers attached without ``force``, another
  pattern) or was down: that owner's error, naming the workers that did
  delete their share, if any. Deleting again finishes the job: an owner
  that already deleted answers as one that never held it.

The owners are asked at once and answer on their own: there is no
two-phase commit, so a consumer that attaches on one worker between the
owners' deletions can leave the subscription deleted on some workers and
refused on others; the error says so, and a repeated (or forced) delete
converges.
"""

from __future__ import annotations

import attrs

from broky.durable.forwarding import Forwarder
from broky.durable.owner_channel import OwnerChannel
from broky.durable.relays import ConsumerFrame
from broky.protocol.codec import encode_frame
from broky.protocol.constants import ErrorCode
from broky.protocol.frames import DeletedSubscription, DeleteSubscription, Error
from broky.router.outbox import Outlet
from broky.subscriptions.consumers import Refused
from broky.subscriptions.deletion import Deletion
from broky.subscriptions.service import SubscriptionService


class _RemoteShare:
    """One other owner's answer, awaited on a stream of its channel."""

    def __init__(self, deletion: SpreadDeletion, owner: int, channel: OwnerChannel) -> None:
        self.deletion = deletion
        self.owner = owner
        self.channel = channel
        self.stream = channel.new_stream()

    def receive(self, frame: ConsumerFrame) -> None:
        self.channel.consumer_parts.pop(self.stream, None)
        if isinstance(frame, DeletedSubscription):
            self.deletion.answered(self.owner, Deletion(frame.partitions, frame.consumers))
        elif isinstance(frame, Error):
            self.deletion.answered(self.owner, Refused(frame.code, frame.message))

    def down(self) -> None:
        self.deletion.answered(self.owner, _unavailable(self.owner))


def _unavailable(owner: int) -> Refused:
    return Refused(
        ErrorCode.OWNER_UNAVAILABLE,
        f"worker {owner}, an owner of durable partitions, is unavailable (restarting?); "
        "its share was not deleted: delete again shortly",
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
        self._answers: dict[int, Deletion | Refused] = {}

    def start(self) -> None:
        frame = self._frame
        worker = self._service.store.worker
        for owner in sorted(self._owners):
            if owner == worker:
                self._service.delete(frame.subscription, frame.pattern, frame.force, self._local)
                continue
            channel = self._forwarder.channels.get(owner) if self._forwarder else None
            if channel is None or not channel.connected:
                self.answered(owner, _unavailable(owner))
                continue
            share = _RemoteShare(self, owner, channel)
            channel.consumer_parts[share.stream] = share
            channel.send(encode_frame(attrs.evolve(frame, stream=share.stream)))

    def _local(self, answer: Deletion | Refused) -> None:
        self.answered(self._service.store.worker, answer)

    def answered(self, owner: int, answer: Deletion | Refused) -> None:
        """``owner`` deleted its share, or refused; the last answer is sent on."""
        if owner in self._answers:
            return
        self._answers[owner] = answer
        if len(self._answers) == len(self._owners):
            self._outlet.send_control(encode_frame(self._combined()))

    def _combined(self) -> DeletedSubscription | Error:
        stream = self._frame.stream
        name = self._frame.subscription
        done = {o: a for o, a in sorted(self._answers.items()) if isinstance(a, Deletion)}
        refusals = [a for a in self._answers.values() if isinstance(a, Refused)]
        deleted_on = sorted(o for o, a in done.items() if a.partitions)
        if refusals:
            first = refusals[0]
            also = (
                f" (its share on worker(s) {', '.join(map(str, deleted_on))} was deleted)"
                if deleted_on
                else ""
            )
            return Error(first.code, f"{first}{also}", stream)
        if not deleted_on:
            return Error(
                ErrorCode.UNKNOWN_SUBSCRIPTION,
                f"no durable subscription {name!r} on this broker; nothing deleted",
                stream,
            )
        return DeletedSubscription(
            stream,
            sum(a.partitions for a in done.values()),
            sum(a.consumers for a in done.values()),
        )
