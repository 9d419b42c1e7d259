"""Giving a broker its replication service, in a one-process node or a worker.

A one-process node's broker shares its loop with the ClusterNode, which is
its member (broky.cli.serve). A worker of a several-process node gets a
WorkerMember instead (broky.replication.worker_member): its own etcd client
and watched tables, and the node's lease as the supervisor relays it on the
worker's pipe. Either way the service runs beside the durable store
(``Broker.beside_store``), so it starts after the logs are recovered and
stops before they close.
"""

from __future__ import annotations

import trio

from broky.cluster.etcd import EtcdClient
from broky.cluster.isr import IsrSettings
from broky.cluster.keys import ClusterKeys
from broky.cluster.lease_relay import RelayedLease
from broky.cluster.settings import ClusterSettings
from broky.config import Config
from broky.replication.member import Member
from broky.replication.service import ReplicationService
from broky.replication.worker_member import WorkerMember, worker_listen
from broky.server import Broker


def replicates(broker: Broker, config: Config) -> bool:
    return bool(config.cluster_etcd and config.replication_listen and broker.store is not None)


def service_for(
    broker: Broker, config: Config, member: Member, listen: str, worker: int = 0
) -> ReplicationService:
    """A replication service of ``broker``'s durable store, serving on
    ``listen``, in worker ``worker`` (0: a one-process node's only one)."""
    assert broker.store is not None
    service = ReplicationService(
        broker.store,
        member,
        listen,
        IsrSettings(config.min_insync_replicas, config.replica_lag_max),
        broker.observability.system.advise,
        empty_vbuckets=worker == 0,
    )
    broker.replication_statistics = service.statistics
    return service


def attach_to_worker(broker: Broker, config: Config, index: int) -> RelayedLease | None:
    """If the node replicates, give worker ``index``'s broker its service;
    returns the lease copy the supervisor's relayed lines update."""
    if not replicates(broker, config):
        return None
    lease = RelayedLease()

    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with EtcdClient.from_url(config.cluster_etcd) as client:
            member = WorkerMember(
                client,
                ClusterKeys.for_cluster(config.cluster_name),
                config.node_id,
                ClusterSettings(config.vbuckets, config.replication_factor),
                lease,
            )
            service = service_for(
                broker, config, member, worker_listen(config.replication_listen, index), index
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(member.run)
                await nursery.start(service.run)
                task_status.started()

    broker.beside_store.append(run)
    return lease
