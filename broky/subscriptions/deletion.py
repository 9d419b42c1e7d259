"""Deleting a durable subscription from one worker's partitions.

A subscription lives until deleted (``DeleteSubscription``): its definition,
cursor, acked ranges and delivery counts are rows of each partition's state
store. Deleting it on a worker removes its dispatchers from every partition
this worker owns and deletes those rows in each store's next group commit;
the deletion is answered once every store committed it, so a crash after
the answer cannot bring the subscription back. A ``Consume`` naming it
afterwards creates a new subscription at its start position, with nothing of
the old one.

Consumers: a subscription with consumers attached is refused unless
``force``; then each consumer is detached (what it held is released, and
gone with the subscription) and ends with a ``SubscriptionDeleted`` stream
error. The deletion runs under the service's attach lock, so no consumer can
attach halfway through it.

Several workers: each worker deletes its own partitions' share; the worker
the client is connected to asks every owner in two phases
(broky.durable.deletion_round): *prepare* checks this worker's share and
marks the subscription deleting (:class:`DeletionMarks`: attaches are
refused while the mark lasts), *commit* deletes it, *abort* drops the mark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import attrs
import trio

from broky.protocol.constants import ErrorCode
from broky.subscriptions.commits import all_committed
from broky.subscriptions.consumers import ConsumerLink, Refused

if TYPE_CHECKING:
    from broky.subscriptions.partition import PartitionSubscriptions
    from broky.subscriptions.service import SubscriptionService

#: How long a prepared deletion's mark refuses attaches without a commit or
#: an abort. The coordinator sends one within a few ms of every owner's
#: prepare; without one it died or its channel broke, and the subscription
#: must not stay unattachable: after this the mark goes, nothing deleted.
MARK_TTL: Final = 10.0


@attrs.frozen
class Deletion:
    """What one worker deleted: partition stores, and consumers ended."""

    partitions: int
    consumers: int


class DeletionMarks:
    """The subscriptions of this worker that a prepared deletion marked
    (module docstring); owned by the worker's subscription service."""

    def __init__(self) -> None:
        self._marks: dict[str, object] = {}

    def refuse_attach(self, name: str) -> None:
        """Raise ``Refused`` if ``name`` is being deleted."""
        if name in self._marks:
            raise Refused(
                ErrorCode.SUBSCRIPTION_REFUSED,
                f"subscription {name!r} is being deleted: attach again once the deletion "
                "is answered (a new subscription is then created)",
            )

    def mark(self, name: str, nursery: trio.Nursery) -> None:
        """Mark ``name`` deleting for at most ``MARK_TTL`` seconds."""
        if name in self._marks:
            raise Refused(
                ErrorCode.SUBSCRIPTION_REFUSED,
                f"subscription {name!r}: another deletion of it is under way; "
                "delete again once it is answered",
            )
        token = self._marks[name] = object()
        nursery.start_soon(self._expire, name, token)

    def unmark(self, name: str) -> None:
        self._marks.pop(name, None)

    async def _expire(self, name: str, token: object) -> None:
        await trio.sleep(MARK_TTL)
        if self._marks.get(name) is token:
            del self._marks[name]


def deletable(
    service: SubscriptionService, name: str, pattern: bytes, force: bool
) -> tuple[list[PartitionSubscriptions], list[ConsumerLink]]:
    """This worker's partitions holding ``name`` and its consumers here, or
    ``Refused`` if it may not be deleted (another pattern; consumers
    without ``force``)."""
    partitions = [p for p in service.partitions.values() if name in p.dispatchers]
    for partition in partitions:
        reads = partition.definitions[name].pattern
        if pattern and reads != pattern:
            raise Refused(
                ErrorCode.SUBSCRIPTION_REFUSED,
                f"subscription {name!r} reads {reads.decode(errors='replace')!r}, not "
                f"{pattern.decode(errors='replace')!r}: nothing deleted",
            )
    links = [link for link in service.consumers.values() if link.subscription == name]
    if links and not force:
        raise Refused(
            ErrorCode.SUBSCRIPTION_REFUSED,
            f"subscription {name!r} has {len(links)} consumer(s) attached on worker "
            f"{service.store.worker}: stop them first, or delete with force (which ends them)",
        )
    return partitions, links


async def delete_subscription(
    service: SubscriptionService, name: str, pattern: bytes, force: bool
) -> Deletion:
    """Delete ``name`` from this worker's partitions (module docstring); a
    subscription this worker does not hold is ``Deletion(0, 0)``. The caller
    holds the service's attach lock."""
    partitions, links = deletable(service, name, pattern, force)
    for link in links:
        service.detach(link)
        link.error(
            ErrorCode.SUBSCRIPTION_DELETED,
            f"subscription {name!r} was deleted (forced) while this consumer was attached; "
            "consuming it again creates a new subscription",
        )
    for partition in partitions:
        partition.remove(name)
    service.forget_counters(name)
    await all_committed([partition.committer for partition in partitions])
    return Deletion(len(partitions), len(links))
