"""What the replication service needs of its node's cluster membership.

A one-process node gives it its ClusterNode (broky.cluster.node); a worker
of a several-process node a WorkerMember (broky.replication.worker_member),
whose life and lease come from the supervisor. Both satisfy this protocol.
"""

from __future__ import annotations

from typing import Protocol

from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.leadership import Term
from broky.cluster.membership import Membership
from broky.cluster.settings import ClusterSettings
from broky.cluster.vbuckets import VbucketTable


class Member(Protocol):
    """What the service needs of this node's membership: a ClusterNode in a
    one-process node, a WorkerMember in a worker (broky.replication.worker_member)."""

    client: EtcdClient
    keys: ClusterKeys
    settings: ClusterSettings
    membership: Membership
    vbuckets: VbucketTable

    @property
    def node_id(self) -> str: ...

    def node_epoch(self) -> int:
        """This node's life (0 between lives)."""
        ...

    def lease_valid(self) -> bool:
        """Whether the node's lease is surely alive in etcd (gate.py)."""
        ...

    def terms(self) -> dict[int, Term]:
        """The vbuckets this node leads in this life, per its etcd view."""
        ...
