"""Black-box tests: a real broker on a free port, reached over TCP.

Clients are ``broky.connect`` (the library) or a raw socket speaking the
protocol frame by frame (conftest's RawConnection), for what the library
would never send. Every guarantee checked here is one docs/protocol.md or the
README states.
"""

from __future__ import annotations

import os
import struct
import time
from collections import Counter
from collections.abc import Callable
from functools import partial

import pytest
import trio
import trio.lowlevel

import broky
from broky import Broker, Config, ErrorCode, Message, SlowConsumerPolicy, Subscription
from broky.protocol.codec import encode_frame
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES, MIN_MAX_FRAME_BYTES, NoticeKind
from broky.protocol.errors import LocalProtocolError
from broky.protocol.frames import (
    Deliver,
    Error,
    Flow,
    Frame,
    Hello,
    Notice,
    Ping,
    Pong,
    Publish,
    Run,
    Subscribe,
    Subscribed,
    Unsubscribe,
)
from broky.protocol.framing import encode_preamble
from broky.protocol.message import decode_run, encode_message, pack_sizes
from broky.server import SHUTDOWN_GRACE
from tests.conftest import (
    RawConnection,
    StartBroker,
    address_of,
    eventually,
    raw_connection,
)

_SEQ = struct.Struct("<II")


def tagged(publisher: int, seq: int, size: int = 0) -> bytes:
    """A payload naming its publisher and sequence number, padded to ``size``."""
    head = _SEQ.pack(publisher, seq)
    return head + bytes(max(0, size - len(head)))


def untag(payload: bytes) -> tuple[int, int]:
    publisher, seq = _SEQ.unpack_from(payload)
    return publisher, seq


async def take(subscription: Subscription, count: int) -> list[Message]:
    """The next ``count`` messages of a subscription."""
    received = []
    async for message in subscription:
        received.append(message)
        if len(received) == count:
            break
    return received


async def take_until(subscription: Subscription, last: Callable[[Message], bool]) -> list[Message]:
    """Messages up to and including the first one ``last`` accepts.

    Used with a sentinel published after everything else: messages of one
    publisher arrive in order, so whatever was going to arrive has arrived.
    """
    received = []
    async for message in subscription:
        received.append(message)
        if last(message):
            break
    return received


def is_end(message: Message) -> bool:
    return message.payload == b"end"


# --- fan-in, fan-out, wildcards ----------------------------------------------


async def test_fan_in_every_message_received_exactly_once(address: str) -> None:
    publishers, per_publisher = 4, 1000
    with trio.fail_after(20):
        async with (
            broky.connect(address) as subscriber,
            subscriber.subscription("fanin.>") as subscription,
        ):

            async def publish(publisher: int) -> None:
                async with broky.connect(address, name=f"pub{publisher}") as client:
                    for seq in range(per_publisher):
                        await client.publish(f"fanin.p{publisher}", tagged(publisher, seq))
                        if seq % 100 == 0:
                            await trio.lowlevel.checkpoint()

            async with trio.open_nursery() as nursery:
                for publisher in range(publishers):
                    nursery.start_soon(publish, publisher)
            received = await take(subscription, publishers * per_publisher)
            # A late duplicate would show up behind this sentinel.
            async with broky.connect(address) as closer:
                await closer.publish("fanin.end", b"end")
            tail = await take_until(subscription, is_end)
    counts = Counter(untag(message.payload) for message in received)
    expected = {(p, s) for p in range(publishers) for s in range(per_publisher)}
    assert set(counts) == expected
    assert max(counts.values()) == 1
    assert [message.payload for message in tail] == [b"end"]
    for message in received:
        assert message.key == f"fanin.p{untag(message.payload)[0]}"


async def test_fan_out_every_subscriber_gets_everything_in_order(address: str) -> None:
    subscribers, count = 8, 1000
    results: dict[int, list[Message]] = {}
    with trio.fail_after(20):
        async with (
            broky.connect(address) as publisher,
            trio.open_nursery() as nursery,
        ):
            ready = trio.Semaphore(0)

            async def subscribe(index: int) -> None:
                async with (
                    broky.connect(address, name=f"sub{index}") as client,
                    client.subscription("fanout.data") as subscription,
                ):
                    ready.release()
                    results[index] = await take(subscription, count)

            for index in range(subscribers):
                nursery.start_soon(subscribe, index)
            for _ in range(subscribers):
                await ready.acquire()
            for seq in range(count):
                await publisher.publish("fanout.data", tagged(0, seq, 40))
    assert sorted(results) == list(range(subscribers))
    for messages in results.values():
        assert [untag(message.payload) for message in messages] == [(0, s) for s in range(count)]


WILDCARD_KEYS = ["w.a.x", "w.b.x", "w.a.b.x", "w.a", "w", "w.x", "v.a.x", "w.a.x.y"]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("w.*.x", ["w.a.x", "w.b.x"]),
        ("w.>", ["w.a.x", "w.b.x", "w.a.b.x", "w.a", "w.x", "w.a.x.y"]),
        ("*.a.x", ["w.a.x", "v.a.x"]),
        ("w.*.>", ["w.a.x", "w.b.x", "w.a.b.x", "w.a.x.y"]),
        ("*", ["w"]),
        ("w.a.x", ["w.a.x"]),
        (">", [*WILDCARD_KEYS]),
    ],
)
async def test_wildcards_over_the_network(address: str, pattern: str, expected: list[str]) -> None:
    with trio.fail_after(10):
        async with (
            broky.connect(address) as subscriber,
            broky.connect(address) as publisher,
            subscriber.subscription(pattern) as subscription,
        ):
            for key in WILDCARD_KEYS:
                await publisher.publish(key, key.encode())
            # A sentinel on a key the pattern matches: one publisher's
            # messages arrive in order, so nothing else can follow it.
            await publisher.publish(expected[0], b"end")
            received = await take_until(subscription, is_end)
    assert [message.key for message in received] == [*expected, expected[0]]
    assert [message.payload for message in received[:-1]] == [key.encode() for key in expected]


async def test_sys_keys_only_reach_sys_patterns(address: str) -> None:
    with trio.fail_after(10):
        async with (
            broky.connect(address) as subscriber,
            broky.connect(address) as publisher,
            subscriber.subscription(">") as catch_all,
            subscriber.subscription("*.x") as first_wildcard,
            subscriber.subscription("$SYS.>") as system,
        ):
            await publisher.publish("$SYS.x", b"sys")
            await publisher.publish("app.x", b"app")
            await publisher.publish("app.end", b"end")
            await publisher.publish("$SYS.end", b"end")
            assert [m.key for m in await take_until(catch_all, is_end)] == [
                "app.x",
                "app.end",
            ]
            assert [m.key for m in await take(first_wildcard, 1)] == ["app.x"]
            assert [m.key for m in await take_until(system, is_end)] == [
                "$SYS.x",
                "$SYS.end",
            ]


# --- topics and counters -------------------------------------------------------


async def test_topic_lifecycle_and_dropped_without_subscriber(broker: Broker, address: str) -> None:
    def router_stats() -> tuple[int, int]:
        stats = broker.statistics().router
        return stats.topics, stats.subscriptions

    with trio.fail_after(10):
        async with broky.connect(address) as first, broky.connect(address) as second:
            assert router_stats() == (0, 0)
            dropped = broker.statistics().router.dropped_no_subscriber
            for seq in range(5):
                await first.publish("life.cycle", tagged(0, seq))
            await first.flush()
            assert broker.statistics().router.dropped_no_subscriber == dropped + 5

            one = await first.subscribe("life.*")
            assert router_stats() == (1, 1)
            two = await second.subscribe("life.*")
            assert router_stats() == (1, 2)
            await one.unsubscribe()
            await first.flush()
            assert router_stats() == (1, 1)
            await two.unsubscribe()
            await second.flush()
            assert router_stats() == (0, 0)

            await first.publish("life.cycle", b"again")
            await first.flush()
            assert broker.statistics().router.dropped_no_subscriber == dropped + 6


async def test_disconnect_removes_the_connections_topics(broker: Broker, address: str) -> None:
    with trio.fail_after(10):
        async with broky.connect(address) as client:
            await client.subscribe("gone.a")
            await client.subscribe("gone.b")
            assert broker.statistics().router.topics == 2
        await eventually(lambda: not broker.statistics().connections_current)
        assert broker.statistics().router.topics == 0
        assert broker.statistics().router.subscriptions == 0


# --- ordering and message fields ----------------------------------------------


async def test_per_publisher_order_across_keys(address: str) -> None:
    publishers, per_publisher = 3, 2000
    with trio.fail_after(20):
        async with (
            broky.connect(address) as subscriber,
            subscriber.subscription("a.*") as subscription,
        ):

            async def publish(publisher: int) -> None:
                async with broky.connect(address) as client:
                    for seq in range(per_publisher):
                        key = "a.1" if (seq + publisher) % 2 else "a.2"
                        await client.publish(key, tagged(publisher, seq))
                        if seq % (7 + publisher) == 0:
                            await trio.lowlevel.checkpoint()

            async with trio.open_nursery() as nursery:
                for publisher in range(publishers):
                    nursery.start_soon(publish, publisher)
                received = await take(subscription, publishers * per_publisher)
    last = dict.fromkeys(range(publishers), -1)
    interleaved = 0
    previous = -1
    for message in received:
        publisher, seq = untag(message.payload)
        assert seq > last[publisher], f"publisher {publisher}: {seq} after {last[publisher]}"
        assert message.key == ("a.1" if (seq + publisher) % 2 else "a.2")
        last[publisher] = seq
        interleaved += publisher != previous
        previous = publisher
    assert last == dict.fromkeys(range(publishers), per_publisher - 1)
    assert interleaved > publishers  # the publishers really did interleave


UID = bytes(range(20))


@pytest.mark.parametrize("stamp", [False, True])
async def test_message_fields_round_trip(address: str, stamp: bool) -> None:
    with trio.fail_after(10):
        async with (
            broky.connect(address) as subscriber,
            broky.connect(address, stamp_ts_broker=stamp) as publisher,
            subscriber.subscription("fields.>") as subscription,
        ):
            before = time.time_ns()
            await publisher.publish(
                "fields.full",
                b"payload \x00\xff",
                key_partition=b"\x01shard",
                tags=[("region", "eu"), ("empty", ""), ("ünï", "cödé")],
                ts_producer=1_700_000_000_123_456_789,
                uid=UID,
            )
            await publisher.publish("fields.bare", b"")
            await publisher.flush()
            after = time.time_ns()
            full, bare = await take(subscription, 2)
    assert full.key == "fields.full"
    assert full.payload == b"payload \x00\xff"
    assert full.key_partition == b"\x01shard"
    assert full.tags == (("region", "eu"), ("empty", ""), ("ünï", "cödé"))
    assert full.ts_producer == 1_700_000_000_123_456_789
    assert full.uid == UID
    assert bare == Message("fields.bare", b"", ts_broker=bare.ts_broker)
    for message in (full, bare):
        if stamp:
            assert before <= message.ts_broker <= after
        else:
            assert message.ts_broker == 0


async def test_client_rejects_a_uid_that_is_not_a_ksuid(address: str) -> None:
    with trio.fail_after(5):
        async with broky.connect(address) as client, client.subscription("uid") as subscription:
            with pytest.raises(LocalProtocolError, match="20 bytes"):
                await client.publish("uid", b"x", uid=b"short")
            await client.publish("uid", b"y", uid=UID)
            assert [(m.payload, m.uid) for m in await take(subscription, 1)] == [(b"y", UID)]


# --- barriers -----------------------------------------------------------------


async def test_flush_is_a_routing_barrier(broker: Broker, address: str) -> None:
    count = 3000
    with trio.fail_after(10):
        async with (
            broky.connect(address) as subscriber,
            broky.connect(address) as publisher,
            subscriber.subscription("flush.me", credit=0) as subscription,
        ):
            published = broker.statistics().router.published_messages
            for seq in range(count):
                await publisher.publish("flush.me", tagged(0, seq))
            await publisher.flush()
            # flush returned: the broker has routed every message...
            stats = broker.statistics().router
            assert stats.published_messages == published + count
            assert stats.delivered_messages + stats.outbox_messages == count
            received = await take(subscription, count)
    assert [untag(m.payload)[1] for m in received] == list(range(count))


async def test_subscribe_returns_only_once_active(address: str) -> None:
    with trio.fail_after(10):
        async with broky.connect(address) as subscriber, broky.connect(address) as publisher:
            for attempt in range(5):
                # A backlog ahead of the Subscribe on the subscriber's own
                # connection: returning before the broker confirms would let
                # the publisher's message (on a fast connection) overtake it.
                for seq in range(2000):
                    await subscriber.publish("confirm.backlog", tagged(1, seq, 200))
                async with subscriber.subscription(f"confirm.{attempt}") as subscription:
                    await publisher.publish(f"confirm.{attempt}", tagged(0, attempt))
                    await publisher.flush()
                    (message,) = await take(subscription, 1)
                    assert untag(message.payload) == (0, attempt)


# --- stream errors keep the connection ------------------------------------------


@pytest.mark.parametrize("pattern", ["a..b", "ord*", "a.>.b", "", ".a", "a." + "x" * 1024])
async def test_invalid_pattern_raises_and_connection_keeps_working(
    address: str, pattern: str
) -> None:
    with trio.fail_after(10):
        async with broky.connect(address) as client:
            with pytest.raises(broky.SubscriptionError) as caught:
                await client.subscribe(pattern)
            assert caught.value.code is ErrorCode.INVALID_PATTERN
            assert not client.closed
            async with client.subscription("ok.key") as subscription:
                await client.publish("ok.key", b"still here")
                (message,) = await take(subscription, 1)
                assert message.payload == b"still here"


@pytest.mark.parametrize("key", ["bad..key", "bad.*", ">", ".bad", "bad."])
async def test_invalid_publish_key_is_a_stream_error(address: str, key: str) -> None:
    errors: list[Error] = []
    with trio.fail_after(10):
        async with broky.connect(address) as client:
            client.on_error = errors.append
            async with client.subscription("good.>") as subscription:
                await client.publish("good.before", b"1")
                await client.publish(key, b"bad")
                await client.publish("good.after", b"2")
                await client.flush()
                assert [(e.code, e.stream != 0) for e in errors] == [(ErrorCode.INVALID_KEY, True)]
                assert not client.closed
                received = await take(subscription, 2)
                assert [m.key for m in received] == ["good.before", "good.after"]
                await client.publish("good.later", b"3")
                assert [m.key for m in await take(subscription, 1)] == ["good.later"]


async def test_duplicate_and_unknown_streams_are_stream_errors(broker: Broker) -> None:
    with trio.fail_after(5):
        async with raw_connection(broker) as raw:
            await raw.handshake()
            await raw.send_frame(Subscribe(3, b"dup.x"))
            assert await raw.receive_frame() == Subscribed(3)
            await raw.send_frame(Subscribe(3, b"dup.y"))
            error = await raw.receive_frame()
            assert isinstance(error, Error)
            assert (error.code, error.stream) == (ErrorCode.DUPLICATE_STREAM, 3)
            await raw.send_frame(Unsubscribe(9))
            error = await raw.receive_frame()
            assert isinstance(error, Error)
            assert (error.code, error.stream) == (ErrorCode.UNKNOWN_STREAM, 9)
            await raw.send_frame(Ping(1))
            assert await raw.receive_frame() == Pong(1)


async def test_one_connection_gets_a_copy_per_matching_subscription(address: str) -> None:
    with trio.fail_after(5):
        async with (
            broky.connect(address) as client,
            client.subscription("copy.>") as wide,
            client.subscription("copy.x") as exact,
        ):
            await client.publish("copy.x", b"twice")
            assert [m.payload for m in await take(wide, 1)] == [b"twice"]
            assert [m.payload for m in await take(exact, 1)] == [b"twice"]


async def _frames_until_pong(raw: RawConnection, nonce: int) -> list[Frame]:
    await raw.send_frame(Ping(nonce))
    frames = []
    while (frame := await raw.receive_frame()) != Pong(nonce):
        frames.append(frame)
    return frames


def _delivered_seqs(frames: list[Frame]) -> list[int]:
    return [
        untag(message.payload)[1]
        for frame in frames
        if isinstance(frame, Deliver)
        for run in frame.runs
        for message in decode_run(run)
    ]


async def test_credit_limits_deliveries_until_flow(broker: Broker, address: str) -> None:
    with trio.fail_after(10):
        async with raw_connection(broker) as raw, broky.connect(address) as publisher:
            await raw.handshake()
            await raw.send_frame(Subscribe(1, b"credit.x", SlowConsumerPolicy.DROP, 5))
            assert await raw.receive_frame() == Subscribed(1)
            for seq in range(12):
                await publisher.publish("credit.x", tagged(0, seq))
            await publisher.flush()
            got: list[int] = []
            while len(got) < 5:
                got += _delivered_seqs([await raw.receive_frame()])
            # Two round trips: anything the broker had sent beyond the window
            # would arrive before the second Pong.
            assert _delivered_seqs(await _frames_until_pong(raw, 1)) == []
            assert _delivered_seqs(await _frames_until_pong(raw, 2)) == []
            await raw.send_frame(Flow(99, 100))  # unknown stream: ignored
            await raw.send_frame(Flow(1, 4))
            while len(got) < 9:
                got += _delivered_seqs([await raw.receive_frame()])
            assert _delivered_seqs(await _frames_until_pong(raw, 3)) == []
            assert _delivered_seqs(await _frames_until_pong(raw, 4)) == []
            await raw.send_frame(Flow(1, 100))
            while len(got) < 12:
                got += _delivered_seqs([await raw.receive_frame()])
            assert got == list(range(12))


async def test_unsubscribe_stops_deliveries(broker: Broker, address: str) -> None:
    with trio.fail_after(10):
        async with raw_connection(broker) as raw, broky.connect(address) as publisher:
            await raw.handshake()
            await raw.send_frame(Subscribe(1, b"unsub.x"))
            assert await raw.receive_frame() == Subscribed(1)
            await raw.send_frame(Unsubscribe(1))
            await _frames_until_pong(raw, 1)
            assert broker.statistics().router.subscriptions == 0
            await publisher.publish("unsub.x", b"late")
            await publisher.flush()
            assert await _frames_until_pong(raw, 2) == []


async def test_library_client_answers_pings_and_outlives_the_idle_timeout(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(Config(port=0, heartbeat_interval=0.05, idle_timeout=0.2))
    with trio.fail_after(5):
        async with broky.connect(address_of(broker)) as client:
            assert client.server is not None
            assert (client.server.heartbeat_interval_ms, client.server.idle_timeout_ms) == (
                50,
                200,
            )
            await trio.sleep(0.6)
            assert not client.closed
            await client.flush()
        async with raw_connection(broker) as raw:
            await raw.handshake()
            error = await raw.receive_error()  # Pings go unanswered
            assert (error.code, error.stream) == (ErrorCode.IDLE_TIMEOUT, 0)
            await raw.wait_closed()
        await eventually(lambda: not broker.statistics().connections_current)
    assert broker.statistics().connections_closed == {"client_closed": 1, "idle_timeout": 1}


async def test_deliver_frames_respect_the_clients_frame_limit(broker: Broker, address: str) -> None:
    with trio.fail_after(10):
        async with raw_connection(broker) as raw, broky.connect(address) as publisher:
            raw.machine.reader.max_frame_bytes = MIN_MAX_FRAME_BYTES
            await raw.send(
                encode_preamble()
                + encode_frame(Hello(client_name="small", max_frame_bytes=MIN_MAX_FRAME_BYTES))
            )
            await raw.receive_frame()
            await raw.send_frame(Subscribe(1, b"small.>"))
            assert await raw.receive_frame() == Subscribed(1)
            for seq in range(2000):
                await publisher.publish("small.x", tagged(0, seq, 100))
            await publisher.flush()
            got: list[int] = []
            while len(got) < 2000:
                got += _delivered_seqs([await raw.receive_frame()])


async def test_second_broker_on_a_taken_port_fails_to_start(
    broker: Broker, start_broker: StartBroker
) -> None:
    assert broker.address is not None
    with trio.fail_after(5), pytest.raises(OSError, match="ddress already in use"):
        await start_broker(Config(port=broker.address[1]))


# --- slow consumers -------------------------------------------------------------


async def _publish_paced(
    publisher: broky.Client, key: str, count: int, size: int, subscription: Subscription
) -> None:
    """Publish ``count`` messages, never more than a window ahead of ``subscription``.

    Pacing on the healthy subscriber keeps its outbox far from the bound, so
    any drop it suffered would be the broker waiting on (or mixing it up with)
    the stalled one.
    """
    window, batch = 500, 100

    def caught_up(published: int) -> bool:
        stats = subscription.statistics()
        return subscription.received + stats.buffered_messages >= published - window

    for seq in range(count):
        if seq % batch == 0:
            # Yield after every batch (so runs stay small), and wait while the
            # healthy subscriber is more than a window behind.
            await eventually(partial(caught_up, seq))
            await trio.lowlevel.checkpoint()
        await publisher.publish(key, tagged(0, seq, size))


async def test_stalled_subscriber_does_not_hold_back_others(start_broker: StartBroker) -> None:
    outbox_bytes = 256 * 1024
    count = 50_000
    broker = await start_broker(Config(port=0, outbox_bytes=outbox_bytes))
    address = address_of(broker)
    peak = 0
    with trio.fail_after(40):
        async with (
            raw_connection(broker, receive_buffer=4096) as stalled,
            broky.connect(address) as healthy,
            broky.connect(address) as publisher,
        ):
            await stalled.handshake()
            await stalled.send_frame(Subscribe(1, b"burst.data", SlowConsumerPolicy.DROP, 0))
            assert await stalled.receive_frame() == Subscribed(1)
            async with healthy.subscription("burst.data", credit=0) as subscription:
                async with trio.open_nursery() as nursery:

                    async def watch() -> None:
                        nonlocal peak
                        while True:
                            peak = max(peak, broker.statistics().router.outbox_bytes)
                            await trio.sleep(0.002)

                    nursery.start_soon(watch)
                    nursery.start_soon(
                        _publish_paced, publisher, "burst.data", count, 100, subscription
                    )
                    received = await take(subscription, count)
                    nursery.cancel_scope.cancel()
                stats = broker.statistics().router
                # The stalled subscriber now reads: it gets an ordered subset,
                # and Notices account for every message it lost.
                stalled_seqs, noticed = await _drain_with_notices(stalled, count)
    assert [untag(m.payload)[1] for m in received] == list(range(count))
    assert subscription.dropped_by_broker == 0
    assert stats.dropped_slow_consumer > 0
    assert 0 < peak <= 2 * outbox_bytes
    assert broker.statistics().connections_closed.get("slow_consumer", 0) == 0
    assert stalled_seqs == sorted(set(stalled_seqs))
    assert len(stalled_seqs) < count
    assert noticed == count - len(stalled_seqs) == stats.dropped_slow_consumer


async def _drain_with_notices(raw: RawConnection, count: int) -> tuple[list[int], int]:
    """Read a raw subscription until delivered + announced drops reach ``count``."""
    seqs: list[int] = []
    noticed = 0
    while len(seqs) + noticed < count:
        frame = await raw.receive_frame()
        if isinstance(frame, Deliver):
            for run in frame.runs:
                seqs.extend(untag(message.payload)[1] for message in decode_run(run))
        elif isinstance(frame, Notice):
            assert (frame.stream, frame.kind) == (1, NoticeKind.DROPPED)
            noticed += frame.count
    return seqs, noticed


async def test_slow_consumer_disconnect_policy(start_broker: StartBroker) -> None:
    count = 30_000
    broker = await start_broker(Config(port=0, outbox_bytes=128 * 1024))
    address = address_of(broker)
    with trio.fail_after(10):
        async with (
            raw_connection(broker, receive_buffer=4096) as stalled,
            broky.connect(address) as healthy,
            broky.connect(address) as publisher,
        ):
            await stalled.handshake()
            await stalled.send_frame(Subscribe(1, b"slow.>", SlowConsumerPolicy.DISCONNECT, 0))
            assert await stalled.receive_frame() == Subscribed(1)
            async with healthy.subscription("slow.>", credit=0) as subscription:
                await _publish_paced(publisher, "slow.data", count, 100, subscription)
                received = await take(subscription, count)
                await eventually(lambda: "slow_consumer" in broker.statistics().connections_closed)
                await stalled.wait_closed()
                # The publisher and the healthy subscriber carry on.
                await publisher.publish("slow.after", b"after")
                assert [m.payload for m in await take(subscription, 1)] == [b"after"]
                await publisher.flush()
    assert len(received) == count
    stats = broker.statistics()
    assert stats.connections_closed.get("slow_consumer") == 1
    assert stats.router.slow_consumer_disconnects >= 1


# --- protocol violations ----------------------------------------------------------


async def _assert_other_clients_unaffected(address: str) -> None:
    async with broky.connect(address) as client, client.subscription("alive") as subscription:
        await client.publish("alive", b"yes")
        assert [m.payload for m in await take(subscription, 1)] == [b"yes"]


async def test_malformed_frame_closes_only_that_connection(broker: Broker, address: str) -> None:
    with trio.fail_after(10):
        async with (
            broky.connect(address) as bystander,
            bystander.subscription("bystander") as subscription,
        ):
            async with raw_connection(broker) as raw:
                await raw.handshake()
                garbage = bytes(range(7, 7 + 24))
                await raw.send(struct.pack("<I", len(garbage)) + garbage)
                error = await raw.receive_error()
                assert (error.code, error.stream) == (ErrorCode.MALFORMED_FRAME, 0)
                await raw.wait_closed()
            await bystander.publish("bystander", b"fine")
            assert [m.payload for m in await take(subscription, 1)] == [b"fine"]
        await _assert_other_clients_unaffected(address)
    assert broker.statistics().connections_closed.get("protocol_error") == 1


async def test_oversize_frame_is_rejected_on_its_prefix(broker: Broker) -> None:
    with trio.fail_after(5):
        async with raw_connection(broker) as raw:
            await raw.handshake()
            # Only the prefix: the broker must not wait for the body.
            await raw.send(struct.pack("<I", DEFAULT_MAX_FRAME_BYTES + 1))
            with trio.fail_after(1):
                error = await raw.receive_error()
                assert (error.code, error.stream) == (ErrorCode.FRAME_TOO_LARGE, 0)
                assert str(DEFAULT_MAX_FRAME_BYTES) in error.message
                await raw.wait_closed()


async def test_frame_of_exactly_the_limit_is_accepted(start_broker: StartBroker) -> None:
    broker = await start_broker(Config(port=0, max_frame_bytes=MIN_MAX_FRAME_BYTES))
    with trio.fail_after(5):
        async with raw_connection(broker) as raw:
            welcome = await raw.handshake()
            assert welcome.max_frame_bytes == MIN_MAX_FRAME_BYTES
            await raw.send_frame(Subscribe(1, b"limit"))
            assert await raw.receive_frame() == Subscribed(1)
            size = MIN_MAX_FRAME_BYTES
            while len(frame := encode_frame(Publish(2, (_run(b"limit", [bytes(size)]),)))) > (
                MIN_MAX_FRAME_BYTES + 4
            ):
                size -= 1
            assert len(frame) - 4 > MIN_MAX_FRAME_BYTES - 8
            await raw.send(frame)
            deliver = await raw.receive_frame()
            assert isinstance(deliver, Deliver)
            assert deliver.runs[0].count == 1
            await raw.send(struct.pack("<I", MIN_MAX_FRAME_BYTES + 1))
            error = await raw.receive_error()
            assert error.code is ErrorCode.FRAME_TOO_LARGE


def _run(key: bytes, payloads: list[bytes]) -> Run:
    messages = [encode_message(payload) for payload in payloads]
    return Run(key, 0, len(messages), pack_sizes([len(m) for m in messages]), b"".join(messages))


@pytest.mark.parametrize(
    ("first_bytes", "mentions"),
    [
        (b"\x00\x01garbage!", "garbag"),
        (b"BROKX\x00\x01\x00", "BROKX"),
    ],
    ids=["garbage", "near-miss"],
)
async def test_foreign_preamble_is_answered_and_closed(
    broker: Broker, first_bytes: bytes, mentions: str
) -> None:
    with trio.fail_after(5):
        async with raw_connection(broker) as raw:
            await raw.send(first_bytes)
            with trio.fail_after(1):
                # The client-side machine checks the broker's preamble first.
                error = await raw.receive_frame()
                assert isinstance(error, Error)
                assert (error.code, error.stream) == (ErrorCode.BAD_PREAMBLE, 0)
                assert mentions in error.message
                await raw.wait_closed()
        await eventually(lambda: not broker.statistics().connections_current)
    assert broker.statistics().connections_closed == {"protocol_error": 1}


async def test_broker_answers_a_preamble_with_its_own(broker: Broker) -> None:
    with trio.fail_after(5):
        async with raw_connection(broker) as raw:
            await raw.send(encode_preamble())
            preamble = b""
            while len(preamble) < 8:
                preamble += await raw.stream.receive_some(8 - len(preamble))
            assert preamble == encode_preamble()


async def test_wrong_version_is_unsupported(broker: Broker) -> None:
    with trio.fail_after(5):
        async with raw_connection(broker) as raw:
            await raw.send(encode_preamble(version=2) + encode_frame(Hello()))
            error = await raw.receive_frame()
            assert isinstance(error, Error)
            assert (error.code, error.stream) == (ErrorCode.UNSUPPORTED_VERSION, 0)
            assert "version 2" in error.message
            await raw.wait_closed()


async def test_client_disconnect_mid_frame_does_not_disturb_others(
    broker: Broker, address: str
) -> None:
    with trio.fail_after(10):
        async with broky.connect(address) as client, client.subscription("mid.>") as subscription:
            async with raw_connection(broker) as raw:
                await raw.handshake()
                frame = encode_frame(Publish(1, (_run(b"mid.frame", [b"x" * 500]),)))
                await raw.send(frame[: len(frame) // 2])
            # The raw socket is closed halfway through a frame.
            await eventually(lambda: "client_closed" in broker.statistics().connections_closed)
            await client.publish("mid.ok", b"ok")
            assert [m.key for m in await take(subscription, 1)] == ["mid.ok"]
            assert broker.statistics().router.published_messages == 1


# --- lifecycle ----------------------------------------------------------------------


async def _serve_in(
    broker: Broker, scope: trio.CancelScope, *, task_status: trio.TaskStatus[object]
) -> None:
    with scope:
        await broker.serve(task_status=task_status)


async def test_graceful_shutdown_tells_clients(nursery: trio.Nursery) -> None:
    broker = Broker(Config(port=0))
    scope = trio.CancelScope()
    stopped = trio.Event()

    async def serve(task_status: trio.TaskStatus[object]) -> None:
        try:
            await _serve_in(broker, scope, task_status=task_status)
        finally:
            stopped.set()

    with trio.fail_after(10):
        await nursery.start(serve)
        address = address_of(broker)
        async with broky.connect(address) as client, broker.connect() as local:
            subscription = await client.subscribe("shutdown.>")
            local_subscription = await local.subscribe("shutdown.>")
            start = trio.current_time()
            scope.cancel()
            with pytest.raises(broky.BrokyError) as caught:
                await take(subscription, 1)
            assert caught.value.code is ErrorCode.SERVER_SHUTDOWN
            with pytest.raises(broky.BrokyError) as caught:
                await take(local_subscription, 1)
            assert caught.value.code is ErrorCode.SERVER_SHUTDOWN
            assert client.closed
            with pytest.raises(broky.BrokyError):
                await client.publish("shutdown.late", b"x")
            with pytest.raises(broky.BrokyError):
                await client.flush()
            with pytest.raises(broky.BrokyError):
                await client.subscribe("shutdown.again")
        await stopped.wait()
        assert trio.current_time() - start < SHUTDOWN_GRACE
    stats = broker.statistics()
    assert stats.connections_closed == {"server_shutdown": 2}
    assert stats.connections_current == 0
    assert broker.address is not None
    with pytest.raises(OSError, match="all attempts to connect"):
        await trio.open_tcp_stream(*broker.address)


async def test_embedded_client_interoperates_with_tcp_client(broker: Broker, address: str) -> None:
    with trio.fail_after(10):
        async with (
            broker.connect("embedded") as local,
            broky.connect(address) as remote,
            local.subscription("to.local") as local_inbox,
            remote.subscription("to.remote") as remote_inbox,
        ):
            await remote.publish("to.local", b"hello local", tags=[("from", "tcp")])
            await local.publish("to.remote", b"hello remote", uid=UID)
            (got_local,) = await take(local_inbox, 1)
            (got_remote,) = await take(remote_inbox, 1)
    assert (got_local.payload, got_local.tags) == (b"hello local", (("from", "tcp"),))
    assert (got_remote.payload, got_remote.uid) == (b"hello remote", UID)
    assert broker.statistics().connections_opened == 2


async def test_broker_without_listener_serves_in_process_clients(nursery: trio.Nursery) -> None:
    broker = Broker(Config(listen=False))
    with trio.fail_after(10):
        started = await nursery.start(broker.serve)
        assert started is None
        assert broker.address is None
        async with (
            broker.connect("a") as first,
            broker.connect("b") as second,
            second.subscription("inproc.>") as subscription,
        ):
            for seq in range(100):
                await first.publish("inproc.x", tagged(0, seq))
            received = await take(subscription, 100)
    assert [untag(m.payload) for m in received] == [(0, s) for s in range(100)]


async def test_connect_before_serve_is_refused() -> None:
    broker = Broker(Config(listen=False))
    with pytest.raises(RuntimeError, match="not serving"):
        async with broker.connect():
            pass  # pragma: no cover


async def test_publisher_respects_a_small_frame_limit(start_broker: StartBroker) -> None:
    # A busy publisher that never yields batches everything into big runs;
    # they must still fit the broker's announced max_frame_bytes.
    broker = await start_broker(Config(port=0, max_frame_bytes=MIN_MAX_FRAME_BYTES))
    count = 5000
    with trio.fail_after(20):
        async with (
            broky.connect(address_of(broker)) as subscriber,
            broky.connect(address_of(broker)) as publisher,
        ):
            assert publisher.server is not None
            assert publisher.server.max_frame_bytes == MIN_MAX_FRAME_BYTES
            async with subscriber.subscription("tight.>", credit=0) as subscription:
                for seq in range(count):
                    await publisher.publish("tight.data", tagged(0, seq, 200))
                await publisher.publish("tight.big", os.urandom(MIN_MAX_FRAME_BYTES // 2))
                await publisher.flush()
                received = await take(subscription, count + 1)
    assert [untag(m.payload)[1] for m in received[:count]] == list(range(count))
    assert len(received[-1].payload) == MIN_MAX_FRAME_BYTES // 2
    assert "protocol_error" not in broker.statistics().connections_closed


@pytest.mark.parametrize("max_frame_bytes", [MIN_MAX_FRAME_BYTES, DEFAULT_MAX_FRAME_BYTES])
async def test_large_messages_up_to_the_frame_limit(
    start_broker: StartBroker, max_frame_bytes: int
) -> None:
    broker = await start_broker(
        Config(port=0, max_frame_bytes=max_frame_bytes, max_message_bytes=max_frame_bytes)
    )
    fits = os.urandom(max_frame_bytes - 2048)
    with trio.fail_after(10):
        async with (
            broky.connect(address_of(broker)) as client,
            client.subscription("large.>", credit=0) as subscription,
        ):
            await client.publish("large.small", b"before")
            await client.publish("large.big", fits)
            await client.publish("large.small", b"after")
            with pytest.raises(LocalProtocolError, match="does not fit the broker's frames"):
                await client.publish("large.big", bytes(max_frame_bytes))
            await client.publish("large.small", b"last")
            received = await take(subscription, 4)
    assert [m.payload for m in received] == [b"before", fits, b"after", b"last"]
    assert "protocol_error" not in broker.statistics().connections_closed


async def test_connect_to_a_closed_port_fails_fast() -> None:
    with trio.socket.socket() as placeholder:
        await placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    with trio.fail_after(5), pytest.raises(OSError, match="all attempts to connect"):
        async with broky.connect(f"127.0.0.1:{port}"):
            pass  # pragma: no cover


async def test_ping_measures_a_round_trip(address: str) -> None:
    with trio.fail_after(5):
        async with broky.connect(address) as client:
            rtt = await client.ping()
    assert 0 <= rtt < 1
    assert client.server is not None
    assert client.server.server_name.startswith("broky/")


async def test_statistics_count_connections_and_bytes(broker: Broker, address: str) -> None:
    with trio.fail_after(5):
        async with broky.connect(address) as client:
            await client.publish("stats.x", bytes(1000))
            await client.flush()
            during = broker.statistics()
        await eventually(lambda: not broker.statistics().connections_current)
    assert during.connections_opened == 1
    assert during.connections_current == 1
    assert during.bytes_received > 1000
    assert during.bytes_sent > 0
    after = broker.statistics()
    assert after.connections_closed == {"client_closed": 1}
    assert after.router.connections == 0
