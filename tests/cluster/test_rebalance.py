"""Rebalancing end to end: etcd + ``broky serve`` processes under acked load.

Three nodes with replication factor 2; a fourth joins and takes its share
(replicas caught up before they count, leaderships handed over); then
``broky cluster remove-node`` removes one of the first three for good: its
replicas are re-created on the others and its copies deleted. All along,
clients publish with acks = "all"; at the end every acked publish is on
every in-sync replica of its partition at its acked offset, and replicas
agree byte for byte.
"""

from __future__ import annotations

import signal
import sys
from collections import Counter
from pathlib import Path

import pytest
import trio

from broky.cluster.etcd import EtcdClient
from broky.cluster.keys import ClusterKeys
from broky.cluster.status import ClusterStatus
from broky.replication.local_cluster import (
    VBUCKETS,
    LocalNode,
    TopicSpec,
    balanced,
    partition_vbuckets,
)
from tests.cluster import jepsen
from tests.cluster.history import Record, check
from tests.cluster.replicated import wait_status

#: Bound for each phase to settle (start, join, removal) on a loaded CI box.
SETTLE = 60.0
CLIENTS = 2
#: More partitions than vbuckets, so some vbuckets hold two partitions,
#: both with data (KEYS keys spread over them): a new replica joins such a
#: vbucket's ISR only once it has caught up on both.
TOPIC = TopicSpec(partitions=VBUCKETS + 4)
KEYS = 48


@pytest.fixture
def cluster_name(prefix: bytes) -> str:
    return "m" + prefix.decode().strip("/").replace("/", "-")


def four_nodes(etcd_url: str, cluster_name: str, directory: Path) -> list[LocalNode]:
    return [
        LocalNode(etcd_url, cluster_name, f"n{i}", directory / f"n{i}", TOPIC, replication_factor=2)
        for i in range(1, 5)
    ]


def stop_and_read(nodes: list[LocalNode]) -> dict[str, dict[int, list[Record]]]:
    """Stop every node cleanly, then read its files."""
    for node in nodes:
        node.stop(signal.SIGTERM)
    return {node.node_id: node.records(TOPIC.name) for node in nodes}


def verify(
    report: jepsen.Report,
    held: dict[str, dict[int, list[Record]]],
    final: ClusterStatus,
) -> tuple[int, int]:
    """Every acked publish on every in-sync replica of its partition, at
    its acked offset; replicas identical. Returns (duplicates, partitions
    n4 is in sync for)."""
    duplicates = 0
    on_n4 = 0
    for partition, vbucket in partition_vbuckets(TOPIC).items():
        in_sync = [node for node, _ in final.vbuckets[vbucket].state.isr]
        on_n4 += "n4" in in_sync
        verdict = check(
            [a for a in report.acked if a.partition == partition],
            {node: {partition: records.get(partition, [])} for node, records in held.items()},
            in_sync,
        )
        assert verdict.ok, (partition, verdict)
        duplicates += verdict.duplicates
    return duplicates, on_n4


async def test_a_joining_node_takes_its_share_and_a_removed_node_hands_its_replicas_over(
    etcd_url: str, etcd: EtcdClient, cluster_name: str, tmp_path: Path
) -> None:
    keys = ClusterKeys.for_cluster(cluster_name)
    nodes = four_nodes(etcd_url, cluster_name, tmp_path)
    first, joining = nodes[:3], nodes[3]
    report = jepsen.Report()
    acks: dict[int, list[float]] = {p: [] for p in range(TOPIC.partitions)}
    try:
        for node in first:
            node.start()
        with trio.fail_after(SETTLE * 3 + 30):
            await wait_status(etcd, keys, lambda s: balanced(s, {"n1", "n2", "n3"}), SETTLE)
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                for client in range(CLIENTS):
                    nursery.start_soon(jepsen._publisher, first, client, stop, report, acks, KEYS)
                await trio.sleep(2.0)  # the new replicas have a log to catch up
                joining.start()
                join_started = trio.current_time()
                after_join = await wait_status(
                    etcd, keys, lambda s: balanced(s, {"n1", "n2", "n3", "n4"}), SETTLE
                )
                join_took = trio.current_time() - join_started
                acked_at_join = len(report.acked)
                await trio.sleep(1.0)
                remove_started = trio.current_time()
                await _remove_node(etcd_url, cluster_name, "n1")
                final = await wait_status(
                    etcd, keys, lambda s: balanced(s, {"n2", "n3", "n4"}), SETTLE
                )
                remove_took = trio.current_time() - remove_started
                await trio.sleep(1.0)
                stop.set()
            await trio.sleep(0.5)  # the last fetches carry the final high watermark
        leads = Counter(s.state.leader for s in after_join.vbuckets.values())
        assert leads["n4"] >= VBUCKETS // 4 - 1, leads  # it leads its share
        assert "n1" in final.decommissioned
        held = stop_and_read(nodes)
    finally:
        for node in nodes:
            node.stop(signal.SIGKILL)
    # The removed node deleted every copy once its moves had ended.
    assert not any(held["n1"].values()), {p: len(r) for p, r in held["n1"].items()}
    duplicates, on_n4 = verify(report, held, final)
    print(
        f"join at {join_started:.2f} balanced in {join_took:.2f} s, removal at "
        f"{remove_started:.2f} in {remove_took:.2f} s; "
        f"acked {len(report.acked)} ({acked_at_join} before the join settled), "
        f"duplicates {duplicates}, indeterminate batches {report.indeterminate}, "
        f"client retries {report.retries}; n4 holds {on_n4} of {TOPIC.partitions} partitions"
    )
    assert len(report.acked) > acked_at_join > 0
    # Publishes kept working through the moves: none gave up (10 s of retries).
    assert report.indeterminate == 0, report.gave_up


async def test_moves_carry_on_after_the_controller_and_the_new_node_are_killed(
    etcd_url: str, etcd: EtcdClient, cluster_name: str, tmp_path: Path
) -> None:
    """Moves are steps in etcd: a new controller carries on those its
    predecessor began, and a move whose new replica restarts (a new life,
    out of the ISR) waits for it to catch up again."""
    keys = ClusterKeys.for_cluster(cluster_name)
    nodes = four_nodes(etcd_url, cluster_name, tmp_path)
    by_id = {node.node_id: node for node in nodes}
    report = jepsen.Report()
    acks: dict[int, list[float]] = {p: [] for p in range(TOPIC.partitions)}
    killed = []
    try:
        for node in nodes[:3]:
            node.start()
        with trio.fail_after(SETTLE * 3 + 30):
            everyone = {"n1", "n2", "n3", "n4"}
            await wait_status(etcd, keys, lambda s: balanced(s, {"n1", "n2", "n3"}), SETTLE)
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                for client in range(CLIENTS):
                    nursery.start_soon(
                        jepsen._publisher, nodes[:3], client, stop, report, acks, KEYS
                    )
                await trio.sleep(1.0)
                nodes[3].start()
                for role in ("controller", "new node"):
                    status = await wait_status(
                        etcd, keys, lambda s: bool(s.moving()) or balanced(s, everyone), SETTLE
                    )
                    victim = by_id[str(status.controller) if role == "controller" else "n4"]
                    killed.append((role, victim.node_id, len(status.moving())))
                    victim.stop(signal.SIGKILL)
                    await trio.sleep(0.3)
                    victim.start()
                final = await wait_status(etcd, keys, lambda s: balanced(s, everyone), SETTLE)
                await trio.sleep(1.0)
                stop.set()
            await trio.sleep(0.5)  # the last fetches carry the final high watermark
        held = stop_and_read(nodes)
    finally:
        for node in nodes:
            node.stop(signal.SIGKILL)
    duplicates, on_n4 = verify(report, held, final)
    print(
        f"killed (role, node, vbuckets moving): {killed}; acked {len(report.acked)}, "
        f"duplicates {duplicates}, n4 in sync for {on_n4} of {TOPIC.partitions} partitions"
    )
    assert killed[0][2] > 0, "the controller was killed with no move under way"
    assert len(report.acked) > 0


async def _remove_node(etcd_url: str, cluster_name: str, node_id: str) -> None:
    """``broky cluster remove-node`` as an operator runs it."""
    done = await trio.run_process(
        [
            sys.executable,
            "-m",
            "broky",
            "cluster",
            "remove-node",
            node_id,
            "--etcd",
            etcd_url,
            "--cluster-name",
            cluster_name,
        ],
        capture_stdout=True,
    )
    assert f"node {node_id} removed for good" in done.stdout.decode()
