"""Removing a node for good: ``broky cluster remove-node N``.

A node that stops answering is only *down*: its replicas wait for it (the
ISR shrinks, leaders fail over, nothing moves), because a node whose lease
blipped or that is being rebooted must not cost a copy of all its data.
Only an operator knows a node is gone for good; this command records that
in etcd (``decommissioned/<N>``), and the controller then moves the node's
replicas to the others (broky.cluster.moves). The mark stays, so the node
id cannot silently come back into the map; ``--undo`` deletes it.
"""

from __future__ import annotations

from collections.abc import Iterable

from broky.cluster.etcd import EtcdClient
from broky.cluster.etcd_wire import KeyValue
from broky.cluster.keys import ClusterKeys


def decommissioned_of(keys: ClusterKeys, kvs: Iterable[KeyValue]) -> set[str]:
    """The node ids marked under ``decommissioned/``."""
    return {keys.decommissioned_id(kv.key) for kv in kvs}


async def remove_node(client: EtcdClient, keys: ClusterKeys, node_id: str) -> None:
    """Mark ``node_id`` as removed for good (idempotent)."""
    await client.put(keys.decommission(node_id), b"removed")


async def undo_remove(client: EtcdClient, keys: ClusterKeys, node_id: str) -> bool:
    """Take the mark back (True if there was one). Moves already made stay."""
    return await client.delete(keys.decommission(node_id)) > 0
