"""Link-partition faults for the Jepsen-style run (tests/cluster/jepsen.py),
over real network namespaces (tests/cluster/netns.py).

- ``net_cut_follower``: a follower silently cut from the other nodes while it
  still sees etcd and clients: it keeps its lease, drops out of the ISRs,
  and must catch up after the heal to come back.
- ``net_isolate_leader``: a leader cut from etcd and from its peers while
  clients still reach it. Its lease runs out (a TTL), the controller elects
  a new leader from the ISR, and the old one must ack nothing after its
  lease is gone: a probe publishes to it directly through the partition
  (see ``Probe``) and every ack it gets is checked.
- ``net_etcd_cut_leader``: a leader cut from etcd only; its followers and
  clients still reach it. Its followers keep acking it until they see the
  new leader in etcd, so the probe may get acks before its lease is gone,
  never after.
- ``net_down_follower`` / ``net_down_leader``: the node's link is down,
  it reaches no one (etcd, peers, clients); it comes back as a new life.

Each lasts ``ISOLATION`` seconds (past the lease TTL and replica_lag_max),
then every cut is healed.
"""

from __future__ import annotations

import attrs
import trio

from broky.client.client import Client
from broky.client.errors import BrokyError
from broky.client.tcp import connect
from broky.replication.local_cluster import LocalNode
from tests.cluster.history import Acked, payload
from tests.cluster.netns import Network

NET_FAULTS = (
    "net_cut_follower",
    "net_isolate_leader",
    "net_etcd_cut_leader",
    "net_down_follower",
    "net_down_leader",
)
#: Seconds a cut lasts: past the 1 s lease TTL and replica_lag_max (1 s).
ISOLATION = 2.0
#: The node lease TTL the local nodes run with (broky.cluster.node).
LEASE_TTL = 1.0
#: Client number of the probe's payloads (publishers are 0, 1, 2, ...).
PROBE_CLIENT = 1000


@attrs.define
class Probe:
    """Publishes to one isolated leader, one message at a time, and keeps
    what it acked; ``late`` are acks of publishes sent after the leader's
    lease was certainly gone (cut time + TTL): a zombie acknowledging.
    (An ack received after that point may have been given just before it,
    so the send time is what is judged.)"""

    node: LocalNode
    cut_at: float
    seq: int
    acked: list[Acked] = attrs.field(factory=list)
    late: list[str] = attrs.field(factory=list)
    #: Why the probe's connection ended before it was cancelled.
    ended: str = ""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Publish until cancelled; started once connected (or failed to)."""
        connected = False
        try:
            async with connect(self.node.address, name="probe") as client:
                connected = True
                task_status.started()
                while True:
                    await self._one(client)
        except (BrokyError, OSError) as exc:
            self.ended = repr(exc)  # the node closed on us: nothing more to ack
            if not connected:
                task_status.started()

    async def _one(self, client: Client) -> None:
        """One publish, waited for until answered (acked, or refused when the
        node steps down), so that an ack is always this publish's."""
        seq = self.seq
        self.seq += 1
        sent = trio.current_time()
        try:
            await client.publish(f"orders.probe.k{seq % 8}", payload(PROBE_CLIENT, seq), ack=True)
            runs = await client.flush_acks()
        except BrokyError:
            await trio.sleep(0.05)  # refused (NotLeader...): what a cut leader must say
            return
        for run in runs:
            self.acked.append(Acked(PROBE_CLIENT, seq, run.partition, run.first_offset))
            # Sent after the lease was surely gone, so acked after it too.
            if sent > self.cut_at + LEASE_TTL:
                self.late.append(
                    f"{self.node.node_id} acked probe {seq} at {run.partition}/"
                    f"{run.first_offset}, sent {sent - self.cut_at:.2f} s after its cut"
                )


async def apply(
    kind: str,
    network: Network,
    victim: LocalNode,
    nodes: list[LocalNode],
    probe_seq: int,
) -> Probe | None:
    """Run one network fault on ``victim`` and heal it; the isolated
    leader's probe (None for other faults)."""
    others = [n.node_id for n in nodes if n is not victim]
    probe = None
    if kind == "net_cut_follower":
        network.cut_off(victim.node_id, others)
        await trio.sleep(ISOLATION)
    elif kind in ("net_isolate_leader", "net_etcd_cut_leader"):
        network.cut_off(
            victim.node_id, ["etcd"] if kind == "net_etcd_cut_leader" else ["etcd", *others]
        )
        probe = Probe(victim, trio.current_time(), probe_seq)
        async with trio.open_nursery() as nursery:
            await nursery.start(probe.run)
            await trio.sleep(ISOLATION)
            network.heal_all()
            # Acks that were on their way when the cut healed still count.
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
    elif kind in ("net_down_follower", "net_down_leader"):
        network.isolate(victim.node_id)
        await trio.sleep(ISOLATION)
    else:
        raise ValueError(f"unknown network fault {kind!r}")
    network.heal_all()
    return probe
