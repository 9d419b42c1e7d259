"""A Jepsen-style run against three replicated nodes: clients publish with
acks while a nemesis kills and pauses nodes; then the history is checked.

Shared by the CI test (20 cycles) and ``scripts/jepsen_replication.py``
(as many as asked). Faults, one per cycle, chosen by a seeded random:

- ``kill_leader``: SIGKILL the leader of a random partition, restart it
  0.2 s later (a new life: it must truncate and catch up before it counts);
- ``pause_leader``: SIGSTOP a leader for 1.5 lease TTLs, then SIGCONT: a
  zombie leader that missed its own deposition (wave2 §3.4);
- ``kill_follower`` / ``pause_follower`` (0.5 s, under the TTL: it lags
  and may leave the ISR, but keeps its lease);
- ``isolate_leader`` / ``isolate_follower``: cut the node's replication
  links for 2 s while it keeps its etcd lease (SIGUSR1/SIGUSR2,
  broky.replication.faults), a simulated link partition: a cut leader's
  ISR shrinks to itself, so it refuses publishes (NotEnoughReplicas)
  until its followers are back; a cut follower leaves the ISR.

The faults above simulate link partitions by cutting Broky's replication
links (etcd stays reachable). With a ``network`` (tests/cluster/netns.py:
etcd and every node in a network namespace of its own) the run can also
cut real links instead (tests/cluster/net_faults.py: a follower cut off
from its peers, a leader isolated from etcd and peers while a probe keeps
publishing to it, a node's link down); an isolated leader must then ack
nothing after its lease is gone (``Report.late_acks``). After each fault the run
waits until every partition has its three replicas in sync again, so that
faults do not pile up beyond what RF 3 / min_insync 2 promises to survive.

Failover time is measured per ``kill_leader``: from the SIGKILL to the
first ack on each partition the victim led (publishers retry through it).
"""

from __future__ import annotations

import itertools
import random
import signal
import statistics
from pathlib import Path

import attrs
import trio

from broky.client.cluster import ClusterPublisher
from broky.client.errors import BrokyError
from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.local_etcd import local_etcd
from broky.cluster.status import ClusterStatus, read_status
from broky.replication.local_cluster import LocalNode, fully_in_sync, leaders
from tests.cluster import net_faults
from tests.cluster.history import Acked, Verdict, check, payload
from tests.cluster.netns import Network
from tests.cluster.replicated import TOPIC, local_nodes, wait_status

#: Bound for the cluster to be fully in sync again after a fault.
HEAL_BOUND = 20.0
#: Messages per acked batch, and pause between a client's batches.
BATCH = 2
PUBLISH_PAUSE = 0.01
FAULTS = (
    "kill_leader",
    "pause_leader",
    "kill_follower",
    "pause_follower",
    "isolate_leader",
    "isolate_follower",
)
#: Seconds a node's replication links stay cut: past replica_lag_max (1 s),
#: so its partners' ISRs shrink, and it must catch up to come back.
ISOLATION = 2.0


@attrs.define
class Report:
    cycles: int = 0
    faults: dict[str, int] = attrs.field(factory=dict)
    acked: list[Acked] = attrs.field(factory=list)
    #: Batches whose publish raised after all retries (outcome unknown).
    indeterminate: int = 0
    #: Why they did (the first few errors, with when and which key), so a
    #: failed assertion on ``indeterminate`` says what refused them.
    gave_up: list[str] = attrs.field(factory=list)
    retries: int = 0
    #: Seconds from each leader SIGKILL to the next ack on each partition it led.
    failovers: list[float] = attrs.field(factory=list)
    #: Acks an isolated leader's probe got, and those it got after the
    #: leader's lease was gone (must stay empty).
    probe_published: int = 0
    probe_acks: int = 0
    late_acks: list[str] = attrs.field(factory=list)
    verdict: Verdict | None = None

    @property
    def ok(self) -> bool:
        return self.verdict is not None and self.verdict.ok and not self.late_acks

    def summary(self) -> dict[str, object]:
        times = sorted(self.failovers)

        def pick(q: float) -> float | None:
            return round(times[min(len(times) - 1, int(q * len(times)))], 3) if times else None

        verdict = self.verdict
        return {
            "cycles": self.cycles,
            "faults": self.faults,
            "acked_messages": len(self.acked),
            "indeterminate_batches": self.indeterminate,
            "client_retries": self.retries,
            "lost": None if verdict is None else len(verdict.lost),
            "divergent_offsets": None if verdict is None else len(verdict.divergent),
            "duplicates": None if verdict is None else verdict.duplicates,
            "out_of_order": None if verdict is None else len(verdict.out_of_order),
            "isolated_leader_probe_acks": self.probe_acks,
            "acks_after_lease_lost": len(self.late_acks),
            "failover_s": {
                "count": len(times),
                "p50": pick(0.5),
                "p90": pick(0.9),
                "max": times[-1] if times else None,
                "mean": round(statistics.fmean(times), 3) if times else None,
            },
        }


async def run(
    etcd_url: str,
    etcd: EtcdClient,
    cluster: str,
    directory: Path,
    cycles: int,
    seed: int = 15,
    clients: int = 3,
    faults: tuple[str, ...] = FAULTS,
    network: Network | None = None,
    workers: int = 1,
) -> Report:
    """``faults`` may name net_faults.NET_FAULTS only with a ``network``
    whose host "etcd" runs ``etcd_url``. With ``workers`` > 1 only kills and
    network faults act on a whole node (signals reach its supervisor only)."""
    keys = ClusterKeys.for_cluster(cluster)
    report = Report()
    chooser = random.Random(seed)
    acks: dict[int, list[float]] = {p: [] for p in range(TOPIC.partitions)}
    with local_nodes(etcd_url, cluster, directory, network=network, workers=workers) as nodes:
        by_id = {node.node_id: node for node in nodes}
        await wait_status(etcd, keys, lambda s: fully_in_sync(s, TOPIC, 3), HEAL_BOUND * 2)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for client in range(clients):
                nursery.start_soon(_publisher, nodes, client, stop, report, acks)
            for _ in range(cycles):
                await _fault(chooser, faults, etcd, keys, by_id, report, acks, network)
                report.cycles += 1
            stop.set()
        for node in nodes:
            if not node.running:
                node.start()
            node.send(signal.SIGCONT)
        await wait_status(etcd, keys, lambda s: fully_in_sync(s, TOPIC, 3), HEAL_BOUND)
        await trio.sleep(0.5)  # the last fetches carry the final high watermark
        for node in nodes:
            node.stop(signal.SIGTERM)
        report.verdict = check(
            report.acked, {n.node_id: n.records(TOPIC.name) for n in nodes}, by_id
        )
    return report


async def run_partitioned(
    directory: Path, cycles: int, seed: int = 15, clients: int = 3, workers: int = 1
) -> Report:
    """``run`` with real link partitions only: etcd and three nodes each in
    a network namespace (NetnsUnavailable if they cannot be made), every
    namespace and process removed at the end."""
    with Network.open() as network:
        host = network.add("etcd", 2)
        with local_etcd(directory / "etcd", host=host.address, wrapper=host.wrapper) as url:
            async with EtcdClient.from_url(url) as etcd:
                return await run(
                    url,
                    etcd,
                    "partitions",
                    directory,
                    cycles,
                    seed,
                    clients,
                    faults=net_faults.NET_FAULTS,
                    network=network,
                    workers=workers,
                )


async def _publisher(
    nodes: list[LocalNode],
    client: int,
    stop: trio.Event,
    report: Report,
    acks: dict[int, list[float]],
    keys: int = 8,
) -> None:
    """Publish acked batches of ``keys`` keys (so partitions) until ``stop``,
    from as many tasks as the publisher keeps batches in flight: their
    sequence numbers are taken in call order, so the checker's per-partition
    order covers the pipeline (a refused batch must not be overtaken)."""
    seqs = itertools.count(0, BATCH)
    async with ClusterPublisher.open([n.address for n in nodes], name=f"c{client}") as publisher:

        async def publish() -> None:
            while not stop.is_set():
                seq = next(seqs)
                key = f"orders.c{client}.k{seq % keys}"
                batch = [payload(client, seq + i) for i in range(BATCH)]
                try:
                    runs = await publisher.publish(key, batch)
                except BrokyError as error:
                    report.indeterminate += 1
                    if len(report.gave_up) < 10:
                        report.gave_up.append(f"{trio.current_time():.2f} {key}: {error!r}")
                else:
                    acked_at = trio.current_time()
                    for run in runs:
                        acks[run.partition].append(acked_at)
                        for index, offset in enumerate(
                            range(run.first_offset, run.last_offset + 1)
                        ):
                            report.acked.append(Acked(client, seq + index, run.partition, offset))
                await trio.sleep(PUBLISH_PAUSE)

        async with trio.open_nursery() as nursery:
            for _ in range(publisher.max_in_flight):
                nursery.start_soon(publish)
        report.retries += publisher.retries


async def _fault(
    chooser: random.Random,
    faults: tuple[str, ...],
    etcd: EtcdClient,
    keys: ClusterKeys,
    by_id: dict[str, LocalNode],
    report: Report,
    acks: dict[int, list[float]],
    network: Network | None,
) -> None:
    kind = chooser.choice(faults)
    report.faults[kind] = report.faults.get(kind, 0) + 1
    status = await read_status(etcd, keys)
    led = leaders(status, TOPIC)
    partition = chooser.randrange(TOPIC.partitions)
    leader = led[partition]
    assert leader is not None
    if kind.endswith("leader"):
        victim = by_id[leader]
    else:
        victim = by_id[chooser.choice(sorted(set(by_id) - {leader}))]
    affected = [p for p, node in led.items() if node == victim.node_id]
    life = status.members[victim.node_id].epoch
    started = trio.current_time()
    if kind in net_faults.NET_FAULTS:
        assert network is not None, f"{kind} needs a network of namespaces"
        probe = await net_faults.apply(
            kind, network, victim, list(by_id.values()), report.probe_published
        )
        if probe is not None:
            report.probe_published = probe.seq
            report.acked.extend(probe.acked)
            report.probe_acks += len(probe.acked)
            report.late_acks.extend(probe.late)
    elif kind.startswith("kill"):
        victim.stop(signal.SIGKILL)
        await trio.sleep(0.2)
        victim.start()
    elif kind.startswith("isolate"):
        victim.send(signal.SIGUSR1)
        await trio.sleep(ISOLATION)
        victim.send(signal.SIGUSR2)
    else:
        victim.send(signal.SIGSTOP)
        await trio.sleep(1.5 if kind == "pause_leader" else 0.5)
        victim.send(signal.SIGCONT)
    # A kill, a pause past the lease or a cut from etcd ends the victim's
    # life: wait for its next one to be back in every ISR (before that etcd
    # may still show the old life in sync).
    new_life = kind.startswith(("kill", "net_down")) or kind in (
        "pause_leader",
        "net_isolate_leader",
    )

    def healed(status: ClusterStatus) -> bool:
        member = status.members.get(victim.node_id)
        if new_life and (member is None or member.epoch == life):
            return False
        return fully_in_sync(status, TOPIC, 3)

    await wait_status(etcd, keys, healed, HEAL_BOUND)
    if kind == "kill_leader":
        for p in affected:
            after = [t for t in acks[p] if t > started]
            if after:
                report.failovers.append(min(after) - started)
