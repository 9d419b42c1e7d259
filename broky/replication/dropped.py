"""Deleting this node's copy of a partition once a move has dropped it.

A move (broky.cluster.moves) drops the old replicas only in its last step,
after the new ones are in the ISR, and in the same etcd write that ends the
move. So a node deletes its copy of a partition when it sees a vbucket
state in which it is neither a replica nor part of a move's target, having
seen itself as one of them before: never while the vbucket may still need
that copy, and never because of a state it never held a part in (a node
that starts up outside a vbucket's replica set keeps whatever files it has
there; they do no harm and a later placement refetches over them by the
usual epoch truncation).

The copy is emptied (the log restarts at offset 0, the epoch history goes,
the fence stays: it only ever grows), so if the vbucket is placed here
again, the new replica fetches the whole log like any new one. The leader
forgets a dropped replica's acks for the same reason (broky.cluster.isr,
rule 5).
"""

from __future__ import annotations

import logging
from typing import Any

from broky.cluster.state import VbucketState
from broky.replication import epochfile
from broky.replication.gate import PartitionReplica
from broky.storage.log import PartitionLog

log = logging.getLogger("broky.replication")

PartitionKey = tuple[str, int]


class DroppedReplicas:
    """Which partitions of ``node_id`` a completed move dropped (see the
    module docstring). Fed every vbucket state seen, in order."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        #: Partitions this node was seen to hold a replica (or move target) of.
        self._held: set[PartitionKey] = set()
        #: Copies deleted so far.
        self.deleted = 0

    def dropped(self, key: PartitionKey, state: VbucketState | None) -> bool:
        """True once, when ``state`` shows ``key`` dropped from this node."""
        if state is None:
            return False
        if self.node_id in state.replicas or self.node_id in state.target:
            self._held.add(key)
            return False
        if key in self._held:
            self._held.discard(key)
            return True
        return False

    def delete(self, replica: PartitionReplica) -> None:
        """Empty ``replica``'s log in its owner's next round. Submitted at
        once (not from a task), so it is ordered before anything a later
        follower of the same partition asks the owner to do."""
        history = replica.history

        def clear(partition_log: PartitionLog) -> None:
            partition_log.clear()
            history.truncate(0)
            epochfile.save(partition_log.directory, history, replica.fence)

        def done(result: Any) -> None:
            if isinstance(result, BaseException):
                log.error("%s: deleting the dropped copy failed: %s", replica.name, result)
                return
            self.deleted += 1
            log.info("%s: deleted this node's copy (a move dropped it)", replica.name)

        replica.high_watermark = 0
        replica.owner.reload_producers(())
        replica.owner.submit(clear, done)
