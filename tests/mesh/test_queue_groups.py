"""Queue groups across routers: each message to one member, wherever it is.

In-process meshes for both tiers (workers of a node over LOCAL links, nodes
over CLUSTER links), and a real ``broky serve --workers 2``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import trio

import broky
from broky.cli import build_parser, subscribe
from broky.protocol.constants import LinkKind
from tests.durable.test_durable_broker import durable_config
from tests.mesh.test_links import _mesh
from tests.mesh.test_nodes import clients, nodes

COUNT = 300


async def drain(subscription: broky.Subscription, quiet: float = 0.3) -> list[bytes]:
    """Everything that arrives until ``quiet`` seconds pass with nothing."""
    got: list[bytes] = []
    while True:
        with trio.move_on_after(quiet) as scope:
            message = await subscription.__anext__()
        if scope.cancelled_caught:
            return got
        got.append(message.payload)


async def publish_numbered(publisher: broky.Client, count: int, tag: bytes = b"") -> None:
    for number in range(count):
        await publisher.publish("jobs.resize", tag + b"%d" % number)
    await publisher.flush()


def assert_once_each(shares: list[list[bytes]], expected: list[bytes]) -> None:
    counts = Counter(payload for share in shares for payload in share)
    assert sorted(counts) == sorted(expected), "every message reaches the group"
    assert max(counts.values()) == 1, "and exactly one member"


async def test_members_on_every_worker_share_a_publisher_s_messages_once(
    nursery: trio.Nursery,
) -> None:
    with trio.fail_after(20):
        brokers = await _mesh(nursery, 3)
        async with (
            brokers[0].connect() as publisher,
            brokers[0].connect() as local,
            brokers[1].connect() as second,
            brokers[2].connect() as third,
            brokers[2].connect() as watcher,
            local.subscription("jobs.>", queue="resizers") as on_0,
            second.subscription("jobs.*", queue="resizers") as other_pattern,
            second.subscription("jobs.>", queue="resizers") as on_1,
            third.subscription("jobs.>", queue="resizers") as on_2,
            watcher.subscription("jobs.>") as plain,
        ):
            expected = [b"%d" % n for n in range(COUNT)]
            await publish_numbered(publisher, COUNT)
            shares = [await drain(on_0), await drain(on_1), await drain(on_2)]
            assert_once_each(shares, expected)
            assert all(shares), "every router's members get a share"
            # A group of the same name on another pattern is its own group,
            # and a plain subscriber beside a member still gets everything.
            assert sorted(await drain(other_pattern)) == sorted(expected)
            assert await drain(plain) == expected


async def test_groups_span_nodes_through_the_cluster_tier(nursery: trio.Nursery) -> None:
    """Two nodes of two workers: worker links LOCAL, worker i of each node
    linked to worker i of the other (CLUSTER). Members only on the second
    worker of each node; publishers on the first worker of each."""
    with trio.fail_after(20):
        a0, a1, b0, b1 = (broky.Broker(broky.Config(listen=False)) for _ in range(4))
        for broker in (a0, a1, b0, b1):
            await nursery.start(broker.serve)
        links = [
            a0.link_to(a1),
            a1.link_to(a0),
            b0.link_to(b1),
            b1.link_to(b0),
            a0.link_to(b0, LinkKind.CLUSTER),
            b0.link_to(a0, LinkKind.CLUSTER),
            a1.link_to(b1, LinkKind.CLUSTER),
            b1.link_to(a1, LinkKind.CLUSTER),
        ]
        for link in links:
            await link.ready.wait()
        async with (
            a0.connect() as pub_a,
            b0.connect() as pub_b,
            a1.connect() as member_a,
            b1.connect() as member_b,
            member_a.subscription("jobs.>", queue="q") as on_a,
            member_b.subscription("jobs.>", queue="q") as on_b,
        ):
            expected = [b"a%d" % n for n in range(COUNT)] + [b"b%d" % n for n in range(COUNT)]
            async with trio.open_nursery() as publishing:
                publishing.start_soon(publish_numbered, pub_a, COUNT, b"a")
                publishing.start_soon(publish_numbered, pub_b, COUNT, b"b")
            shares = [await drain(on_a), await drain(on_b)]
            assert_once_each(shares, expected)
            assert all(shares)


@pytest.mark.slow
async def test_a_two_worker_node_delivers_each_message_to_one_member() -> None:
    with nodes() as start, trio.fail_after(30):
        node = start(["--workers", "2", "--accept", "handoff"])
        # Hand-off alternates connections between the workers: members and
        # publishers land on both.
        async with clients(node.address, 4) as (member_a, member_b, pub_a, pub_b):
            on_a = await member_a.subscribe("jobs.>", queue="w")
            on_b = await member_b.subscribe("jobs.>", queue="w")
            expected = [b"a%d" % n for n in range(COUNT)] + [b"b%d" % n for n in range(COUNT)]
            await publish_numbered(pub_a, COUNT, b"a")
            await publish_numbered(pub_b, COUNT, b"b")
            shares = [await drain(on_a), await drain(on_b)]
            assert_once_each(shares, expected)
            assert all(shares)


async def test_queue_groups_refuse_replay_and_durable_topics(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with trio.fail_after(20):
        broker = broky.Broker(durable_config(tmp_path))
        await nursery.start(broker.serve)
        async with broker.connect() as client:
            with pytest.raises(broky.SubscriptionError, match="durable topic 'orders'"):
                await client.subscribe("orders.eu", queue="w")
            with pytest.raises(broky.SubscriptionError, match="live only"):
                await client.subscribe("jobs.>", queue="w", start=broky.Start.earliest())
            with pytest.raises(broky.LocalProtocolError):
                await client.subscribe("jobs.>", queue="bad name")
            # The connection carries on, and an ephemeral group works beside.
            async with client.subscription("jobs.>", queue="w") as member:
                await client.publish("jobs.x", b"one")
                assert await drain(member) == [b"one"]


async def test_broky_sub_joins_a_queue_group(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with trio.fail_after(20):
        parser = build_parser()
        async with trio.open_nursery() as running, broky.connect(address) as publisher:
            for _ in range(2):
                args = parser.parse_args(
                    ["sub", "jobs.>", "--queue", "w", "--count", "5", "--address", address]
                )
                running.start_soon(subscribe, args)
            err = ""
            while err.count("in queue group w") < 2:
                await trio.sleep(0.01)
                err += capsys.readouterr().err
            for number in range(10):
                await publisher.publish("jobs.x", b"%d" % number)
        lines = capsys.readouterr().out.splitlines()
        assert sorted(lines) == sorted(f"[jobs.x] {number}" for number in range(10))
