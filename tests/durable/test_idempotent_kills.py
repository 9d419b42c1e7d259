"""Idempotent publishers against ``broky serve --workers 2`` whose workers are
SIGKILLed again and again: the client library retries by itself.

Each publisher keeps one ``broky.connect`` client for the whole test and
never handles an error: ``flush_acks`` resends what failed retriably
(OwnerUnavailable while an owner restarts) and reconnects when its own
worker is killed, with the same producer id and sequences. The checker then
holds the strongest promise: every message published was acknowledged, and
is stored exactly once (0 lost, 0 duplicates), at the partition its ack
named, in publish order per publisher and partition. The killed worker is
chosen at random, so it is sometimes the owner of the partitions a
publisher's frames go to and sometimes the worker the publisher is
connected to. Every process is started here on 127.0.0.1 and killed by PID.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest
import trio

from broky import connect
from tests.durable.test_workers import (
    KEYS,
    PARTITIONS,
    all_partitions_writable,
    read_back,
    write_config,
)
from tests.mesh.test_nodes import nodes

pytestmark = pytest.mark.slow

#: Kill cycles the test must complete, within BUDGET_SECONDS (each costs a
#: worker restart, ~0.5-1 s here, and a random pause; 2-3x that while the
#: suite's other pytest worker is busy).
CYCLES = 20
BUDGET_SECONDS = 180.0
PUBLISHERS = 2


async def publish_until_stopped(
    address: str, index: int, stop: trio.Event, acked: dict[bytes, int], published: list[int]
) -> None:
    """Publish acked batches over every partition until ``stop``; record
    what each ack covered (payload -> partition). No error handling: the
    client library retries, and anything it raises fails the test."""
    counter = 0
    async with connect(address, name=f"p{index}") as client:
        while not stop.is_set():
            sent: dict[str, list[bytes]] = defaultdict(list)
            for _ in range(random.randint(10, 60)):
                key = KEYS[random.randrange(PARTITIONS)]
                payload = b"%d-%d" % (index, counter)
                await client.publish(key, payload, ack=True)
                sent[key].append(payload)
                counter += 1
            for ack in await client.flush_acks():
                count = ack.last_offset - ack.first_offset + 1
                for payload in sent[ack.key][:count]:
                    acked[payload] = ack.partition
                del sent[ack.key][:count]
            assert not any(sent.values()), "an acked batch came back incomplete"
            published[index] = counter


async def test_idempotent_retries_store_every_message_exactly_once(tmp_path: Path) -> None:
    config = tmp_path / "broky.toml"
    write_config(config, 2)
    rng = random.Random(1414)
    acked: dict[bytes, int] = {}
    published = [0] * PUBLISHERS
    cycles = 0
    with nodes() as start:
        node = start(["--config", str(config)])
        started = time.monotonic()
        stop = trio.Event()
        with trio.fail_after(BUDGET_SECONDS + 60):
            async with trio.open_nursery() as nursery:
                for index in range(PUBLISHERS):
                    nursery.start_soon(
                        publish_until_stopped, node.address, index, stop, acked, published
                    )
                while cycles < CYCLES and time.monotonic() - started < BUDGET_SECONDS:
                    await all_partitions_writable(node.address, time.monotonic() + 15)
                    await trio.sleep(rng.uniform(0.05, 0.3))
                    os.kill(rng.choice(node.workers()), signal.SIGKILL)
                    cycles += 1
                # All workers back, so that the publishers' last flush (their
                # client's exit) does not meet a worker killed a moment ago.
                await all_partitions_writable(node.address, time.monotonic() + 15)
                stop.set()  # the publishers finish their batch (retrying) and end
            stored = await read_back(node.address, time.monotonic() + 15)
    assert cycles >= CYCLES, f"only {cycles} kill cycles fit in {BUDGET_SECONDS} s"
    total = sum(published)
    assert len(acked) == total, f"{total - len(acked)} published messages never acked"
    seen: dict[bytes, int] = {}
    duplicates = 0
    order: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    for partition, messages in stored.items():
        assert [m.offset for m in messages] == list(range(len(messages))), partition
        for message in messages:
            if message.payload == b"probe":
                continue
            if message.payload in seen:
                duplicates += 1
            seen[message.payload] = partition
            publisher, number = message.payload.split(b"-")
            order[(partition, publisher)].append(int(number))
    lost = [payload for payload, partition in acked.items() if seen.get(payload) != partition]
    assert duplicates == 0, f"{duplicates} messages stored twice"
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
    assert len(seen) == total, "a message was stored that was never published"
    for numbers in order.values():
        assert numbers == sorted(numbers), "a publisher's order broke within a partition"
    assert total > 1000
    print(f"cycles={cycles} published={total} acked={len(acked)} duplicates={duplicates}")
