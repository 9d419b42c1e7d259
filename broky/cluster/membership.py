"""Nodes register in etcd under a lease; the live ones are the members.

A node puts ``nodes/<node_id>`` attached to its lease and renews the lease
every third of its TTL. If the node dies, hangs or loses etcd for a whole
TTL, etcd deletes the key and every watcher sees the node leave; a clean
shutdown revokes the lease so the others see it at once. The key's
``create_revision`` is the node's epoch: a new number on every start, so a
restarted node is told apart from its previous life (Kafka's broker epoch,
KIP-903).

Lease expiry is a liveness signal only: etcd renews every lease when its
own leader changes, so nothing here proves a node is dead; safety comes
from epochs checked by the data path (broky.cluster.state).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from functools import partial
from typing import NoReturn

import attrs
import trio

from broky.cluster.etcd import EtcdClient, Lease
from broky.cluster.etcd_wire import Compare, EtcdError, EventType, Get, KeyValue, Put
from broky.cluster.keys import ClusterKeys, check_name
from broky.cluster.mirror import ParsedView, PrefixMirror

log = logging.getLogger(__name__)


class NodeIdTaken(Exception):
    """Another live process holds this node id (or its previous life's
    lease has not expired within the wait)."""


class LeaseLost(Exception):
    """The node's lease expired or could not be renewed in time: etcd has
    (or will have) deleted its keys, so it must stop acting as a member."""


@attrs.frozen
class NodeInfo:
    """What a node tells the cluster about itself (the ``nodes/<id>`` value)."""

    node_id: str = attrs.field(validator=lambda _i, _a, value: check_name("node id", value))
    #: Where clients connect (HOST:PORT).
    address: str = ""
    #: Where other nodes' cluster links connect (HOST:PORT; empty: none).
    cluster_address: str = ""
    workers: int = 1
    #: Where followers fetch this node's partitions (HOST:PORT; empty: none).
    replication_address: str = ""

    def to_json(self) -> bytes:
        return json.dumps(attrs.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> NodeInfo:
        """Raises ValueError (or a subclass) for anything that is not a NodeInfo."""
        fields = json.loads(data)
        if not isinstance(fields, dict):
            raise ValueError(f"node info must be a JSON object, got {data[:100]!r}")
        return cls(
            node_id=str(fields["node_id"]),
            address=str(fields.get("address", "")),
            cluster_address=str(fields.get("cluster_address", "")),
            workers=int(fields.get("workers", 1)),
            replication_address=str(fields.get("replication_address", "")),
        )


@attrs.frozen
class Member:
    """A live node: what it registered, and the epoch of this life."""

    info: NodeInfo
    epoch: int
    lease: int

    @property
    def node_id(self) -> str:
        return self.info.node_id


def members_of(keys: ClusterKeys, kvs: Mapping[bytes, KeyValue]) -> dict[str, Member]:
    """The members recorded under ``nodes/`` (unreadable entries are logged
    and skipped: one bad key must not hide the others)."""
    members = {}
    for key, kv in kvs.items():
        try:
            info = NodeInfo.from_json(kv.value)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable node entry %r: %s", key, exc)
            continue
        if info.node_id != keys.node_id(key):
            log.warning("ignoring node entry %r naming node %r", key, info.node_id)
            continue
        members[info.node_id] = Member(info, kv.create_revision, kv.lease)
    return members


@attrs.frozen
class Registration:
    """This node's membership: its lease and the epoch of this life."""

    lease: Lease
    epoch: int


async def register(
    client: EtcdClient, keys: ClusterKeys, info: NodeInfo, ttl: int, wait: float
) -> Registration:
    """Create ``nodes/<id>`` under a new lease of ``ttl`` seconds.

    If the key exists — a previous life of this node whose lease has not
    run out yet, or another process with the same id — wait up to ``wait``
    seconds for it to go, then give up with NodeIdTaken."""
    key = keys.node(info.node_id)
    lease = await client.grant(ttl)
    try:
        with trio.move_on_after(wait):
            while True:
                result = await client.txn(
                    [Compare.created(key, 0)], [Put(key, info.to_json(), lease.id)], [Get(key)]
                )
                if result.succeeded:
                    return Registration(lease, result.revision)
                log.info("node id %s is still registered; waiting for it to expire", info.node_id)
                async with client.watch(key, start_revision=result.revision + 1) as stream:
                    async for batch in stream:
                        if any(event.type is EventType.DELETE for event in batch.events):
                            break
    except BaseException:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await client.revoke(lease.id)
        raise
    with trio.CancelScope(shield=True), trio.move_on_after(1):
        await client.revoke(lease.id)
    raise NodeIdTaken(
        f"node id {info.node_id!r} is registered by a live node (still there after {wait:g} s): "
        "give every node its own --node-id"
    )


class LeaseKeeper:
    """Renews a lease every third of its TTL until the lease is lost.

    ``valid_until`` (trio clock) is a lower bound of the lease's expiry in
    etcd: the send time of the last renewal etcd accepted, plus the TTL. A
    node past it must assume it is no longer a member."""

    def __init__(self, client: EtcdClient, lease: Lease) -> None:
        self.client = client
        self.lease = lease
        self.valid_until = trio.current_time() + lease.ttl

    async def run(self) -> NoReturn:
        """Renew until the lease is lost, then raise LeaseLost."""
        interval = self.lease.ttl / 3
        while True:
            await trio.sleep(interval)
            sent_at = trio.current_time()
            ttl = -1
            with trio.move_on_after(interval):
                try:
                    ttl = await self.client.keepalive(self.lease.id)
                except EtcdError as exc:
                    log.warning("lease keepalive failed: %s", exc)
            if ttl == 0:
                raise LeaseLost(f"etcd says lease {self.lease.id:x} has expired")
            if ttl > 0:
                self.valid_until = sent_at + ttl
            elif trio.current_time() >= self.valid_until:
                raise LeaseLost(
                    f"lease {self.lease.id:x} could not be renewed for its whole TTL "
                    f"({self.lease.ttl} s)"
                )


class Membership:
    """The live members, kept current by a watch on ``nodes/``."""

    def __init__(self, client: EtcdClient, keys: ClusterKeys) -> None:
        self.keys = keys
        self._mirror = PrefixMirror(client, keys.nodes)
        self._members = ParsedView(self._mirror, partial(members_of, keys))

    @property
    def revision(self) -> int:
        return self._mirror.revision

    def members(self) -> dict[str, Member]:
        """The live members (parsed once per etcd change)."""
        return self._members.current()

    async def changed(self) -> None:
        """Return after the next join or leave."""
        await self._mirror.changed()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow ``nodes/`` until cancelled (started after the first read)."""
        await self._mirror.run(task_status=task_status)
