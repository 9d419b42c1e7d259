"""``broky cluster status``'s offsets: rows from etcd's state and the nodes'
answers (pure), a ProgressRequest over a real socket, and the command
against three real nodes (a paused follower shows as not answering)."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import trio

from broky.client.cluster import ClusterPublisher
from broky.cluster.etcd import EtcdClient
from broky.cluster.etcd_wire import KeyValue
from broky.cluster.keys import ClusterKeys
from broky.cluster.membership import Member, NodeInfo
from broky.cluster.placement import vbucket_of
from broky.cluster.progress import gather, partition_rows, render_rows
from broky.cluster.state import VbucketState
from broky.cluster.vbuckets import StoredState
from broky.replication.link import ReplicationLink
from broky.replication.local_cluster import fully_in_sync, leaders
from broky.replication.wire import PartitionProgress, Progress, ProgressRequest
from tests.cluster.history import payload
from tests.cluster.replicated import TOPIC, local_nodes, wait_status

VBUCKETS = 16


def _states(leader: str, isr: tuple[str, ...]) -> dict[int, StoredState]:
    vbucket = vbucket_of("orders", 0, VBUCKETS)
    state = VbucketState(("n1", "n2", "n3"), leader, 4, tuple((node, 1) for node in isr))
    return {vbucket: StoredState(vbucket, state, KeyValue(b"k", b"", 1, 1, 1, 0))}


def _part(role: str, end: int, hw: int, lag: tuple[tuple[str, int], ...] = ()) -> PartitionProgress:
    return PartitionProgress("orders", 0, role, 4, end, hw, lag)


def test_rows_take_placement_from_etcd_and_offsets_from_each_replica() -> None:
    answers: dict[str, Progress | str] = {
        "n1": Progress("n1", 1, (_part("leader", 120, 118, (("n2", 2), ("n3", 57))),)),
        "n2": Progress("n2", 1, (_part("follower", 118, 118),)),
        "n3": "no answer within 2.0 s",
    }
    [row] = partition_rows(VBUCKETS, _states("n1", ("n1", "n2")), answers)
    assert (row.leader, row.epoch, row.isr, row.high_watermark) == ("n1", 4, ("n1", "n2"), 118)
    by_node = {r.node: r for r in row.replicas}
    assert (by_node["n1"].log_end, by_node["n1"].lag, by_node["n1"].in_sync) == (120, 0, True)
    # n2's own log end against the leader's.
    assert (by_node["n2"].log_end, by_node["n2"].lag, by_node["n2"].in_sync) == (118, 2, True)
    # n3 did not answer: its lag as the leader last saw it.
    assert (by_node["n3"].log_end, by_node["n3"].lag, by_node["n3"].in_sync) == (None, 57, False)
    out = io.StringIO()
    render_rows([row], answers, out)
    text = out.getvalue()
    assert "node n3: no answer within 2.0 s" in text
    assert "n1*=120  n2*=118 (lag 2)  n3=? (lag 57)" in text


def test_without_the_leader_s_answer_the_high_watermark_is_unknown() -> None:
    answers: dict[str, Progress | str] = {"n2": Progress("n2", 1, (_part("follower", 7, 7),))}
    [row] = partition_rows(VBUCKETS, _states("n1", ("n1", "n2", "n3")), answers)
    assert row.high_watermark is None
    assert [(r.node, r.log_end, r.lag) for r in row.replicas] == [
        ("n1", None, None),
        ("n2", 7, None),
        ("n3", None, None),
    ]


async def test_gather_asks_every_member_over_its_replication_address() -> None:
    reply = Progress("n1", 3, (_part("leader", 5, 5),))

    async def serve(stream: trio.SocketStream) -> None:
        link = ReplicationLink(stream)
        assert await link.receive() == ProgressRequest()
        await link.send(reply)

    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()  # a paused node: connected, never answers

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        [stuck] = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        stuck_port = stuck.socket.getsockname()[1]
        members = {
            "n1": Member(NodeInfo("n1", replication_address=f"127.0.0.1:{port}"), 3, 0),
            "n2": Member(NodeInfo("n2"), 2, 0),
            "n3": Member(NodeInfo("n3", replication_address=f"127.0.0.1:{stuck_port}"), 4, 0),
        }
        with trio.fail_after(5):
            answers = await gather(members, bound=0.5)
        nursery.cancel_scope.cancel()
    assert answers == {
        "n1": reply,
        "n2": "no replication address",
        "n3": "no answer within 0.5 s",
    }


def _status(etcd_url: str, cluster: str, *flags: str) -> str:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "broky",
            "cluster",
            "status",
            "--etcd",
            etcd_url,
            "--cluster-name",
            cluster,
            *flags,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout


async def test_status_shows_each_partition_s_offsets_from_the_nodes(
    etcd_url: str, etcd: EtcdClient, prefix: bytes, tmp_path: Path
) -> None:
    cluster = "s" + prefix.decode().strip("/").replace("/", "-")
    keys = ClusterKeys.for_cluster(cluster)
    with local_nodes(etcd_url, cluster, tmp_path) as nodes, trio.fail_after(60):
        status = await wait_status(etcd, keys, lambda s: fully_in_sync(s, TOPIC, 3), 30)
        async with ClusterPublisher.open([n.address for n in nodes]) as publisher:
            [run] = await publisher.publish("orders.k1", [payload(1, i) for i in range(30)])
        acked_end = run.last_offset + 1
        name = TOPIC.name

        def caught_up(report: dict[str, object]) -> bool:
            rows = report["partitions"]
            assert isinstance(rows, list)
            [row] = [r for r in rows if r["partition"] == run.partition]
            return bool(row["high_watermark"] == acked_end) and all(
                r["log_end"] == acked_end and r["lag"] == 0 for r in row["replicas"]
            )

        while True:
            report = json.loads(
                await trio.to_thread.run_sync(_status, etcd_url, cluster, "--json", "--topic", name)
            )
            if caught_up(report):
                break
            await trio.sleep(0.2)  # polling the command's output: no event exists
        assert report["unanswered"] == {}
        [row] = [r for r in report["partitions"] if r["partition"] == run.partition]
        assert row["leader"] == leaders(status, TOPIC)[run.partition]
        assert sorted(row["isr"]) == ["n1", "n2", "n3"]
        # A paused follower's log end is unknown (it does not answer, or its
        # lease ran out first and it is no member to ask).
        follower = next(n for n in nodes if n.node_id != row["leader"])
        follower.send(signal.SIGSTOP)
        try:
            text = await trio.to_thread.run_sync(_status, etcd_url, cluster)
        finally:
            follower.send(signal.SIGCONT)
        assert re.search(rf"\b{follower.node_id}\*?=\?", text), text  # * if still in the ISR
        assert f"{name}/{run.partition}" in text
        assert f"={acked_end}" in text
