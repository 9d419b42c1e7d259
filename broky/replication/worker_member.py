"""Replication on a node of several worker processes.

A partition's log lives in the worker that owns it (broky.durable.ownership:
the same owner index on every node with the same worker count), so its
replication runs there too: worker ``i`` serves replication on the
replication port + ``i`` (as cluster links use the cluster port + ``i``) and
follows, for each partition it owns, the leader node's worker that owns it
(``owner_address``: the leader's registered replication address + its owner
index, from the worker count it registered).

The node's membership stays in the supervisor (one lease, one life, one
controller campaign per node: broky.cluster.service). A worker needs a view
of it, ``WorkerMember``: the same watched tables as a ClusterNode
(membership, vbucket states, settings; read-only, its own etcd client, for
its ISR compare-and-swaps too) and the node's life and lease deadline as the
supervisor relays them (broky.cluster.lease_relay).
"""

from __future__ import annotations

import attrs
import trio

from broky.cluster.controller import load_settings
from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.leadership import Term
from broky.cluster.lease_relay import RelayedLease
from broky.cluster.membership import Membership
from broky.cluster.settings import ClusterSettings
from broky.cluster.vbuckets import VbucketTable
from broky.durable.ownership import partition_owner


def owner_address(address: str, topic: str, partition: int, workers: int) -> str:
    """Where the worker owning ``topic/partition`` serves replication on a
    node that registered ``address`` and ``workers``."""
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + partition_owner(topic, partition, max(1, workers))}"


def worker_listen(address: str, index: int) -> str:
    """Worker ``index``'s replication listener, from the node's setting."""
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + index}"


@attrs.define
class WorkerMember:
    """A worker's view of its node's membership (see the module docstring);
    what broky.replication.service needs of a member, as ClusterNode gives it
    in a one-process node."""

    client: EtcdClient
    keys: ClusterKeys
    node_id: str
    settings: ClusterSettings
    lease: RelayedLease = attrs.field(factory=RelayedLease)
    membership: Membership = attrs.field(init=False)
    vbuckets: VbucketTable = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.membership = Membership(self.client, self.keys)
        self.vbuckets = VbucketTable(self.client, self.keys)

    def node_epoch(self) -> int:
        return self.lease.node_epoch()

    def lease_valid(self) -> bool:
        return self.lease.lease_valid()

    def terms(self) -> dict[int, Term]:
        """The vbuckets this node leads in its current life (ClusterNode.terms)."""
        epoch = self.node_epoch()
        if epoch == 0:
            return {}
        terms = {}
        for vbucket, stored in self.vbuckets.states().items():
            term = Term(vbucket, stored.state.epoch, self.node_id, epoch)
            if term.holds(stored.state):
                terms[vbucket] = term
        return terms

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow etcd until cancelled; started once the tables are loaded."""
        # The supervisor joined before starting workers: the settings exist.
        self.settings = await load_settings(self.client, self.keys, self.settings)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.membership.run)
            await nursery.start(self.vbuckets.run)
            task_status.started()
