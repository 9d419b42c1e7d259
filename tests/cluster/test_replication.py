"""The replicated data path end to end: etcd + three ``broky serve`` processes.

Acked publishes (acks = "all", RF 3) are on every replica at their acked
offsets; after the partition leader is SIGKILLed, clients find the new
leader by themselves, nothing acked is lost, the new leader serves what
was acked before, and the restarted node catches up with the same bytes.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from broky.cli import main
from broky.client.cluster import ClusterPublisher
from broky.client.tcp import connect
from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.status import ClusterStatus
from broky.durable.ownership import partition_owner
from broky.replication.local_cluster import fully_in_sync, leaders
from tests.cluster import jepsen
from tests.cluster.history import Acked, check, payload
from tests.cluster.net_faults import Probe
from tests.cluster.replicated import TOPIC, local_nodes, wait_status

#: Bound for the cluster to settle (join, place, elect, catch up) on a loaded CI box.
SETTLE = 30.0


@pytest.fixture
def cluster_name(prefix: bytes) -> str:
    return "r" + prefix.decode().strip("/").replace("/", "-")


async def test_acked_publishes_survive_a_leader_kill_on_every_replica(
    etcd_url: str, etcd: EtcdClient, cluster_name: str, tmp_path: Path
) -> None:
    keys = ClusterKeys.for_cluster(cluster_name)
    in_sync = lambda status: fully_in_sync(status, TOPIC, 3)  # noqa: E731
    with local_nodes(etcd_url, cluster_name, tmp_path) as nodes:
        by_id = {node.node_id: node for node in nodes}
        status = await wait_status(etcd, keys, in_sync, SETTLE)
        acked: list[Acked] = []
        events: list[dict[str, Any]] = []
        async with trio.open_nursery() as watchers:
            async with ClusterPublisher.open(
                [n.address for n in nodes], retry_for=SETTLE
            ) as publisher:

                async def publish(seq: int) -> None:
                    runs = await publisher.publish(f"orders.k{seq % 8}", [payload(1, seq)])
                    acked.append(Acked(1, seq, runs[0].partition, runs[0].first_offset))

                for seq in range(40):
                    await publish(seq)
                victim = leaders(status, TOPIC)[acked[0].partition]
                assert victim is not None
                for node in nodes:
                    if node.node_id != victim:
                        await watchers.start(_watch_cluster_events, node.address, events)
                by_id[victim].stop(signal.SIGKILL)
                killed_at = trio.current_time()
                await publish(40)  # the first partition again: it must fail over
                failover = trio.current_time() - killed_at
                for seq in range(41, 80):
                    await publish(seq)
                status = await wait_status(
                    etcd, keys, lambda s: leaders(s, TOPIC)[acked[0].partition] != victim, SETTLE
                )
                new_leader = by_id[str(leaders(status, TOPIC)[acked[0].partition])]
                wanted = {
                    (a.offset, payload(a.client, a.seq))
                    for a in acked
                    if a.partition == acked[0].partition
                }
                # The new leader serves everything acked, and so does the other
                # survivor, a follower (up to the high watermark it was told).
                survivors = [n for n in nodes if n.node_id != victim]
                for node in sorted(survivors, key=lambda n: n is not new_leader):
                    async with connect(node.address) as reader:
                        with trio.fail_after(SETTLE):
                            while True:
                                served = await reader.fetch(
                                    TOPIC.name, acked[0].partition, 0, 1 << 20
                                )
                                if wanted <= {(m.offset, m.payload) for m in served}:
                                    break
                                await trio.sleep(0.05)
            print(f"writable again {failover:.2f} s after the leader's SIGKILL")
            by_id[victim].start()
            await wait_status(etcd, keys, in_sync, SETTLE)
            await trio.sleep(0.5)  # the last fetches carry the final high watermark
            watchers.cancel_scope.cancel()
        # The new leader advised its leadership and the partition's episode
        # of under-replication, from the victim's death to its catching up.
        mine = [
            (e["kind"], e.get("added"))
            for e in events
            if e["partition"] == acked[0].partition and e["node"] == new_leader.node_id
        ]
        assert mine[:2] == [("cluster.leader_changed", None), ("cluster.under_replicated", None)]
        assert ("cluster.isr_expanded", [victim]) in mine
        assert mine[-1] == ("cluster.fully_replicated", None)
        for node in nodes:
            node.stop(signal.SIGTERM)
        verdict = check(acked, {n.node_id: n.records(TOPIC.name) for n in nodes}, by_id)
        assert verdict.ok, verdict
        assert verdict.acked == 80


async def _watch_cluster_events(
    address: str, events: list[dict[str, Any]], task_status: trio.TaskStatus[None]
) -> None:
    async with connect(address) as client, client.subscription("$SYS.events.cluster.>") as sub:
        await client.flush()  # the subscription is in place before we go on
        task_status.started()
        # The list must grow while this runs (it ends by cancellation).
        async for message in sub:
            events.append(json.loads(message.payload))  # noqa: PERF401


async def test_jepsen_style_faults_lose_no_acked_publish(
    etcd_url: str, etcd: EtcdClient, cluster_name: str, tmp_path: Path
) -> None:
    """20 fault cycles (kills and pauses of leaders and followers) under
    acked load; then every acked publish is on every replica at its offset,
    replicas agree byte for byte, and per-client order holds; and nothing is
    stored twice (retries of publishes a deposed leader had stored are
    recognised by the new leader: one producer id across nodes)."""
    with trio.fail_after(240):
        report = await jepsen.run(etcd_url, etcd, cluster_name, tmp_path, cycles=20)
    print(report.summary())
    assert report.verdict is not None
    assert report.verdict.ok, report.verdict
    assert report.verdict.duplicates == 0, report.summary()
    assert report.cycles == 20
    assert len(report.acked) > 200


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_refuses_replication_outside_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: str
) -> None:
    path = tmp_path / "broky.toml"
    path.write_text(f'data_dir = "{tmp_path}"\n[[durable]]\npattern = "orders.>"\n')
    arguments = ["serve", "--config", str(path), "--replication-listen", "127.0.0.1:1"]
    assert main([*arguments, "--workers", workers]) == 2
    assert "replication_listen needs cluster_etcd" in capsys.readouterr().err


async def test_nodes_of_two_workers_replicate_and_fail_over(
    etcd_url: str, etcd: EtcdClient, cluster_name: str, tmp_path: Path
) -> None:
    """Each worker replicates the partitions it owns (4 partitions over 2
    workers: both workers of every node lead or follow some); a leader
    node's SIGKILL fails its partitions over, and after its restart every
    acked publish is on all three replicas."""
    keys = ClusterKeys.for_cluster(cluster_name)
    in_sync = lambda status: fully_in_sync(status, TOPIC, 3)  # noqa: E731
    with local_nodes(etcd_url, cluster_name, tmp_path, workers=2) as nodes:
        by_id = {node.node_id: node for node in nodes}
        status = await wait_status(etcd, keys, in_sync, SETTLE * 2)
        acked: list[Acked] = []
        async with ClusterPublisher.open([n.address for n in nodes], retry_for=SETTLE) as publisher:

            async def publish(seq: int) -> None:
                runs = await publisher.publish(f"orders.k{seq % 8}", [payload(1, seq)])
                acked.append(Acked(1, seq, runs[0].partition, runs[0].first_offset))

            with trio.fail_after(SETTLE * 2):
                for seq in range(40):
                    await publish(seq)
                # Partitions owned by each of the two workers were acked.
                assert {partition_owner(TOPIC.name, a.partition, 2) for a in acked} == {0, 1}
                victim = leaders(status, TOPIC)[acked[0].partition]
                assert victim is not None
                by_id[victim].stop(signal.SIGKILL)
                for seq in range(40, 80):
                    await publish(seq)
        by_id[victim].start()
        await wait_status(etcd, keys, in_sync, SETTLE * 2)
        await trio.sleep(0.5)  # the last fetches carry the final high watermark
        for node in nodes:
            node.stop(signal.SIGTERM)
        verdict = check(acked, {n.node_id: n.records(TOPIC.name) for n in nodes}, by_id)
        assert verdict.ok, verdict
        assert verdict.acked == 80


async def test_a_paused_supervisor_s_workers_ack_nothing_past_its_lease(
    etcd_url: str, etcd: EtcdClient, cluster_name: str, tmp_path: Path
) -> None:
    """SIGSTOP a leader node's supervisor (its lease holder) while its two
    workers keep serving clients: a probe publishing to them gets no ack
    after the lease can have expired; the partition fails over; after
    SIGCONT the node comes back as a new life (relayed to its workers) and
    everything the probe was acked is on all three replicas."""
    keys = ClusterKeys.for_cluster(cluster_name)
    in_sync = lambda status: fully_in_sync(status, TOPIC, 3)  # noqa: E731
    with local_nodes(etcd_url, cluster_name, tmp_path, workers=2) as nodes:
        by_id = {node.node_id: node for node in nodes}
        status = await wait_status(etcd, keys, in_sync, SETTLE * 2)
        life = {node: member.epoch for node, member in status.members.items()}
        victim = by_id[str(leaders(status, TOPIC)[0])]
        async with ClusterPublisher.open([n.address for n in nodes], retry_for=SETTLE) as warm:
            for key in range(8):  # every worker serves its partitions
                await warm.publish(f"orders.probe.k{key}", [b"warm-up"])
        probe = Probe(victim, 0.0, 0)
        acked: list[Acked] = []
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(probe.run)
                victim.send(signal.SIGSTOP)  # the supervisor only
                probe.cut_at = trio.current_time()
                await wait_status(
                    etcd, keys, lambda s: leaders(s, TOPIC)[0] != victim.node_id, SETTLE
                )
                await trio.sleep(1.0)  # the probe keeps publishing to the deposed workers
                # Redirected by the deposed workers to the new leaders: their
                # NotLeader must name those (a cancelled leadership once
                # restored its old hint, naming itself, and clients looped).
                async with ClusterPublisher.open([victim.address], retry_for=SETTLE) as redirected:
                    for seq in range(8):
                        [run] = await redirected.publish(f"orders.k{seq}", [payload(2, seq)])
                        acked.append(Acked(2, seq, run.partition, run.first_offset))
                nursery.cancel_scope.cancel()
        finally:
            victim.send(signal.SIGCONT)
        print(f"probe: {probe.seq} published, {len(probe.acked)} acked, ended {probe.ended!r}")
        assert probe.seq > 10, probe.ended  # its workers kept answering clients meanwhile
        assert not probe.late, probe.late

        def back(status: ClusterStatus) -> bool:
            member = status.members.get(victim.node_id)
            fresh = member is not None and member.epoch != life[victim.node_id]
            return fresh and fully_in_sync(status, TOPIC, 3)

        await wait_status(etcd, keys, back, SETTLE * 2)
        await trio.sleep(0.5)
        for node in nodes:
            node.stop(signal.SIGTERM)
        replicas = {n.node_id: n.records(TOPIC.name) for n in nodes}
        verdict = check([*probe.acked, *acked], replicas, by_id)
        assert verdict.ok, verdict
