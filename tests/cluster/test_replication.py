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
from broky.replication.local_cluster import fully_in_sync, leaders
from tests.cluster import jepsen
from tests.cluster.history import Acked, check, payload
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


@pytest.mark.parametrize(
    "flags",
    [
        ["--workers", "2", "--cluster", "etcd://127.0.0.1:1", "--node-id", "n1"],
        ["--workers", "1"],
    ],
)
def test_serve_refuses_replication_without_one_worker_in_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    path = tmp_path / "broky.toml"
    path.write_text(f'data_dir = "{tmp_path}"\n[[durable]]\npattern = "orders.>"\n')
    arguments = ["serve", "--config", str(path), "--replication-listen", "127.0.0.1:1", *flags]
    assert main(arguments) == 2
    assert "replication_listen needs cluster_etcd and --workers 1" in capsys.readouterr().err
