"""The client-library latency baseline: nats-py on both ends of nats-server.

Issue 12 compares ``broky.Client`` -> broker -> ``broky.Client`` latency
with what a Python user of NATS gets: nats-py (the official asyncio client)
publishing to nats-server and nats-py subscribing. These two ends mirror
``latency.client_latency_publisher`` and ``client_latency_subscriber``
exactly: the same pacing (every message due by now is published, then a
sleep until the next is due), the due time as the stamp (in the payload's
first 8 bytes, since NATS messages have no timestamp field), and the same
histogram. nats-py is an optional benchmark dependency: without it the
baseline is reported as not available.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Sequence
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

from broky.loadtest.histogram import LatencyHistogram

_STAMP = struct.Struct("<q")


def available() -> bool:
    """Whether nats-py is installed."""
    try:
        import nats  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


async def _connect(address: tuple[str, int], name: str) -> Any:
    import nats  # noqa: PLC0415

    return await nats.connect(f"nats://{address[0]}:{address[1]}", name=name)


def nats_latency_publisher(
    address: tuple[str, int],
    key: str,
    payload_size: int,
    rate: float,
    sent: Synchronized[int],
    stop: Event,
    limit: int = 0,
) -> None:
    """Publish through nats-py at ``rate``, each payload stamped with its due time."""

    async def run() -> None:
        padding = b"x" * max(payload_size - _STAMP.size, 0)
        period_ns = round(1e9 / rate)
        loop = asyncio.get_running_loop()
        client = await _connect(address, "bench-latency-pub")
        try:
            epoch_offset = time.time_ns() - round(loop.time() * 1e9)
            due = round(loop.time() * 1e9)
            count = 0
            while not stop.is_set() and not (limit and count >= limit):
                now = round(loop.time() * 1e9)
                while due <= now and not (limit and count >= limit):
                    await client.publish(key, _STAMP.pack(due + epoch_offset) + padding)
                    due += period_ns
                    count += 1
                sent.value = count
                await asyncio.sleep(max(due / 1e9 - loop.time(), 0))
            await client.flush()
        finally:
            await client.close()

    asyncio.run(run())


def nats_latency_subscriber(
    address: tuple[str, int],
    patterns: Sequence[str],
    received: Synchronized[int],
    results: Queue[bytes],
    ready: Event,
    stop: Event,
) -> None:
    """Subscribe through nats-py and record, per message, now - stamp."""
    histogram = LatencyHistogram()

    async def run() -> None:
        client = await _connect(address, "bench-latency-sub")
        record = histogram.record
        unpack = _STAMP.unpack_from

        async def handle(message: Any) -> None:
            record(time.time_ns() - unpack(message.data)[0])
            received.value += 1

        try:
            for pattern in patterns:
                await client.subscribe(pattern, cb=handle)
            await client.flush()  # the subscriptions reached the server
            ready.set()
            await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        finally:
            await client.close()

    asyncio.run(run())
    results.put(histogram.encode())
