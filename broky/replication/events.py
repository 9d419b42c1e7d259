"""What a node's replication tells operators: leader changes, ISR shrinks
and expansions, under-replicated partitions (issue 15, item 5).

Sans I/O: the replication service reports what happened (it started
leading a partition, the ISR it leads changed, it stopped leading), and
``ReplicationEvents`` keeps the counters and decides which ``$SYS.events``
advisories that makes; the service hands them to the broker's publisher.
Its one owner is the service, on the trio thread.

Each fact is reported by the partition's leader only: it is the one node
whose view of the ISR is current (it proposes the changes, or takes the
controller's), so a cluster-wide subscriber sees each event once rather
than once per replica. Under-replicated is Kafka's definition (ISR smaller
than the replica set) and is an episode: one ``cluster.under_replicated``
when it starts, one ``cluster.fully_replicated`` when it ends, however many
ISR changes happen in between. A leader that stops leading ends its
episodes silently; the next leader reports what it finds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from broky.observability.system import Advisory

#: The service's hook to the broker's ``$SYS.events`` publisher.
Advise = Callable[[Advisory, dict[str, Any]], None]


@attrs.frozen
class PartitionReplication:
    """One partition's replication as this node sees it."""

    topic: str
    partition: int
    #: "leader", "follower" or "none" (etcd gives this node no role).
    role: str
    epoch: int
    log_end: int
    high_watermark: int
    #: Leader only: the committed ISR and the replica set, by node.
    isr: tuple[str, ...] = ()
    replicas: tuple[str, ...] = ()
    #: Leader only: (follower, messages behind the leader's log end).
    follower_lag: tuple[tuple[str, int], ...] = ()

    @property
    def under_replicated(self) -> bool:
        return self.role == "leader" and len(self.isr) < len(self.replicas)

    @property
    def max_lag(self) -> int:
        return max((lag for _, lag in self.follower_lag), default=0)


@attrs.frozen
class ReplicationStatistics:
    """A node's replication, for metrics (broky.observability.replication_metrics)."""

    partitions: tuple[PartitionReplication, ...]
    leader_changes: int
    isr_shrinks: int
    isr_expands: int


class ReplicationEvents:
    """Counters and advisories of one node's replication; see the module docstring."""

    def __init__(self, node_id: str, advise: Advise | None = None) -> None:
        self.node_id = node_id
        self._advise = advise
        #: Epochs this node started leading at (one per leadership).
        self.leader_changes = 0
        #: Replicas removed from, and added to, ISRs this node leads.
        self.isr_shrinks = 0
        self.isr_expands = 0
        #: Led partitions in an under-replicated episode now.
        self.under_replicated: set[tuple[str, int]] = set()

    def led(
        self, topic: str, partition: int, epoch: int, isr: Iterable[str], replicas: Sequence[str]
    ) -> None:
        """This node leads ``topic/partition`` from ``epoch`` on."""
        self.leader_changes += 1
        self._emit(
            Advisory.CLUSTER_LEADER_CHANGED,
            topic,
            partition,
            epoch,
            {"leader": self.node_id, "isr": sorted(isr), "replicas": list(replicas)},
        )
        self._episode(topic, partition, epoch, set(isr), replicas)

    def isr_changed(
        self,
        topic: str,
        partition: int,
        epoch: int,
        before: Iterable[str],
        after: Iterable[str],
        replicas: Sequence[str],
        by: str,
    ) -> None:
        """The ISR this node leads went from ``before`` to ``after`` (node
        names), proposed ``by`` "leader" (lag rules) or "controller" (a dead
        member removed)."""
        old, new = set(before), set(after)
        removed, added = sorted(old - new), sorted(new - old)
        fields = {"isr": sorted(new), "by": by}
        if removed:
            self.isr_shrinks += len(removed)
            self._emit(
                Advisory.CLUSTER_ISR_SHRUNK, topic, partition, epoch, {**fields, "removed": removed}
            )
        if added:
            self.isr_expands += len(added)
            self._emit(
                Advisory.CLUSTER_ISR_EXPANDED, topic, partition, epoch, {**fields, "added": added}
            )
        self._episode(topic, partition, epoch, new, replicas)

    def stopped_leading(self, topic: str, partition: int) -> None:
        """This node no longer leads the partition: its episode ends unreported."""
        self.under_replicated.discard((topic, partition))

    def _episode(
        self, topic: str, partition: int, epoch: int, isr: set[str], replicas: Sequence[str]
    ) -> None:
        key = (topic, partition)
        under = len(isr) < len(replicas)
        if under == (key in self.under_replicated):
            return
        fields = {"isr": sorted(isr), "replicas": list(replicas)}
        if under:
            self.under_replicated.add(key)
            self._emit(Advisory.CLUSTER_UNDER_REPLICATED, topic, partition, epoch, fields)
        else:
            self.under_replicated.discard(key)
            self._emit(Advisory.CLUSTER_FULLY_REPLICATED, topic, partition, epoch, fields)

    def _emit(
        self, kind: Advisory, topic: str, partition: int, epoch: int, fields: dict[str, Any]
    ) -> None:
        if self._advise is not None:
            payload = {"topic": topic, "partition": partition, "epoch": epoch, **fields}
            self._advise(kind, {"node": self.node_id, **payload})
