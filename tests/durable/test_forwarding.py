"""Durable topics on several workers, in one process: each broker plays one
worker of a node, linked to the others as ``broky serve`` links them (LOCAL
links for ephemeral traffic, owner channels for durable requests)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from broky import Broker, BrokyError, Config, ErrorCode, Message, Start
from broky.connection.inproc import pipe_pair
from broky.durable import forwarding, owner_channel
from broky.durable.ownership import partition_owner
from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.frames import Error, Publish, PublishAck, Run
from broky.protocol.message import encode_message, pack_sizes
from broky.storage.topics import partition_for
from tests.conftest import eventually, raw_run
from tests.durable.test_durable_broker import check_dense, fetch_all, take
from tests.durable.test_forwarded import acks

TIMEOUT = 20
PARTITIONS = 8


def config(data_dir: Path, **settings: Any) -> Config:
    table = {"name": "orders", "pattern": "orders.>", "partitions": PARTITIONS}
    return Config.from_mapping(
        {
            "listen": False,
            "data_dir": str(data_dir),
            "durable": [table],
            "system_events": False,
            **settings,
        }
    )


def channel_connector(peer: Broker) -> Any:
    async def connect() -> trio.abc.Stream:
        nursery = peer._connection_nursery
        if nursery is None:
            raise OSError("the peer is not serving")
        near, far = pipe_pair()
        nursery.start_soon(peer._serve_stream, far)
        return near

    return connect


@asynccontextmanager
async def node(
    data_dir: Path, workers: int, **settings: Any
) -> AsyncIterator[tuple[list[Broker], trio.Nursery]]:
    """``workers`` brokers as the workers of one node."""
    brokers = [
        Broker(config(data_dir, **settings), worker=index, workers=workers)
        for index in range(workers)
    ]
    for broker in brokers:
        for other, peer in enumerate(brokers):
            if peer is not broker:
                broker.add_owner_channel(other, channel_connector(peer), f"to-{other}")
    async with trio.open_nursery() as nursery:
        for broker in brokers:
            await nursery.start(broker.serve)
        for broker in brokers:
            for peer in brokers:
                if peer is not broker:
                    broker.link_to(peer)
        for broker in brokers:
            channels = broker.forwarder.channels.values() if broker.forwarder else ()
            for channel in channels:
                await channel.ready.wait()
        yield brokers, nursery
        nursery.cancel_scope.cancel()


def key_for(partition: int) -> str:
    """An ``orders`` key whose messages land in ``partition``."""
    return next(
        f"orders.k{n}"
        for n in range(10_000)
        if partition_for(f"orders.k{n}".encode(), PARTITIONS) == partition
    )


async def test_publish_anywhere_dense_offsets_and_same_view_everywhere(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with node(tmp_path, 3) as (brokers, _):
            acked: dict[int, list[int]] = defaultdict(list)
            for round_ in range(3):
                for index, broker in enumerate(brokers):
                    async with broker.connect() as client:
                        for n in range(80):
                            payload = f"{index}-{round_}-{n}".encode()
                            await client.publish(key_for(n % PARTITIONS), payload, ack=True)
                        for ack in await client.flush_acks():
                            acked[ack.partition].extend(
                                range(ack.first_offset, ack.last_offset + 1)
                            )
            assert sorted(acked) == list(range(PARTITIONS))
            for partition, offsets in acked.items():
                assert sorted(offsets) == list(range(len(offsets))), partition
            views = []
            for broker in brokers:
                async with broker.connect() as client:
                    found = await fetch_all(client)
                    check_dense(found)
                    views.append({p: [m.payload for m in ms] for p, ms in found.items()})
            assert views[0] == views[1] == views[2]
            assert sum(len(items) for items in views[0].values()) == 3 * 3 * 80
            forwarded = sum(b.forwarder.forwarded_messages for b in brokers if b.forwarder)
            assert forwarded > 0


async def test_replay_then_live_across_workers_without_gap_or_duplicate(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with node(tmp_path, 2) as (brokers, _):
            async with brokers[1].connect() as publisher:
                for n in range(400):
                    await publisher.publish(key_for(n % PARTITIONS), b"old%d" % n, ack=True)
                await publisher.flush_acks()
                async with (
                    brokers[0].connect() as consumer,
                    consumer.subscribe("orders.>", start=Start.earliest()) as subscription,
                ):
                    # Live publishes race the replay on purpose.
                    for n in range(400):
                        await publisher.publish(key_for(n % PARTITIONS), b"new%d" % n, ack=True)
                    await publisher.flush_acks()
                    received = await take(subscription, 800)
            by_partition: dict[int, list[Message]] = defaultdict(list)
            for message in received:
                by_partition[message.partition].append(message)
            for partition, messages in by_partition.items():
                assert [m.offset for m in messages] == list(range(len(messages))), partition
            payloads = sorted(m.payload for m in received)
            assert payloads == sorted(
                [b"old%d" % n for n in range(400)] + [b"new%d" % n for n in range(400)]
            )


async def test_a_down_owner_fails_its_partitions_fast_and_retriably(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with node(tmp_path, 2) as (brokers, _):
            mine = next(p for p in range(PARTITIONS) if partition_owner("orders", p, 2) == 0)
            theirs = next(p for p in range(PARTITIONS) if partition_owner("orders", p, 2) == 1)
            async with brokers[0].connect() as client:
                subscription = await client.subscribe("orders.>", start=Start.earliest())
                # Worker 1 stops: its channel from worker 0 goes down.
                channel = brokers[0].forwarder.channels[1]  # type: ignore[union-attr]
                for connection in list(brokers[1]._connections):
                    connection.shutdown()
                await eventually(lambda: not channel.connected)
                await client.publish(key_for(theirs), b"lost", ack=True)
                client.retry_timeout = 0  # no resend: see the broker's answer
                with pytest.raises(BrokyError) as refused:
                    await client.flush_acks()
                assert refused.value.code is ErrorCode.OWNER_UNAVAILABLE
                # The relayed subscription ended with the same retriable error.
                with pytest.raises(BrokyError) as ended:
                    await take(subscription, 1)
                assert ended.value.code is ErrorCode.OWNER_UNAVAILABLE
                # Worker 0's own partitions keep working meanwhile...
                await client.publish(key_for(mine), b"kept", ack=True)
                (ack,) = await client.flush_acks()
                assert ack.partition == mine
                # ...and worker 1's work again once the channel is back.
                await eventually(lambda: channel.connected)
                await client.publish(key_for(theirs), b"back", ack=True)
                (ack,) = await client.flush_acks()
                assert ack.partition == theirs


async def test_exhausted_credit_slows_publishers_and_drops_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forwarding, "FORWARD_CREDIT_BYTES", 1)  # one frame in flight
    with trio.fail_after(TIMEOUT):
        async with node(tmp_path, 2) as (brokers, _), brokers[0].connect() as client:
            for n in range(2000):
                await client.publish(key_for(n % PARTITIONS), b"%d" % n, ack=True)
                if n % 100 == 99:
                    await client.flush()
            acks = await client.flush_acks()
            assert sum(a.last_offset - a.first_offset + 1 for a in acks) == 2000
            found = await fetch_all(client)
            assert sum(len(items) for items in found.values()) == 2000


async def test_live_from_confirmation_on_every_workers_partitions(tmp_path: Path) -> None:
    """``Subscribed`` (latest start) waits for the other owners: whatever is
    published after it, on any worker, is delivered, in offset order."""
    with trio.fail_after(TIMEOUT):
        async with node(tmp_path, 3) as (brokers, _):
            for round_ in range(5):
                async with (
                    brokers[round_ % 3].connect() as consumer,
                    consumer.subscribe("orders.>") as subscription,
                    brokers[(round_ + 1) % 3].connect() as publisher,
                ):
                    for n in range(PARTITIONS * 4):
                        await publisher.publish(key_for(n % PARTITIONS), b"%d" % n, ack=True)
                    await publisher.flush_acks()
                    received = await take(subscription, PARTITIONS * 4)
                by_partition: dict[int, list[int]] = defaultdict(list)
                for message in received:
                    by_partition[message.partition].append(message.offset)
                assert len(by_partition) == PARTITIONS
                for offsets in by_partition.values():
                    assert offsets == list(range(offsets[0], offsets[0] + 4))


async def test_a_replay_of_large_messages_from_another_worker_drops_nothing(
    tmp_path: Path,
) -> None:
    """The owner's share arrives as fast as the client's outbox has room,
    never more: 12 MiB of 64 KiB messages through a 4 MiB outbox."""
    payload = b"x" * 65536
    with trio.fail_after(TIMEOUT):
        async with node(tmp_path, 2) as (brokers, _):
            async with brokers[1].connect() as publisher:
                for n in range(192):
                    await publisher.publish(key_for(n % PARTITIONS), payload, ack=True)
                    if n % 16 == 15:
                        await publisher.flush_acks()
                await publisher.flush_acks()
            async with (
                brokers[0].connect() as consumer,
                consumer.subscribe("orders.>", start=Start.earliest(), credit=8) as subscription,
            ):
                await trio.sleep(0.5)  # a slow consumer: the owner must wait for it
                received = await take(subscription, 192)
            assert all(message.payload == payload for message in received)
            by_partition: dict[int, list[int]] = defaultdict(list)
            for message in received:
                by_partition[message.partition].append(message.offset)
            assert all(offsets == list(range(24)) for offsets in by_partition.values())
            stats = brokers[0].statistics().router
            assert stats.dropped_slow_consumer == 0


async def test_a_stalled_owner_fails_forwarded_publishes_within_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(owner_channel, "FORWARD_TIMEOUT", 0.5)
    with trio.fail_after(TIMEOUT):
        async with node(tmp_path, 2) as (brokers, _):
            theirs = next(p for p in range(PARTITIONS) if partition_owner("orders", p, 2) == 1)
            store = brokers[1].store
            assert store is not None
            store.pending_limit = 0  # worker 1 stops reading its connections: a stall
            async with brokers[0].connect() as client:
                # The owner's channel reader handles this frame, then waits for room.
                await client.publish(key_for(theirs), b"last", ack=True)
                await client.flush_acks()
                await client.publish(key_for(theirs), b"stalled", ack=True)
                client.retry_timeout = 0  # no resend: see the broker's answer
                started = trio.current_time()
                with pytest.raises(BrokyError) as failed:
                    await client.flush_acks()
                assert failed.value.code is ErrorCode.OWNER_UNAVAILABLE
                assert trio.current_time() - started < 0.5 + 5.0  # bounded, not a performance check


async def test_a_frame_split_by_partition_still_fits_the_owners_frame_limit(
    tmp_path: Path,
) -> None:
    """A client frame near the limit whose messages alternate between two
    partitions of the other worker: its pieces (a run header each) outgrow
    it, so they leave as several forwarded frames, each within the limit."""
    theirs = [p for p in range(PARTITIONS) if partition_owner("orders", p, 2) == 1][:2]
    alternating = [
        next(b"%d" % n for n in range(10_000) if partition_for(b"%d" % n, PARTITIONS) == p)
        for p in theirs
    ]
    messages = [encode_message(b"x" * 100, key_partition=alternating[n % 2]) for n in range(380)]
    run = Run(b"orders.one", 0, 380, pack_sizes([len(m) for m in messages]), b"".join(messages))
    frame = encode_frame(Publish(1, (run,), ack=True))
    assert 32 * 1024 < len(frame) < 64 * 1024
    with trio.fail_after(TIMEOUT):
        async with (
            node(tmp_path, 2, max_frame_bytes=65536) as (brokers, _),
            brokers[0].connect() as client,
        ):
            client._send_raw(frame)
            stored = 0
            while stored < 380:  # the owner's appends, seen through worker 0
                await trio.sleep(0.01)
                stored = sum(info.end_offset for info in await client.partitions("orders"))
            channel = brokers[0].forwarder.channels[1]  # type: ignore[union-attr]
            assert channel.connected


async def test_pieces_joined_for_an_owner_are_acked_exactly(tmp_path: Path) -> None:
    """Messages alternating between a partition of each worker: the other
    worker's pieces of a run travel as one run and come back as one ack
    entry, which must still complete every piece's share of the client ack."""
    mine = next(p for p in range(PARTITIONS) if partition_owner("orders", p, 2) == 0)
    theirs = next(p for p in range(PARTITIONS) if partition_owner("orders", p, 2) == 1)
    alternating = [
        next(b"%d" % n for n in range(10_000) if partition_for(b"%d" % n, PARTITIONS) == p)
        for p in (mine, theirs)
    ]
    with trio.fail_after(TIMEOUT):
        async with node(tmp_path, 2) as (brokers, _), brokers[0].connect() as client:
            for round_ in range(3):
                for n in range(1000):
                    await client.publish(
                        "orders.one",
                        b"%d-%d" % (round_, n),
                        key_partition=alternating[n % 2],
                        ack=True,
                    )
                acks = await client.flush_acks()
                counted: dict[int, int] = defaultdict(int)
                for ack in acks:
                    counted[ack.partition] += ack.last_offset - ack.first_offset + 1
                assert counted == {mine: 500, theirs: 500}
            found = await fetch_all(client)
            check_dense(found)
            assert [m.payload for m in found[theirs]] == [
                b"%d-%d" % (round_, n) for round_ in range(3) for n in range(1, 1000, 2)
            ]


async def test_a_replay_from_every_worker_into_a_small_outbox_drops_nothing(
    tmp_path: Path,
) -> None:
    """The worker's own replay and the owners' relayed shares fill one client
    outbox at once; relayed runs wait for room instead of overflowing it."""
    with trio.fail_after(TIMEOUT):
        async with node(tmp_path, 3, outbox_bytes=64 * 1024) as (brokers, _):
            for index, broker in enumerate(brokers):
                async with broker.connect() as publisher:
                    for n in range(1200):
                        await publisher.publish(
                            key_for(n % PARTITIONS), b"%d-%d" % (index, n), ack=True
                        )
                    await publisher.flush_acks()
            async with (
                brokers[0].connect() as consumer,
                consumer.subscribe("orders.>", start=Start.earliest(), credit=64) as subscription,
            ):
                received = await take(subscription, 3600)
            by_partition: dict[int, list[int]] = defaultdict(list)
            for message in received:
                by_partition[message.partition].append(message.offset)
            assert all(offsets == list(range(450)) for offsets in by_partition.values())
            assert brokers[0].statistics().router.dropped_slow_consumer == 0


async def test_one_producers_refusal_fails_only_its_own_run_of_a_forwarded_frame(
    tmp_path: Path,
) -> None:
    """Runs of two clients share one forwarded frame (added to the owner
    channel directly, then flushed once): an idempotent producer whose run
    is out of order at the owner, and a plain client. The owner must answer
    run by run: the producer gets OutOfOrderSequence, the plain client its
    ack with the offsets its messages got, and the log holds exactly what
    was acknowledged (an error for a stored message would make a plain
    client resend it, a duplicate)."""
    theirs = next(p for p in range(PARTITIONS) if partition_owner("orders", p, 2) == 1)
    key = key_for(theirs).encode()
    producer = 0x5EED
    with trio.fail_after(TIMEOUT):
        async with node(tmp_path, 2) as (brokers, _):
            store, forwarder = brokers[0].store, brokers[0].forwarder
            assert store is not None
            assert forwarder is not None
            topic = store.policies.named("orders")
            assert topic is not None
            channel = forwarder.channels[1]

            def forward(run: Run, stream: int, identity: tuple[int, int] | None) -> list[bytes]:
                queue, answers = acks()
                ticket = queue.open(stream, *(identity or ()))
                ticket.remaining = 1  # one piece, as DurableStore.append_frame counts it
                channel.add(topic, theirs, run, ticket, queue, 0, identity)
                return answers

            # The producer's sequences 1 and 2 are stored at offsets 0 and 1.
            first = forward(raw_run(key, b"a1", b"a2"), 1, (producer, 1))
            channel.flush()
            await eventually(lambda: bool(first))
            # Sequence 2 again, alone: not a run the owner remembers, and
            # later ones are stored, so it is out of order. It shares a frame
            # with a plain client's run.
            bad = forward(raw_run(key, b"again"), 2, (producer, 2))
            plain = forward(raw_run(key, b"p1", b"p2"), 3, None)
            channel.flush()
            await eventually(lambda: bool(bad and plain))
            assert decode_frame(first[0][4:]) == PublishAck(1, 1, (0,), (theirs,), (0,), (1,))
            refused = decode_frame(bad[0][4:])
            assert isinstance(refused, Error)
            assert (refused.code, refused.stream) == (ErrorCode.OUT_OF_ORDER_SEQUENCE, 2)
            assert decode_frame(plain[0][4:]) == PublishAck(3, 1, (0,), (theirs,), (2,), (3,))
            async with brokers[0].connect() as client:
                found = await fetch_all(client)
            assert [m.payload for m in found[theirs]] == [b"a1", b"a2", b"p1", b"p2"]
