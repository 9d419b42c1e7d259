"""Router links in one process: interest propagation, one-hop forwarding, ordering."""

from __future__ import annotations

import pytest
import trio
from prometheus_client import generate_latest

import broky
from broky.mesh.link import Link
from broky.protocol.codec import encode_frame
from broky.protocol.constants import LinkKind
from broky.protocol.frames import Hello, Subscribe
from broky.protocol.framing import encode_preamble
from tests.conftest import StartBroker, raw_connection
from tests.mesh.test_nodes import take


async def _mesh(
    nursery: trio.Nursery, count: int, kind: LinkKind = LinkKind.LOCAL
) -> list[broky.Broker]:
    brokers = [broky.Broker(broky.Config(listen=False)) for _ in range(count)]
    for broker in brokers:
        await nursery.start(broker.serve)
    links: list[Link] = [
        broker.link_to(peer, kind) for broker in brokers for peer in brokers if peer is not broker
    ]
    for link in links:
        await link.ready.wait()
    return brokers


async def test_publish_on_one_router_reaches_subscribers_on_every_router(
    nursery: trio.Nursery,
) -> None:
    with trio.fail_after(10):
        brokers = await _mesh(nursery, 3)
        async with (
            brokers[0].connect() as publisher,
            brokers[1].connect() as client_b,
            brokers[2].connect() as client_c,
            client_b.subscription("orders.>") as on_b,
            client_c.subscription("orders.*") as on_c,
        ):
            payloads = [b"%d" % number for number in range(200)]
            for payload in payloads:
                await publisher.publish("orders.eu", payload)
            await publisher.flush()
            assert await take(on_b, 200) == payloads
            assert await take(on_c, 200) == payloads
            # Exactly once: nothing more arrives (no duplicates through the third router).
            await publisher.publish("orders.eu", b"end")
            assert await take(on_b, 1) == [b"end"]
            assert await take(on_c, 1) == [b"end"]
            assert on_b.statistics().buffered_messages == 0


async def test_overlapping_patterns_cross_a_link_once(nursery: trio.Nursery) -> None:
    with trio.fail_after(10):
        brokers = await _mesh(nursery, 2)
        async with (
            brokers[0].connect() as publisher,
            brokers[1].connect() as subscriber,
            subscriber.subscription("a.>") as wide,
            subscriber.subscription("a.b") as narrow,
        ):
            await publisher.publish("a.b", b"one")
            await publisher.flush()
            assert await take(wide, 1) == [b"one"]
            assert await take(narrow, 1) == [b"one"]
        forwarded = [link.forwarded_messages for link in brokers[0].statistics().router.links]
        assert sum(forwarded) == 1


async def test_subscribe_returns_after_every_linked_router_knows(nursery: trio.Nursery) -> None:
    with trio.fail_after(10):
        brokers = await _mesh(nursery, 3)
        async with (
            brokers[1].connect() as publisher_b,
            brokers[2].connect() as publisher_c,
            brokers[0].connect() as subscriber,
        ):
            for attempt in range(20):
                key = f"fresh.{attempt}"
                async with subscriber.subscription(key) as subscription:
                    # No sleep, no flush on the subscriber's side: the confirmation alone
                    # must guarantee the other routers forward this pattern.
                    await publisher_b.publish(key, b"from-b")
                    await publisher_c.publish(key, b"from-c")
                    assert sorted(await take(subscription, 2)) == [b"from-b", b"from-c"]


async def test_interest_is_withdrawn_when_the_last_subscriber_leaves(nursery: trio.Nursery) -> None:
    with trio.fail_after(10):
        brokers = await _mesh(nursery, 2)
        async with brokers[1].connect() as subscriber, brokers[0].connect() as publisher:
            async with subscriber.subscription("gone.>"):
                assert brokers[0].statistics().router.subscriptions == 1  # the link's
            await subscriber.flush()
            for _ in range(100):
                if brokers[0].statistics().router.subscriptions == 0:
                    break
                await trio.sleep(0.01)
            assert brokers[0].statistics().router.subscriptions == 0
            await publisher.publish("gone.x", b"nobody")
            await publisher.flush()
            assert brokers[0].statistics().router.dropped_no_subscriber == 1


async def test_per_publisher_order_across_routers(nursery: trio.Nursery) -> None:
    with trio.fail_after(10):
        brokers = await _mesh(nursery, 2)
        async with (
            brokers[0].connect() as publisher,
            brokers[1].connect() as subscriber,
            subscriber.subscription("seq.*") as subscription,
        ):
            for number in range(3000):
                await publisher.publish(f"seq.{number % 3}", number.to_bytes(4, "big"))
            await publisher.flush()
            got = [int.from_bytes(p, "big") for p in await take(subscription, 3000)]
            assert got == list(range(3000))


@pytest.mark.parametrize("kind", [LinkKind.LOCAL, LinkKind.CLUSTER])
async def test_a_link_reconnects_and_reannounces_interest(
    nursery: trio.Nursery, kind: LinkKind
) -> None:
    with trio.fail_after(10):
        brokers = await _mesh(nursery, 2, kind)
        async with (
            brokers[0].connect() as publisher,
            brokers[1].connect() as subscriber,
            subscriber.subscription("again") as subscription,
        ):
            # Cut every link connection brokers[0] serves: brokers[1]'s link must come back.
            for connection in list(brokers[0]._connections):
                if connection.client_name.startswith("in-process:"):
                    connection.shutdown()
            for _ in range(200):
                status = brokers[1].statistics().links[0]
                if status.connects >= 2 and status.connected:
                    break
                await trio.sleep(0.01)
            assert brokers[1].statistics().links[0].connects >= 2
            for _ in range(200):
                if brokers[0].statistics().router.subscriptions >= 1:
                    break
                await trio.sleep(0.01)
            await publisher.publish("again", b"after")
            assert await take(subscription, 1) == [b"after"]


async def test_a_stalled_link_drops_for_itself_and_never_slows_local_delivery(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(broky.Config(port=0, link_outbox_bytes=1 << 20))
    with trio.fail_after(20):
        async with (
            raw_connection(broker, receive_buffer=4096) as stalled_peer,
            broker.connect() as publisher,
            broker.connect() as local,
            local.subscription("load.>") as subscription,
        ):
            # A peer router that announces interest, then never reads again.
            await stalled_peer.send(
                encode_preamble()
                + encode_frame(Hello(client_name="stalled", link=LinkKind.LOCAL, node="other"))
                + encode_frame(Subscribe(1, b"load.>"))
            )
            for _ in range(100):
                if broker.statistics().router.subscriptions == 2:
                    break
                await trio.sleep(0.01)
            count = 60_000
            payload = bytes(200)
            received = 0

            async def consume() -> None:
                nonlocal received
                async for _ in subscription:
                    received += 1
                    if received == count:
                        return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume)
                for _ in range(count):
                    await publisher.publish("load.x", payload)
                await publisher.flush()
            assert received == count
            assert subscription.statistics().dropped_by_broker == 0
            (link,) = broker.statistics().router.links
            assert link.kind == "local"
            assert link.dropped_messages > 0
            assert link.queued_bytes <= broker.config.router_limits.link_outbox_bytes


async def test_links_are_in_the_metrics(nursery: trio.Nursery) -> None:
    with trio.fail_after(10):
        brokers = await _mesh(nursery, 2)
        async with (
            brokers[0].connect() as publisher,
            brokers[1].connect() as subscriber,
            subscriber.subscription("m.>") as subscription,
        ):
            await publisher.publish("m.x", b"1")
            assert await take(subscription, 1) == [b"1"]
        text = generate_latest(brokers[0].observability.registry).decode()
        forwarded = [
            line
            for line in text.splitlines()
            if line.startswith("broky_link_forwarded_messages_total{")
        ]
        assert len(forwarded) == 1
        assert 'kind="local"' in forwarded[0]
        assert forwarded[0].endswith(" 1.0")
        connected = [line for line in text.splitlines() if line.startswith("broky_link_connected{")]
        assert connected
        assert connected[0].endswith(" 1.0")
