"""Durable topics through a real broker: acks, offsets, replay, read API, restart."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from broky import Broker, BrokyError, Client, Config, ConfigError, ErrorCode, Message, Start
from broky.cli import main
from broky.protocol.codec import encode_frame
from broky.protocol.frames import Error, Publish, Run
from broky.router.matcher import patterns_overlap
from broky.storage.topics import partition_for
from tests.conftest import StartBroker, raw_run
from tests.observability.test_observability import http_get, sample_value

TIMEOUT = 20


def durable_config(data_dir: Path, **policy: Any) -> Config:
    table = {"name": "orders", "pattern": "orders.>", "partitions": 3, **policy}
    return Config.from_mapping(
        {"listen": False, "data_dir": str(data_dir), "durable": [table], "system_events": False}
    )


async def publish_acked(client: Client, count: int, start: int = 0, keys: int = 5) -> list[Any]:
    for index in range(start, start + count):
        await client.publish(f"orders.k{index % keys}", str(index).encode(), ack=True)
    return list(await client.flush_acks())


async def take(subscription: Any, count: int) -> list[Message]:
    received = []
    async for message in subscription:
        received.append(message)
        if len(received) == count:
            break
    return received


async def fetch_all(client: Client, topic: str = "orders") -> dict[int, list[Message]]:
    """Every message of every partition, read back with Fetch."""
    found: dict[int, list[Message]] = {}
    for info in await client.partitions(topic):
        messages: list[Message] = []
        offset = info.start_offset
        while offset < info.end_offset:
            batch = await client.fetch(topic, info.partition, offset, 4096)
            assert batch, "fetch returned nothing before the end"
            messages.extend(batch)
            offset = batch[-1].offset + 1
        found[info.partition] = messages
    return found


def check_dense(messages: dict[int, list[Message]]) -> None:
    for partition, items in messages.items():
        offsets = [message.offset for message in items]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True
        assert all(message.partition == partition for message in items)


@pytest.mark.parametrize("fsync", ["always", "interval", "never"])
async def test_acked_publish_gets_dense_offsets_per_partition(tmp_path: Path, fsync: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            broker = Broker(durable_config(tmp_path, fsync=fsync))
            await nursery.start(broker.serve)
            async with broker.connect() as client:
                acks = await publish_acked(client, 500)
                acks += await publish_acked(client, 500, start=500)
                # An ephemeral key in an acked frame gets no entry, and no offsets.
                await client.publish("prices.eu", b"x", ack=True)
                assert await client.flush_acks() == []
            by_partition: dict[int, list[int]] = defaultdict(list)
            for ack in acks:
                assert partition_for(ack.key.encode(), 3) == ack.partition
                by_partition[ack.partition].extend(range(ack.first_offset, ack.last_offset + 1))
            assert sum(len(offsets) for offsets in by_partition.values()) == 1000
            for offsets in by_partition.values():
                assert offsets == list(range(len(offsets)))
            statistics = broker.statistics().durable
            assert statistics is not None
            assert statistics.appended_messages == 1000
            if fsync == "always":
                assert 0 < statistics.fsyncs <= 2 * 3 * 2  # group commit, not per message
            nursery.cancel_scope.cancel()


async def test_fetch_and_list_partitions(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            broker = Broker(durable_config(tmp_path))
            await nursery.start(broker.serve)
            async with broker.connect() as client:
                await publish_acked(client, 300)
                infos = await client.partitions()
                # Every broker with durable topics also has the dead-letter topic.
                assert [(info.topic, info.partition) for info in infos] == [
                    ("orders", 0),
                    ("orders", 1),
                    ("orders", 2),
                    ("_dlq", 0),
                ]
                assert sum(info.end_offset for info in infos) == 300
                stored = await fetch_all(client)
                check_dense(stored)
                payloads = sorted(int(m.payload) for items in stored.values() for m in items)
                assert payloads == list(range(300))
                assert all(m.ts_broker > 0 for items in stored.values() for m in items)
                # Per key, publish order is kept.
                for items in stored.values():
                    per_key: dict[str, list[int]] = defaultdict(list)
                    for message in items:
                        per_key[message.key].append(int(message.payload))
                    assert all(values == sorted(values) for values in per_key.values())
                with pytest.raises(BrokyError) as info:
                    await client.fetch("orders", 0, 10**9)
                assert info.value.code is ErrorCode.OFFSET_OUT_OF_RANGE
                with pytest.raises(BrokyError) as info:
                    await client.fetch("nope", 0, 0)
                assert info.value.code is ErrorCode.UNKNOWN_TOPIC
                with pytest.raises(BrokyError):
                    await client.partitions("nope")
                assert await client.fetch("orders", 0, infos[0].end_offset) == []
            nursery.cancel_scope.cancel()


async def test_restart_keeps_everything(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        for round_number in range(2):
            async with trio.open_nursery() as nursery:
                broker = Broker(durable_config(tmp_path))
                await nursery.start(broker.serve)
                async with broker.connect() as client:
                    await publish_acked(client, 100, start=100 * round_number)
                    stored = await fetch_all(client)
                    check_dense(stored)
                    payloads = sorted(int(m.payload) for items in stored.values() for m in items)
                    assert payloads == list(range(100 * (round_number + 1)))
                nursery.cancel_scope.cancel()


async def _replay_case(tmp_path: Path, start: Start, expected: list[int]) -> None:
    async with trio.open_nursery() as nursery:
        broker = Broker(durable_config(tmp_path, partitions=1))
        await nursery.start(broker.serve)
        async with broker.connect() as client:
            acks = await publish_acked(client, 100, keys=4)
            assert acks[0].first_offset == 0
            async with client.subscription("orders.>", start=start) as subscription:
                got = await take(subscription, len(expected)) if expected else []
                await publish_acked(client, 5, start=100, keys=4)
                live = await take(subscription, 5)
            assert [int(m.payload) for m in got] == expected
            assert [int(m.payload) for m in live] == list(range(100, 105))
            assert [m.offset for m in live] == list(range(100, 105))
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (Start.latest(), []),
        (Start.earliest(), list(range(100))),
        (Start.offset({0: 90}), list(range(90, 100))),
        (Start.last(), [96, 97, 98, 99]),
    ],
    ids=["latest", "earliest", "offset", "last"],
)
async def test_replay_start_positions(tmp_path: Path, start: Start, expected: list[int]) -> None:
    with trio.fail_after(TIMEOUT):
        await _replay_case(tmp_path, start, expected)


async def test_replay_from_time(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            broker = Broker(durable_config(tmp_path, partitions=1))
            await nursery.start(broker.serve)
            async with broker.connect() as client:
                await publish_acked(client, 50)
                await trio.sleep(0.01)
                middle = time.time_ns()
                await trio.sleep(0.01)
                await publish_acked(client, 50, start=50)
                async with client.subscription("orders.>", start=Start.time(middle)) as sub:
                    got = await take(sub, 50)
                assert [int(m.payload) for m in got] == list(range(50, 100))
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("outbox_bytes", [None, 256 * 1024], ids=["default", "small-outbox"])
async def test_replay_seam_under_concurrent_publishing(
    tmp_path: Path, outbox_bytes: int | None
) -> None:
    """A subscriber replaying from the earliest while a publisher keeps going
    sees every message exactly once, in order per partition. A small outbox
    makes the held live runs overflow, so the replay must read them again."""
    total = 20_000
    with trio.fail_after(TIMEOUT * 2):
        async with trio.open_nursery() as nursery:
            config = durable_config(tmp_path, fsync="never")
            if outbox_bytes is not None:
                config = attrs.evolve(config, outbox_bytes=outbox_bytes)
            broker = Broker(config)
            await nursery.start(broker.serve)
            async with broker.connect("pub") as publisher, broker.connect("sub") as subscriber:
                await publish_acked(publisher, 5_000, keys=50)

                async def keep_publishing() -> None:
                    for start in range(5_000, total, 500):
                        await publish_acked(publisher, 500, start=start, keys=50)

                nursery.start_soon(keep_publishing)
                async with subscriber.subscription(
                    "orders.>", start=Start.earliest(), credit=1000
                ) as subscription:
                    got = await take(subscription, total)
            by_partition: dict[int, list[int]] = defaultdict(list)
            for message in got:
                by_partition[message.partition].append(message.offset)
            for offsets in by_partition.values():
                assert offsets == list(range(len(offsets)))
            assert sorted(int(m.payload) for m in got) == list(range(total))
            nursery.cancel_scope.cancel()


async def test_replay_of_a_long_partition_reads_it_to_the_end(tmp_path: Path) -> None:
    """A replay reads each partition in reads of at most a quarter of the
    outbox, up to the end the partition had: a partition holding more
    messages than a read's byte budget (here 16 KiB, 20,000 offsets) is
    replayed whole, in order, without overflowing the outbox."""
    total = 20_000
    with trio.fail_after(TIMEOUT * 2):
        async with trio.open_nursery() as nursery:
            config = attrs.evolve(
                durable_config(tmp_path, partitions=1, fsync="never"), outbox_bytes=64 * 1024
            )
            broker = Broker(config)
            await nursery.start(broker.serve)
            async with broker.connect("pub") as publisher, broker.connect("sub") as subscriber:
                for start in range(0, total, 1_000):
                    await publish_acked(publisher, 1_000, start=start, keys=7)
                async with subscriber.subscription(
                    "orders.>", start=Start.earliest(), credit=1000
                ) as subscription:
                    got = await take(subscription, total)
                assert [m.offset for m in got] == list(range(total))
                assert [int(m.payload) for m in got] == list(range(total))
                assert broker.statistics().router.dropped_slow_consumer == 0
            nursery.cancel_scope.cancel()


def test_config_parses_durable_tables(tmp_path: Path) -> None:
    path = tmp_path / "broky.toml"
    path.write_text(
        'data_dir = "/tmp/data"\n'
        "[[durable]]\n"
        'pattern = "orders.>"\npartitions = 4\nfsync = "interval"\nfsync_interval = 0.5\n'
        'roll = "daily 02:30 +01:00"\nretention_seconds = 3600\nsegment_bytes = 1048576\n'
        "[[durable]]\n"
        'name = "audit"\npattern = "audit.*"\nroll = 60\nretention_bytes = 1000000\n'
    )
    config = Config.from_toml(path)
    orders, audit = config.durable
    assert (orders.name, orders.partitions) == ("orders.all", 4)
    assert (orders.log.fsync.value, orders.log.fsync_interval_seconds) == ("interval", 0.5)
    assert orders.log.roll is not None
    assert orders.log.roll.utc_offset_ns == 3600 * 10**9
    assert audit.name == "audit"
    assert audit.log.roll is not None
    assert audit.log.roll.interval_ns == 60 * 10**9


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ({"pattern": "orders.>", "fsync": "sometimes"}, "durable[0].fsync"),
        ({"pattern": "orders.>", "partitions": "4"}, "durable[0].partitions"),
        ({"pattern": "orders.>", "colour": 1}, "durable[0].colour"),
        ({"partitions": 1}, "durable[0].pattern"),
        ({"pattern": "orders.>", "roll": "weekly"}, "durable[0].roll"),
        ({"pattern": "orders..x"}, "durable[0]"),
    ],
)
def test_config_errors_name_the_key(table: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        Config.from_mapping({"data_dir": "/tmp/x", "durable": [table]})


def test_durable_needs_a_data_dir() -> None:
    with pytest.raises(ConfigError, match="data_dir"):
        Config.from_mapping({"durable": [{"pattern": "a.>"}]})


def test_serve_refuses_durable_topics_with_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broky.toml"
    path.write_text(
        f'workers = 2\ncluster_listen = "127.0.0.1:1"\ndata_dir = "{tmp_path}"\n'
        '[[durable]]\npattern = "orders.>"\n'
    )
    assert main(["serve", "--config", str(path)]) == 2
    assert "not replicated between nodes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("first", "second", "overlap"),
    [
        (b"orders.>", b"orders.eu", True),
        (b"orders.>", b"orders", False),
        (b"orders.*", b"*.eu", True),
        (b"orders.*", b"prices.*", False),
        (b">", b"a.b.c", True),
        (b"a.*.c", b"a.b.>", True),
        (b"a.b", b"a.b.c", False),
        (b"a.>", b"*.>", True),
    ],
)
def test_patterns_overlap(first: bytes, second: bytes, overlap: bool) -> None:
    assert patterns_overlap(first, second) is overlap
    assert patterns_overlap(second, first) is overlap


async def test_replay_reads_only_topics_the_pattern_can_match(tmp_path: Path) -> None:
    """A replay of an unrelated pattern gets no durable backlog (and reads none)."""
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            broker = Broker(durable_config(tmp_path))
            await nursery.start(broker.serve)
            async with broker.connect() as client:
                await publish_acked(client, 100)
                async with client.subscription("prices.>", start=Start.earliest()) as sub:
                    await client.publish("prices.eu", b"live")
                    (message,) = await take(sub, 1)
                assert (message.payload, message.offset, message.partition) == (b"live", -1, -1)
            nursery.cancel_scope.cancel()


async def test_an_empty_durable_run_is_harmless(tmp_path: Path) -> None:
    """A Publish run with no messages stores nothing and breaks nothing."""
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            broker = Broker(durable_config(tmp_path))
            await nursery.start(broker.serve)
            async with broker.connect() as client:
                client._send_raw(encode_frame(Publish(1, (Run(b"orders.x", 0, 0, b"", b""),))))
                await client.flush()
                await publish_acked(client, 10)
                assert sum(info.end_offset for info in await client.partitions()) == 10
            nursery.cancel_scope.cancel()


async def test_metrics_export_the_durable_figures(
    start_broker: StartBroker, tmp_path: Path
) -> None:
    config = attrs.evolve(
        durable_config(tmp_path), listen=True, port=0, metrics_listen=True, metrics_port=0
    )
    broker = await start_broker(config)
    metrics = broker.observability.metrics_address
    assert metrics is not None
    with trio.fail_after(TIMEOUT):
        async with broker.connect() as client:
            await publish_acked(client, 200)
        _, text = await http_get(metrics, "/metrics")
    assert sample_value(text, "broky_durable_appended_messages_total", 'worker="0"') == 200
    assert sample_value(text, "broky_durable_fsyncs_total", 'worker="0"') >= 1
    # Each message is a FlatBuffer of at least 40 bytes (its payload is 1-3).
    assert sample_value(text, "broky_durable_log_bytes", 'worker="0"') > 200 * 40
    assert sample_value(text, "broky_durable_recovery_truncated_bytes_total", 'worker="0"') == 0


async def test_a_durable_topic_never_stores_a_key_that_is_not_text(tmp_path: Path) -> None:
    """Keys the router refuses are refused for durable topics too (same rule,
    same stream error) and never reach a partition's log."""
    bad = (b"orders.\xff\xfe", b"orders.with\x00nul", b"orders.a b")
    errors: list[Error] = []
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            broker = Broker(durable_config(tmp_path, partitions=1))
            await nursery.start(broker.serve)
            async with broker.connect() as client:
                client.on_error = errors.append
                runs = [raw_run(b"orders.ok", b"kept")] + [raw_run(key, b"refused") for key in bad]
                client._send_raw(encode_frame(Publish(1, tuple(runs))))
                await publish_acked(client, 1)  # one partition: stored after the raw frame
                assert [(e.code, e.stream) for e in errors] == [(ErrorCode.INVALID_KEY, 1)] * 3
                (stored,) = (await fetch_all(client)).values()
                assert [(m.key, m.payload) for m in stored] == [
                    ("orders.ok", b"kept"),
                    ("orders.k0", b"0"),
                ]
            nursery.cancel_scope.cancel()
