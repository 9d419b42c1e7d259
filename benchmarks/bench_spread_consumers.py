"""Durable-subscription consumption end to end, one worker against several.

Run: ``.venv/bin/python -m benchmarks.bench_spread_consumers [--messages N]
[--consumers C] [--workers N ...]``. Prints one JSON object per line.

For each ``--workers`` count (repeatable, default 1 and 2) a ``broky serve``
process keeps topic ``bench.>`` durable (8 partitions, ``fsync =
"always"``; with several workers the partitions spread over them and
connections are handed out round-robin). ``--messages`` 100-byte messages
are published first (acked), then ``--consumers`` raw consumers of one
shared subscription, one per connection (so on different workers), consume
from the earliest offset: each ``Deliver`` is acked at once as ranges in one
``Settle`` and its credit returned with ``Flow``; the last ``Settle`` of each
consumer asks for a receipt. ``msgs_per_s`` is messages delivered and acked
(receipts in) per second of wall time, from the first ``Consume`` to the
last receipt; ``lost`` counts messages never delivered and ``duplicates``
messages delivered twice (both must be 0). ``worker_cpu`` is each worker's
CPU seconds over the consuming phase: with several workers, most consumers
read partitions of other workers through the owner channels
(broky.durable.consumer_relays), so the row shows what relaying costs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from benchmarks.bench_durable import PAYLOAD, worker_cpu, write_config
from benchmarks.interrupt import stop_children_on_signals
from broky import connect
from broky.protocol.codec import encode_frame
from broky.protocol.connection import ProtocolMachine, Role
from broky.protocol.constants import DEFAULT_MAX_FRAME_BYTES, StartKind, SubscriptionKind
from broky.protocol.frames import (
    Consume,
    Deliver,
    Error,
    Flow,
    Hello,
    Settle,
    Settled,
    Subscribed,
    Welcome,
)

PARTITIONS = 8
CREDIT = 2000


async def preload(address: str, messages: int) -> None:
    """Publish ``messages`` acked messages over 64 keys (every partition)."""
    async with connect(address, name="preload") as client:
        for start in range(0, messages, 10_000):
            for number in range(start, min(start + 10_000, messages)):
                await client.publish(f"bench.k{number % 64}", PAYLOAD, ack=True)
            await client.flush_acks()


class RawConsumer:
    """One consumer on its own connection, counting runs, never decoding messages."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.machine = ProtocolMachine(Role.CLIENT, DEFAULT_MAX_FRAME_BYTES)
        self.seen: set[tuple[int, int]] = set()
        self.duplicates = 0

    async def send(self, *frames: Consume | Settle | Flow | Hello) -> None:
        await self.stream.send_all(b"".join(encode_frame(frame) for frame in frames))

    async def frames(self) -> list[object]:
        data = await self.stream.receive_some(256 * 1024)
        if not data:
            raise trio.BrokenResourceError("the broker closed the connection")
        return list(self.machine.receive_data(data))

    async def run(self, total: list[int], messages: int, done: trio.Event) -> None:
        await self.stream.send_all(self.machine.initiate())
        await self.send(Hello(client_name="bench-consumer"))
        await self.send(
            Consume(
                1,
                "bench",
                b"bench.>",
                SubscriptionKind.SHARED,
                StartKind.EARLIEST,
                credit=CREDIT,
                max_in_flight=2 * CREDIT,
            )
        )
        sequence = 0
        receipt = -1
        while True:
            for frame in await self.frames():
                if isinstance(frame, Deliver):
                    self._deliver(frame, total)
                    last = total[0] >= messages
                    if last:
                        sequence += 1
                        receipt = sequence
                    await self.send(self._settle(frame, receipt if last else 0), Flow(1, CREDIT))
                elif isinstance(frame, Settled) and frame.sequence == receipt:
                    done.set()
                    return
                elif isinstance(frame, Error):
                    raise RuntimeError(f"consumer error: {frame}")
                elif not isinstance(frame, Welcome | Subscribed):
                    continue
            if done.is_set():
                return

    def _deliver(self, frame: Deliver, total: list[int]) -> None:
        for run in frame.runs:
            for offset in range(run.base_offset, run.base_offset + run.count):
                where = (run.partition, offset)
                if where in self.seen:
                    self.duplicates += 1
                self.seen.add(where)
            total[0] += run.count

    @staticmethod
    def _settle(frame: Deliver, sequence: int) -> Settle:
        runs = frame.runs
        return Settle(
            1,
            sequence=sequence,
            partitions=tuple(run.partition for run in runs),
            first_offsets=tuple(run.base_offset for run in runs),
            last_offsets=tuple(run.base_offset + run.count - 1 for run in runs),
            topic="bench",
        )


async def consume(address: str, messages: int, consumers: int, pid: int) -> dict[str, object]:
    host, port = address.rsplit(":", 1)
    await preload(address, messages)
    readers = [RawConsumer(await trio.open_tcp_stream(host, int(port))) for _ in range(consumers)]
    total = [0]
    done = trio.Event()
    cpu_before = worker_cpu(pid)
    started = time.monotonic()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for reader in readers:
                nursery.start_soon(reader.run, total, messages, done)
            await done.wait()
            nursery.cancel_scope.cancel()
    seconds = time.monotonic() - started
    cpu = [
        round(after - before, 3) for before, after in zip(cpu_before, worker_cpu(pid), strict=False)
    ]
    for reader in readers:
        await reader.stream.aclose()
    seen: set[tuple[int, int]] = set()
    for reader in readers:
        seen |= reader.seen
    duplicates = (
        sum(reader.duplicates for reader in readers)
        + sum(len(reader.seen) for reader in readers)
        - len(seen)
    )
    return {
        "messages": messages,
        "consumers": consumers,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(messages / seconds),
        "lost": messages - len(seen),
        "duplicates": duplicates,
        "worker_cpu": cpu,
    }


def run_one(root: Path, workers: int, messages: int, consumers: int) -> dict[str, object]:
    config = root / f"w{workers}.toml"
    write_config(config, root / f"data-w{workers}", "always", workers)
    process = subprocess.Popen(
        [sys.executable, "-m", "broky", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        address = process.stdout.readline().strip().rsplit(" ", 1)[-1]
        return trio.run(consume, address, messages, consumers, process.pid)
    finally:
        process.terminate()
        process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument(
        "--workers", action="append", type=int,
        help="worker processes of the broker (repeatable; default: 1 and 2)",
    )  # fmt: skip
    args = parser.parse_args()
    stop_children_on_signals()
    with tempfile.TemporaryDirectory() as name:
        for workers in args.workers or [1, 2]:
            row = run_one(Path(name), workers, args.messages, args.consumers)
            print(json.dumps({"scenario": "shared_consume_ack", "workers": workers, **row}))


if __name__ == "__main__":
    main()
