"""Where the cluster keeps its metadata in etcd: every key under one root.

``/broky/<cluster>/`` holds:

- ``config``: the cluster's fixed settings (vbuckets, replication factor),
  written once by the first controller;
- ``nodes/<node_id>``: one per live node, attached to the node's lease; its
  ``create_revision`` is the node's epoch (new on every start);
- ``controller``: the elected controller, attached to its lease; its
  ``create_revision`` is the controller epoch that guards its writes;
- ``vb/<vbucket>``: a vbucket's replicas, leader, leader epoch and ISR
  (broky.cluster.state), changed only by compare-and-swap;
- ``decommissioned/<node_id>``: a node removed for good (``broky cluster
  remove-node``): the controller moves its replicas to the other nodes.
"""

from __future__ import annotations

import re

import attrs

#: Node ids and cluster names are short and printable: they are etcd key
#: segments and appear in logs and ``broky cluster status``.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_name(kind: str, name: str) -> str:
    """``name`` if it is a valid node id / cluster name, else ValueError."""
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"{kind} must be 1-64 letters, digits, '_', '.' or '-' (starting with a letter "
            f"or digit), got {name!r}"
        )
    return name


@attrs.frozen
class ClusterKeys:
    """The key layout of one cluster (``root`` ends with ``/``)."""

    root: bytes

    @classmethod
    def for_cluster(cls, name: str) -> ClusterKeys:
        return cls(f"/broky/{check_name('cluster name', name)}/".encode())

    @property
    def config(self) -> bytes:
        return self.root + b"config"

    @property
    def controller(self) -> bytes:
        return self.root + b"controller"

    @property
    def nodes(self) -> bytes:
        return self.root + b"nodes/"

    def node(self, node_id: str) -> bytes:
        return self.nodes + node_id.encode()

    def node_id(self, key: bytes) -> str:
        """The node id of a ``nodes/<id>`` key."""
        return key[len(self.nodes) :].decode()

    @property
    def vbuckets(self) -> bytes:
        return self.root + b"vb/"

    def vbucket(self, vbucket: int) -> bytes:
        # Zero-padded so a prefix read returns vbuckets in order.
        return self.vbuckets + b"%05d" % vbucket

    @property
    def decommissioned(self) -> bytes:
        return self.root + b"decommissioned/"

    def decommission(self, node_id: str) -> bytes:
        return self.decommissioned + node_id.encode()

    def decommissioned_id(self, key: bytes) -> str:
        """The node id of a ``decommissioned/<id>`` key."""
        return key[len(self.decommissioned) :].decode()

    def vbucket_of(self, key: bytes) -> int:
        """The vbucket number of a ``vb/<n>`` key."""
        return int(key[len(self.vbuckets) :])
