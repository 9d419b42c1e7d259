"""Durable-subscription consumers end to end: consume-and-ack through a real broker.

Run: ``.venv/bin/python -m benchmarks.bench_consumers [--messages N]
[--duration S] [--redeliveries N] [--credit N] [--max-in-flight N]
[--ack-interval S] [--workers N] [--dir DIR] [--client-only]``. Prints one JSON object
per line. The sans-IO core alone (the dispatcher's CPU per message, one sqlite
group commit) is ``benchmarks/bench_subscriptions.py``; this one adds the
sockets, the log reads and the client. Scenarios:

- ``client_consume_ack`` (no broker): the client's own CPU per message to
  wrap delivered runs of 100-byte messages as ``Delivery`` objects, ack each
  one and fold the acks into range ``Settle`` frames: what a consumer
  process pays per message, whatever the broker does; with runs of 100
  messages (one key) and of 1 (keys changing every message, as in the
  broker scenarios below).
- ``shared_x4``: ``--messages`` 100-byte messages are published (acked) to
  durable topic ``bench.>`` (8 partitions, ``fsync = "interval"``), then 4
  consumers of one ``shared`` subscription, each on its own connection,
  consume them from the earliest offset and ack every one (``settle_all`` per
  batch; acks batched by the client), ending with ``flush`` (the broker's
  receipts: the acks are committed).
- ``key_shared_1000_keys``: the same over keys ``bench.k0`` .. ``bench.k999``
  with a ``key-shared`` subscription; also checks that each key's offsets
  reached one consumer in increasing order (``order_violations``).
- ``nack_redelivery``: one consumer; each of ``--redeliveries`` messages is
  nacked with no delay (sent at once, no wait for the receipt) and the time
  until it arrives again is measured (median, p99, max; ms).

Every rate row reports ``lost`` (published offsets never acked) and
``duplicates`` (offsets delivered more than once) next to the rate,
``first_delivery_ms`` (from the start of the consume phase, which includes
connecting, creating the subscription and attaching, to the first delivery
a consumer took: part of the rate's time), and ``server_us_per_msg``: the
broker process's CPU seconds during the consume
phase divided by the messages acked (it covers reading, delivering and
acking, so it bounds the ack part from above); ``client_us_per_msg`` is the
same for this process (the 4 consumers and this checker's record), the
figure to compare on a shared machine, where rates move with the load.

``--workers N`` (default 1) runs each broker with N worker processes (as
``broky serve`` does by default, one per core): the durable partitions
spread over them and a consumer connected to one worker reads the others'
partitions through the owner channels (a spread consumer). The server CPU
is then summed over the worker processes (``bench_durable.worker_cpu``), so
``server_us_per_msg`` covers the relaying too; every row says ``workers``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator
from operator import attrgetter
from pathlib import Path

import trio

from benchmarks.bench_durable import worker_cpu, write_config
from benchmarks.interrupt import stop_children_on_signals
from broky import BrokyError, Start, connect
from broky.client.consumer import Consumer
from broky.client.consumer_options import (
    ACK_INTERVAL,
    ConsumerSettings,
    SubscriptionType,
    consumer_options,
)
from broky.client.delivery import Delivery
from broky.protocol.frames import Frame, Run, Settle
from broky.protocol.message import encode_message, pack_sizes

PAYLOAD = b"x" * 100
CONSUMERS = 4
_PARTITION = attrgetter("partition")
_OFFSET = attrgetter("offset")
_KEY = attrgetter("key")


class Seen:
    """Every delivery the consumers took, as columns in the order they took
    their batches (the checker's record: lost, duplicates, per-key order).
    Filled with C-level passes over each batch, so that the checker costs
    the consumer process little next to the client library it measures;
    keys are kept only where per-key order is checked."""

    def __init__(self, keep_keys: bool) -> None:
        self.partitions = array("q")
        self.offsets = array("q")
        self.keys: list[str] | None = [] if keep_keys else None
        self.per_consumer = [0] * CONSUMERS
        #: ``time.monotonic()`` when the first delivery was taken.
        self.first_at: float | None = None

    def add(self, batch: list[Delivery], consumer: int) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
        self.partitions.extend(map(_PARTITION, batch))
        self.offsets.extend(map(_OFFSET, batch))
        if self.keys is not None:
            self.keys.extend(map(_KEY, batch))
        self.per_consumer[consumer] += len(batch)

    def __len__(self) -> int:
        return len(self.offsets)


#: Messages per acked publish frame while loading the topic.
LOAD_WINDOW = 20_000


class _Sink:
    """A client stand-in for ``client_consume_ack``: counts what is sent."""

    closed = False

    def __init__(self) -> None:
        self.settles = 0
        self.ranges = 0

    def _send_control(self, frame: Frame) -> None:
        if isinstance(frame, Settle):
            self.settles += 1
            self.ranges += len(frame.partitions)

    def _next_stream(self) -> int:
        return 1

    def _adopt(self, consumer: Consumer) -> None:
        pass

    def _forget(self, subscription: object) -> None:
        pass


async def client_consume_ack(messages: int, per_run: int) -> dict[str, object]:
    """Client CPU per message: wrap, ack, fold into ranges (runs of ``per_run``)."""
    sink = _Sink()
    options = consumer_options("bench.>", "bench", "shared", {"ack_batch": 1024})
    consumer = Consumer(sink, 1, options)
    blob = encode_message(PAYLOAD)
    sizes = pack_sizes([len(blob)] * per_run)
    runs = [
        # Over 8 partitions, each run's offsets following its partition's last.
        Run(b"bench.k", 1, per_run, sizes, blob * per_run, index % 8, index // 8 * per_run)
        for index in range(messages // per_run)
    ]
    start = time.process_time_ns()
    acked = 0
    frame_runs = max(1, 5000 // per_run)  # 5,000 messages per Deliver frame
    for first in range(0, len(runs), frame_runs):
        consumer._deliver(tuple(runs[first : first + frame_runs]))
        while consumer.statistics().buffered_messages:
            batch = await consumer._next_batch(512)
            await consumer.settle_all(batch)
            acked += len(batch)
    consumer._send_settles()
    elapsed = time.process_time_ns() - start
    return {
        "messages": acked,
        "messages_per_run": per_run,
        "client_ns_per_message": round(elapsed / acked, 1),
        "settle_frames": sink.settles,
        "ranges_sent": sink.ranges,
    }


async def _load(address: str, messages: int, keys: int) -> int:
    """Publish ``messages`` acked messages over ``keys`` keys; returns how many were acked."""
    acked = 0
    async with connect(address, name="bench-load") as client:
        for first in range(0, messages, LOAD_WINDOW):
            for number in range(first, min(first + LOAD_WINDOW, messages)):
                await client.publish(f"bench.k{number % keys}", PAYLOAD, ack=True)
            runs = await client.flush_acks()
            acked += runs.messages
    return acked


async def _consume(
    address: str,
    subscription: str,
    kind: SubscriptionType,
    index: int,
    seen: Seen,
    stop: Stop,
    deadline: float,
    settings: ConsumerSettings,
) -> None:
    async with (
        connect(address, name=f"bench-consumer-{index}") as client,
        client.consumer("bench.>", subscription=subscription, type=kind, **settings) as consumer,
    ):
        with trio.move_on_at(deadline):
            batches = consumer.batches()
            while True:
                with stop.waiting() as wait:
                    batch = await anext(batches)
                if wait.cancelled_caught:
                    break
                seen.add(batch, index)
                await consumer.settle_all(batch)
        await consumer.flush()


class Stop:
    """Ends the consumers' waits for a batch the moment everything is seen.

    Only the wait is cancelled, never a settle: each consumer then flushes
    (its acks sent and their receipts back, so committed) before the clock
    stops. A consumer waiting for a batch that will never come would
    otherwise sit out a poll timeout inside the timed phase."""

    def __init__(self) -> None:
        self._waits: set[trio.CancelScope] = set()
        self.stopped = False

    @contextlib.contextmanager
    def waiting(self) -> Iterator[trio.CancelScope]:
        with trio.CancelScope() as scope:
            if self.stopped:
                scope.cancel()
            self._waits.add(scope)
            try:
                yield scope
            finally:
                self._waits.discard(scope)

    def set(self) -> None:
        self.stopped = True
        for scope in self._waits:
            scope.cancel()


async def consume_rate(
    address: str,
    pid: int,
    messages: int,
    keys: int,
    kind: SubscriptionType,
    duration: float,
    settings: ConsumerSettings,
) -> dict[str, object]:
    """Load the topic, then time 4 consumers consuming and acking all of it."""
    published = await _load(address, messages, keys)
    seen = Seen(keep_keys=kind == "key-shared")
    stop = Stop()
    server_before = sum(worker_cpu(pid))
    client_before = time.process_time()
    start = time.monotonic()
    deadline = trio.current_time() + duration

    async def watch() -> None:
        while len(seen) < published and trio.current_time() < deadline:  # noqa: ASYNC110
            await trio.sleep(0.01)
        stop.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        for index in range(CONSUMERS):
            nursery.start_soon(
                _consume, address, f"bench-{kind}", kind, index, seen, stop, deadline + 10, settings
            )
    elapsed = time.monotonic() - start
    server_seconds = sum(worker_cpu(pid)) - server_before
    client_seconds = time.process_time() - client_before
    unique = set(zip(seen.partitions, seen.offsets, strict=True))
    figures: dict[str, object] = {
        "type": kind,
        "keys": keys,
        "credit": settings.get("credit"),
        "max_in_flight": settings.get("max_in_flight"),
        "ack_interval": settings.get("ack_interval"),
        "published": published,
        "acked": len(unique),
        "msgs_per_s": round(len(unique) / elapsed),
        "lost": published - len(unique),
        "duplicates": len(seen) - len(unique),
        "server_cpu": round(server_seconds / elapsed, 2),
        "client_cpu": round(client_seconds / elapsed, 2),
        "server_us_per_msg": round(server_seconds / max(len(unique), 1) * 1e6, 2),
        "client_us_per_msg": round(client_seconds / max(len(unique), 1) * 1e6, 2),
        "per_consumer": seen.per_consumer,
        # From the consume phase's start (4 connects, the subscription's
        # creation and the consumers' attaches) to the first delivery taken.
        "first_delivery_ms": (
            None if seen.first_at is None else round((seen.first_at - start) * 1000, 1)
        ),
    }
    if kind == "key-shared":
        figures["order_violations"] = _order_violations(seen)
    return figures


def _order_violations(seen: Seen) -> int:
    """Deliveries of a key at or below the key's previous offset.

    ``seen`` is in the order the consumers took their batches; a key moves
    to another consumer only after its old one acked what it held of it,
    which it did after recording it here, so without redeliveries (none in
    this scenario) per-key order shows as increasing offsets in ``seen``.
    """
    assert seen.keys is not None
    last: dict[str, int] = {}
    violations = 0
    for offset, key in zip(seen.offsets, seen.keys, strict=True):
        if last.get(key, -1) >= offset:
            violations += 1
        last[key] = offset
    return violations


async def nack_latency(address: str, rounds: int) -> dict[str, object]:
    """Milliseconds from ``nack(delay=0)`` to the message's redelivery.

    The consumer sends settles at once (``ack_interval=0``: the timer task
    sends at its next checkpoint) and does not wait for the receipt, so the
    figure is the broker's path: settle, the redelivery decision (which
    waits for the group commit of the new delivery count), read, deliver.
    """
    latencies: list[float] = []
    async with (
        connect(address, name="bench-nack") as client,
        client.consumer(
            "bench.>", subscription="bench-nack", start=Start.latest(), ack_interval=0
        ) as consumer,
    ):
        for number in range(rounds):
            await client.publish(f"bench.n{number}", PAYLOAD, ack=True)
            await client.flush_acks()
            first: Delivery = await anext(consumer)
            start = time.perf_counter()
            await first.nack(delay=0)
            again = await anext(consumer)
            latencies.append((time.perf_counter() - start) * 1000)
            assert (again.partition, again.offset) == (first.partition, first.offset)
            assert again.delivery_count == 2, again
            await again.ack()
        await consumer.flush()
    latencies.sort()
    return {
        "redeliveries": len(latencies),
        "ms_median": round(statistics.median(latencies), 3),
        "ms_p99": round(latencies[max(0, int(len(latencies) * 0.99) - 1)], 3),
        "ms_max": round(latencies[-1], 3),
    }


def emit(scenario: str, **fields: object) -> None:
    print(json.dumps({"scenario": scenario, **fields}), flush=True)


def _against_broker(root: Path, name: str, workers: int, run: object, *args: object) -> None:
    """Run scenario ``run`` against a fresh ``broky serve`` process of
    ``workers`` workers; a broker that refuses is reported as the row's
    ``error``, never as a rate."""
    config = root / f"{name}.toml"
    write_config(config, root / f"data-{name}", "interval", workers)
    process = subprocess.Popen(
        [sys.executable, "-m", "broky", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        address = process.stdout.readline().strip().rsplit(" ", 1)[-1]
        figures: dict[str, object] = trio.run(run, address, process.pid, *args)  # type: ignore[arg-type]
        emit(name, workers=workers, **figures)
    except* BrokyError as refused:
        # Each consumer task raises the same refusal: report it once.
        emit(name, workers=workers, error=str(refused.exceptions[0]))
    finally:
        process.terminate()
        process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--duration", type=float, default=60.0, help="bound of one consume phase")
    parser.add_argument("--redeliveries", type=int, default=200)
    parser.add_argument("--dir", default=None, help="where brokers keep data (default: temp)")
    parser.add_argument("--client-only", action="store_true", help="only client_consume_ack")
    parser.add_argument(
        "--only", default=None, help="run only this broker scenario (e.g. shared_x4, to profile it)"
    )
    parser.add_argument("--credit", type=int, default=20_000, help="per consumer")
    parser.add_argument("--max-in-flight", type=int, default=50_000, help="per consumer")
    parser.add_argument("--ack-interval", type=float, default=ACK_INTERVAL, help="seconds")
    parser.add_argument("--workers", type=int, default=1, help="worker processes per broker")
    args = parser.parse_args()
    stop_children_on_signals()
    settings = ConsumerSettings(
        start=Start.earliest(),
        credit=args.credit,
        max_in_flight=args.max_in_flight,
        ack_interval=args.ack_interval,
    )
    for per_run in (100, 1):
        emit("client_consume_ack", **trio.run(client_consume_ack, args.messages, per_run))
    if args.client_only:
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        root = Path(directory)
        for name, keys, kind in (
            ("shared_x4", 8, "shared"),
            ("key_shared_1000_keys", 1000, "key-shared"),
        ):
            if args.only not in (None, name):
                continue
            _against_broker(
                root,
                name,
                args.workers,
                consume_rate,
                args.messages,
                keys,
                kind,
                args.duration,
                settings,
            )

        async def nack(address: str, pid: int) -> dict[str, object]:
            return await nack_latency(address, args.redeliveries)

        if args.only in (None, "nack_redelivery"):
            _against_broker(root, "nack_redelivery", args.workers, nack)


if __name__ == "__main__":
    main()
