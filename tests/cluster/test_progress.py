"""``broky cluster status``'s offsets: rows from etcd's state and the nodes'
answers (pure), and a node answering a ProgressRequest over a real socket."""

from __future__ import annotations

import io
from functools import partial

import trio

from broky.cluster.etcd_wire import KeyValue
from broky.cluster.membership import Member, NodeInfo
from broky.cluster.placement import vbucket_of
from broky.cluster.progress import gather, partition_rows, render_rows
from broky.cluster.state import VbucketState
from broky.cluster.vbuckets import StoredState
from broky.replication.link import ReplicationLink
from broky.replication.wire import PartitionProgress, Progress, ProgressRequest

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

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        members = {
            "n1": Member(NodeInfo("n1", replication_address=f"127.0.0.1:{port}"), 3, 0),
            "n2": Member(NodeInfo("n2"), 2, 0),
        }
        with trio.fail_after(5):
            answers = await gather(members)
        nursery.cancel_scope.cancel()
    assert answers == {"n1": reply, "n2": "no replication address"}
