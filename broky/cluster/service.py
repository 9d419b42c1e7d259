"""``broky serve --cluster etcd://... --node-id N``: a broker that is a member.

The broker serves as it would alone; beside it, broky.cluster.node keeps
the node registered, follows membership and vbucket states, and takes its
turn as controller. With ``--replication-listen`` the node also replicates
its durable partitions by those leaders, epochs and ISRs
(broky.replication): in the broker's own loop with one worker
(``broky.cli.serve``), in each worker for the partitions it owns with
several (``broky.mesh.workers``, which relays the node's lease to them).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.membership import NodeIdTaken, NodeInfo
from broky.cluster.node import REGISTER_WAIT, ClusterNode
from broky.cluster.settings import ClusterSettings
from broky.config import Config

log = logging.getLogger(__name__)

#: How long ``broky serve --cluster`` waits to join before giving up: a
#: previous life's registration may need REGISTER_WAIT to expire.
JOIN_TIMEOUT = REGISTER_WAIT + 5.0

Serve = Callable[..., Awaitable[None]]


class ClusterStartError(Exception):
    """The node could not join its cluster (etcd unreachable, id in use)."""


def node_info(config: Config, workers: int) -> NodeInfo:
    """What this node registers: where clients and other nodes reach it."""
    return NodeInfo(
        config.node_id,
        address=f"{config.host}:{config.port}",
        cluster_address=config.cluster_listen,
        workers=workers,
        replication_address=config.replication_listen,
    )


async def run_member(
    config: Config, workers: int, *, task_status: trio.TaskStatus[ClusterNode]
) -> None:
    """Be this config's cluster member until cancelled."""
    keys = ClusterKeys.for_cluster(config.cluster_name)
    settings = ClusterSettings(config.vbuckets, config.replication_factor)
    async with EtcdClient.from_url(config.cluster_etcd) as client:
        node = ClusterNode(
            client, keys, node_info(config, workers), settings, config.cluster_lease_ttl
        )

        async def started(*, task_status: trio.TaskStatus[None]) -> None:
            await node.run(task_status=task_status)

        async with trio.open_nursery() as nursery:
            await nursery.start(started)
            task_status.started(node)


async def serve_member(
    serve: Serve,
    config: Config,
    load: Callable[[], Config] | None,
    workers: int,
) -> None:
    """Join the cluster, then ``serve(config, load, node)`` until it returns
    (SIGINT/SIGTERM); leaving revokes the node's lease so its partitions
    fail over at once. ``serve`` gets the ClusterNode to replicate its
    partitions (one worker) or relay its lease to its workers (several)."""
    joined = False
    try:
        async with trio.open_nursery() as nursery:
            with trio.move_on_after(JOIN_TIMEOUT):
                node = await nursery.start(run_member, config, workers)
                joined = True
            if joined:
                await serve(config, load, node)
            nursery.cancel_scope.cancel()
    except* NodeIdTaken as group:
        raise ClusterStartError(str(group.exceptions[0])) from None
    if not joined:
        raise ClusterStartError(
            f"could not join the cluster through {config.cluster_etcd} within "
            f"{JOIN_TIMEOUT:g} s (is etcd running there?)"
        )
