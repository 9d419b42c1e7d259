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
the client is connected to asks every owner and combines their answers
(broky.durable.subscription_deletes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from broky.protocol.constants import ErrorCode
from broky.subscriptions.commits import all_committed
from broky.subscriptions.consumers import Refused

if TYPE_CHECKING:
    from broky.subscriptions.service import SubscriptionService


@attrs.frozen
class Deletion:
    """What one worker deleted: partition stores, and consumers ended."""

    partitions: int
    consumers: int


async def delete_subscription(
    service: SubscriptionService, name: str, pattern: bytes, force: bool
) -> Deletion:
    """Delete ``name`` from this worker's partitions (module docstring); a
    subscription this worker does not hold is ``Deletion(0, 0)``. The caller
    holds the service's attach lock."""
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
