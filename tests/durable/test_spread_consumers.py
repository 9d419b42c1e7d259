"""Durable subscriptions consumed from any worker: ``broky serve --workers N``.

The topic's 8 partitions are spread over every worker, and connections are
handed to the workers round-robin (``accept = "handoff"``), so consumers
connected one after another sit on different workers and each reads
partitions of every worker through the owner channels. Every process is
started here, on 127.0.0.1, and killed by PID when the test ends.
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

import broky
from broky import BrokyError, Start, connect
from broky.durable.ownership import partition_owner
from broky.protocol.constants import ErrorCode, SettleKind, StartKind, SubscriptionKind
from broky.protocol.frames import Error, Settled, Subscribed
from tests.conftest import ConnectionEnded, RawConnection
from tests.durable.test_workers import (
    KEYS,
    kill_workers,
    publish_until_cancelled,
    write_config,
)
from tests.mesh.test_nodes import nodes
from tests.subscriptions.wire import Consumer, Delivery
from tests.subscriptions.wire import connect as connect_raw

pytestmark = pytest.mark.slow

TIMEOUT = 40


def where(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


async def publish(address: str, count: int, keys: list[str]) -> None:
    async with connect(address, name="publisher") as client:
        for number in range(count):
            await client.publish(keys[number % len(keys)], b"%d" % number, ack=True)
        await client.flush_acks()


@asynccontextmanager
async def consumers(address: str, count: int) -> AsyncIterator[list[Consumer]]:
    """``count`` raw consumers, connected one after another (one per worker)."""
    async with AsyncExitStack() as stack:
        found = []
        for index in range(count):
            raw: RawConnection = await stack.enter_async_context(
                connect_raw(where(address), f"consumer-{index}")
            )
            found.append(Consumer(raw))
        yield found


async def drain(
    consumer: Consumer,
    credit: int,
    ledger: Counter[int],
    stop: trio.Event,
    total: int,
    outstanding: list[int],
) -> list[Delivery]:
    """Receive, ack (with receipts) and return credit until every message
    was delivered and its ack receipted; checks the consumer never gets more
    than the credit it granted. ``outstanding``: receipts awaited by all."""
    granted = credit
    got: list[Delivery] = []
    unreceipted: dict[int, list[int]] = {}
    receipted: set[int] = set()

    def on_settled(settled: Settled) -> None:
        receipted.update(unreceipted.pop(settled.sequence))
        outstanding[0] -= 1

    consumer.on_settled = on_settled
    while not stop.is_set():
        if len(ledger) == total and not outstanding[0]:
            stop.set()
        deliveries: list[Delivery] = []
        with trio.move_on_after(0.1):  # only the wait: a settle is never cut short
            deliveries = await consumer.next()
        if not deliveries:
            continue
        got.extend(deliveries)
        assert len(got) <= granted, f"{len(got)} received with {granted} credit"
        for delivery in deliveries:
            ledger[int(delivery.payload)] += 1
        sequence = await consumer.settle(deliveries, receipt=True)
        unreceipted[sequence] = [int(d.payload) for d in deliveries]
        outstanding[0] += 1
        await consumer.flow(len(deliveries))
        granted += len(deliveries)
    assert not consumer.errors, consumer.errors
    assert not unreceipted
    return got


@pytest.mark.parametrize("workers", [2, 3])
async def test_a_shared_subscription_is_consumed_from_every_worker(
    tmp_path: Path, workers: int
) -> None:
    config = tmp_path / "broky.toml"
    write_config(config, workers)
    total = 400
    with nodes() as start, trio.fail_after(TIMEOUT):
        node = start(["--config", str(config)])
        async with consumers(node.address, workers) as readers:
            for reader in readers:
                answer = await reader.consume("work", start=StartKind.EARLIEST, credit=0)
                assert isinstance(answer, Subscribed), answer
            await publish(node.address, total, KEYS)
            ledger: Counter[int] = Counter()
            stop = trio.Event()
            outstanding = [0]
            # Windows of 1 (smaller than the number of owners), 7 and 50.
            credits = [1, 7, 50][:workers]
            results: dict[int, list[Delivery]] = {}

            async def run(index: int) -> None:
                await readers[index].flow(credits[index])
                results[index] = await drain(
                    readers[index], credits[index], ledger, stop, total, outstanding
                )

            async with trio.open_nursery() as nursery:
                for index in range(workers):
                    nursery.start_soon(run, index)
    assert sorted(ledger) == list(range(total))
    twice = {
        (index, d.partition, d.offset, d.count, int(d.payload))
        for index, deliveries in results.items()
        for d in deliveries
        if ledger[int(d.payload)] > 1
    }
    assert not twice, f"delivered twice (consumer, partition, offset, count, number): {twice}"
    for deliveries in results.values():
        assert all(d.count == 1 for d in deliveries)
        # Each consumer read partitions of more than one worker.
        owners = {partition_owner("orders", d.partition, workers) for d in deliveries}
        assert len(owners) > 1, owners
    assert sum(len(d) for d in results.values()) == total


async def test_exclusive_is_refused_across_workers_until_the_holder_leaves(
    tmp_path: Path,
) -> None:
    config = tmp_path / "broky.toml"
    write_config(config, 2)
    kind = SubscriptionKind.EXCLUSIVE
    with nodes() as start, trio.fail_after(TIMEOUT):
        node = start(["--config", str(config)])
        async with (
            connect_raw(where(node.address), "first") as first_raw,
            connect_raw(where(node.address), "second") as second_raw,
        ):
            first, second = Consumer(first_raw), Consumer(second_raw)
            assert isinstance(await first.consume("solo", kind=kind), Subscribed)
            refused = await second.consume("solo", kind=kind)
            assert isinstance(refused, Error)
            assert refused.code == ErrorCode.SUBSCRIPTION_REFUSED
            assert "exclusive" in refused.message
            await first.close()
            # The holder's parts are detached on every worker: it can be taken.
            with trio.fail_after(5):
                while True:
                    answer = await Consumer(second_raw, stream=2).consume("solo", kind=kind)
                    if isinstance(answer, Subscribed):
                        break
                    await trio.sleep(0.05)
            await publish(node.address, 16, KEYS)
            got = await Consumer(second_raw, stream=2).take(16)
            assert sorted(int(d.payload) for d in got) == list(range(16))


async def test_nacks_and_a_departure_redeliver_across_workers(tmp_path: Path) -> None:
    """Redelivery counts travel with the messages from every owner, and a
    consumer that leaves is detached from every owner at once (its messages
    go to a consumer on another worker long before the 30 s ack timeout)."""
    config = tmp_path / "broky.toml"
    write_config(config, 2)
    with nodes() as start, trio.fail_after(TIMEOUT):
        node = start(["--config", str(config)])
        async with connect_raw(where(node.address), "second") as second_raw:
            async with connect_raw(where(node.address), "first") as first_raw:
                first = Consumer(first_raw)
                answer = await first.consume("redo", start=StartKind.EARLIEST, credit=100)
                assert isinstance(answer, Subscribed), answer
                await publish(node.address, 16, KEYS)
                got = await first.take(16)
                assert {d.count for d in got} == {1}
                assert len({partition_owner("orders", d.partition, 2) for d in got}) == 2
                await first.settle(got[:8], SettleKind.NACK, delay_ms=0)
                again = await first.take(8)
                assert sorted((d.partition, d.offset) for d in again) == sorted(
                    (d.partition, d.offset) for d in got[:8]
                )
                assert {d.count for d in again} == {2}
                second = Consumer(second_raw)
                answer = await second.consume("redo", credit=100)
                assert isinstance(answer, Subscribed), answer
            # The first consumer's connection is closed, nothing acked.
            with trio.fail_after(5):
                taken = await second.take(16)
            assert sorted(int(d.payload) for d in taken) == list(range(16))
            counts = Counter(d.count for d in taken)
            assert counts == {2: 8, 3: 8}, counts


async def test_key_shared_keeps_each_keys_order_across_workers(tmp_path: Path) -> None:
    config = tmp_path / "broky.toml"
    write_config(config, 3)
    keys = [f"orders.k{n}" for n in range(24)]
    total = 480
    with nodes() as start, trio.fail_after(TIMEOUT):
        node = start(["--config", str(config)])
        async with consumers(node.address, 3) as readers:
            for reader in readers:
                answer = await reader.consume(
                    "keyed", kind=SubscriptionKind.KEY_SHARED, start=StartKind.EARLIEST, credit=40
                )
                assert isinstance(answer, Subscribed), answer
            await publish(node.address, total, keys)
            ledger: Counter[int] = Counter()
            stop = trio.Event()
            outstanding = [0]
            results: dict[int, list[Delivery]] = {}

            async def run(index: int) -> None:
                results[index] = await drain(readers[index], 40, ledger, stop, total, outstanding)

            async with trio.open_nursery() as nursery:
                for index in range(3):
                    nursery.start_soon(run, index)
    assert set(ledger.values()) == {1}
    assert sorted(ledger) == list(range(total))
    holders: dict[str, set[int]] = defaultdict(set)
    for index, deliveries in results.items():
        per_key: dict[str, list[int]] = defaultdict(list)
        for delivery in deliveries:
            per_key[delivery.key].append(int(delivery.payload))
            holders[delivery.key].add(index)
        for numbers in per_key.values():
            assert numbers == sorted(numbers)  # publish order per key
    assert all(len(held) == 1 for held in holders.values())  # no churn: one consumer a key
    assert len({index for held in holders.values() for index in held}) > 1


#: Kill cycles of the fault test, and its bounds: it stops early rather
#: than run long, and falling short of MIN_CYCLES fails it.
KILL_CYCLES = 8
MIN_KILL_CYCLES = 5
#: (the loop took ~19 s here alone; the suite's other pytest worker may
#: take half of the cores)
KILL_BUDGET_SECONDS = 60.0
DRAIN_SECONDS = 25.0
QUIET_SECONDS = 1.5
PROBE = b"probe"
Lost = (ConnectionEnded, BrokyError, OSError, trio.BrokenResourceError, trio.ClosedResourceError)


@attrs.define
class Ledger:
    """What the checker saw, over every cycle (messages by payload)."""

    #: Acks sent (one lost by a crash brings its message back).
    acked: set[bytes] = attrs.field(factory=set)
    #: Acks whose Settled arrived: durable, never delivered again.
    receipted: set[bytes] = attrs.field(factory=set)
    deliveries: Counter[bytes] = attrs.field(factory=Counter)
    #: Deliveries of a message whose ack had been receipted (must stay 0).
    after_receipt: int = 0
    #: Consumers ended with OwnerUnavailable (an owner worker was killed
    #: while they attached; once attached they re-attach by themselves).
    owner_unavailable: int = 0
    #: What each consumer is doing (for a failure's message).
    phases: dict[int, str] = attrs.field(factory=dict)

    def delivered(self, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            if delivery.payload == PROBE:
                continue  # all_partitions_writable's, all alike
            self.deliveries[delivery.payload] += 1
            if delivery.payload in self.receipted:
                self.after_receipt += 1


async def consume_until_cancelled(address: str, index: int, ledger: Ledger) -> None:
    """A consumer of the shared subscription that consumes again whenever
    its consumer ends (an owner died) or its connection is lost."""
    while True:
        try:
            async with connect_raw(where(address), f"consumer-{index}") as raw:
                reader = Consumer(raw)
                pending: dict[int, list[bytes]] = {}

                def receipted(settled: Settled, pending: dict[int, list[bytes]] = pending) -> None:
                    payloads = pending.pop(settled.sequence, [])
                    if not settled.unconfirmed:  # else an owner restarted: they may come again
                        ledger.receipted.update(payloads)

                reader.on_settled = receipted
                ledger.phases[index] = "consuming"
                answer = await reader.consume(
                    "crashy", start=StartKind.EARLIEST, credit=100, max_in_flight=300
                )
                ledger.phases[index] = f"receiving after {answer}"
                while isinstance(answer, Subscribed) and not reader.errors:
                    deliveries: list[Delivery] = []
                    with trio.move_on_after(0.1):  # only the wait, never a settle
                        deliveries = await reader.next()
                    if not deliveries:
                        continue
                    ledger.delivered(deliveries)
                    sequence = await reader.settle(deliveries, receipt=True)
                    pending[sequence] = [d.payload for d in deliveries]
                    ledger.acked.update(pending[sequence])
                    await reader.flow(len(deliveries))
                errors = [*reader.errors, *([answer] if isinstance(answer, Error) else [])]
                # The consumer ended because an owner died (a settle sent
                # meanwhile is answered UnknownStream): nothing else.
                codes = {error.code for error in errors if isinstance(error, Error)}
                assert codes <= {ErrorCode.OWNER_UNAVAILABLE, ErrorCode.UNKNOWN_STREAM}, errors
                if codes:
                    assert ErrorCode.OWNER_UNAVAILABLE in codes, errors
                    ledger.owner_unavailable += 1
        except Lost:
            pass  # our worker was killed: connect again (to another, maybe)
        await trio.sleep(0.05)


async def test_consumers_survive_sigkilled_workers(tmp_path: Path) -> None:
    """Workers SIGKILLed one at a time while consumers on every worker
    receive and ack with receipts and publishers publish with acks: in the
    end every acknowledged publish has a receipted ack, and no message is
    delivered after its ack was receipted."""
    config = tmp_path / "broky.toml"
    write_config(config, 3)
    rng = random.Random(1403)
    published: dict[bytes, int] = {}
    failures = [0]
    ledger = Ledger()
    with nodes() as start, trio.fail_after(KILL_BUDGET_SECONDS + DRAIN_SECONDS + 40):
        node = start(["--config", str(config)])
        started = time.monotonic()
        async with trio.open_nursery() as consumers_nursery:
            for index in range(3):
                consumers_nursery.start_soon(consume_until_cancelled, node.address, index, ledger)
            async with trio.open_nursery() as publishers:
                for index in range(2):
                    publishers.start_soon(
                        publish_until_cancelled, node.address, index, published, failures
                    )
                cycles = await kill_workers(
                    node, rng, KILL_CYCLES, started + KILL_BUDGET_SECONDS, pause=(0.3, 0.8)
                )
                publishers.cancel_scope.cancel()
            with trio.move_on_after(DRAIN_SECONDS):
                while not published.keys() <= ledger.acked:  # noqa: ASYNC110 - a checker's poll
                    await trio.sleep(0.05)
            consumers_nursery.cancel_scope.cancel()
        # The consumers are gone: whatever an owner still holds unacked (an
        # ack lost with a killed worker) is due again at once. One consumer
        # takes it all, until nothing comes for QUIET_SECONDS.
        leftovers = await verify(node.address, ledger)
    assert cycles >= MIN_KILL_CYCLES, f"only {cycles} kill cycles fit in {KILL_BUDGET_SECONDS} s"
    assert len(published) > 500
    missing = published.keys() - ledger.acked
    never = [payload for payload in missing if not ledger.deliveries[payload]]
    assert not missing, (
        f"{len(missing)} acknowledged publishes never acked, e.g. {list(missing)[:5]}; "
        f"{len(never)} never delivered; consumers: {ledger.phases}"
    )
    # No message came back once its ack was receipted (the documented
    # window: an ack without receipt may be lost with a killed worker), the
    # final consumer included: it gets only what was unacked or unreceipted.
    assert ledger.after_receipt == 0
    unreceipted = ledger.acked - ledger.receipted
    redelivered = sum(ledger.deliveries.values()) - len(ledger.deliveries)
    print(
        f"cycles={cycles} published={len(published)} delivered={len(ledger.deliveries)} "
        f"redelivered={redelivered} acked_without_receipt={len(unreceipted)} "
        f"redelivered_at_the_end={len(leftovers)} owner_unavailable={ledger.owner_unavailable} "
        f"failed_publish_frames={failures[0]}"
    )


async def verify(address: str, ledger: Ledger) -> list[bytes]:
    """Consume and ack what is left until nothing comes for QUIET_SECONDS;
    what came (each ack receipted)."""
    async with connect_raw(where(address), "verifier") as raw:
        reader = Consumer(raw)
        with trio.fail_after(10):  # this worker's channels may still be reconnecting
            while True:
                answer = await reader.consume("crashy", credit=10_000, max_in_flight=10_000)
                if isinstance(answer, Subscribed):
                    break
                assert isinstance(answer, Error), answer
                assert answer.code is ErrorCode.OWNER_UNAVAILABLE, answer
                await trio.sleep(0.05)
        found: list[bytes] = []
        while True:
            with trio.move_on_after(QUIET_SECONDS) as quiet:
                deliveries = await reader.next()
            if quiet.cancelled_caught:
                break
            ledger.delivered(deliveries)
            found.extend(d.payload for d in deliveries)
            sequence = await reader.settle(deliveries, receipt=True)
            await reader.receipt(sequence)
            ledger.acked.update(d.payload for d in deliveries)
            ledger.receipted.update(d.payload for d in deliveries)
        assert not reader.errors, reader.errors
        return found


async def test_the_client_library_consumes_across_workers(tmp_path: Path) -> None:
    """``client.consumer`` on worker 0 and on worker 1 of a two-worker node
    share the work of every partition; each message is acked once."""
    config = tmp_path / "broky.toml"
    write_config(config, 2)
    total = 200
    with nodes() as start, trio.fail_after(TIMEOUT):
        node = start(["--config", str(config)])
        seen: list[broky.Delivery] = []
        async with (
            connect(node.address, name="a") as first,
            connect(node.address, name="b") as second,
            first.consumer("orders.>", subscription="lib", start=Start.earliest()) as one,
            second.consumer("orders.>", subscription="lib", start=Start.earliest()) as two,
        ):
            await publish(node.address, total, KEYS)

            async def take(consumer: broky.Consumer) -> None:
                async for delivery in consumer:
                    seen.append(delivery)
                    await delivery.ack()
                    if len(seen) == total:
                        return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(take, one)
                nursery.start_soon(take, two)
                while len(seen) < total:  # noqa: ASYNC110 - a checker's poll
                    await trio.sleep(0.02)
                nursery.cancel_scope.cancel()
            await one.flush()
            await two.flush()
    assert sorted(int(d.payload) for d in seen) == list(range(total))


async def test_a_pattern_over_two_topics_names_each_delivery_s_topic(tmp_path: Path) -> None:
    """``shop.>`` over two durable topics whose partitions sit on both
    workers: every delivery carries its own topic and every ack lands."""
    config = tmp_path / "broky.toml"
    config.write_text(
        'host = "127.0.0.1"\nport = 0\nworkers = 2\naccept = "handoff"\n'
        f'log_level = "error"\ndata_dir = "{tmp_path / "data"}"\nsystem_events = false\n'
        "system_metrics_interval = 0\n"
        + "".join(
            f'[[durable]]\nname = "{name}"\npattern = "shop.{name}.>"\npartitions = 4\n'
            for name in ("eu", "us")
        )
    )
    total = 120
    with nodes() as start, trio.fail_after(TIMEOUT):
        node = start(["--config", str(config)])
        keys = [f"shop.{region}.k{n}" for n in range(8) for region in ("eu", "us")]
        await publish(node.address, total, keys)
        seen: list[tuple[str, str]] = []
        async with (
            connect(node.address, name="a") as client,
            client.consumer("shop.>", subscription="both", start=Start.earliest()) as consumer,
        ):
            async for delivery in consumer:
                seen.append((delivery.topic, delivery.key))
                await delivery.ack()
                if len(seen) == total:
                    break
            await consumer.flush()
        assert all(key.split(".")[1] == topic for topic, key in seen)
        assert {topic for topic, _ in seen} == {"eu", "us"}
