"""Latency load: publishers at a fixed rate, subscribers timing each message.

Two modes. Raw: pre-encoded frames of one stamped message each (the stamp
is the due time, in the payload), written with ``sendall``, and a
subscriber that scans its bytes for stamps: the same for Broky, the pump
and the peers (see ``peers.stamped_ends``). Client: the Broky client
library on both ends, the due time in ``ts_producer``.

Stamping the due time, not the send time, avoids coordinated omission: if
the publisher (or the broker pushing back on it) falls behind, the messages
sent late carry that delay in their latency instead of hiding it. Every
message due by now is sent before the next sleep (in one write in raw mode),
each still in its own frame.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Sequence
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

import trio

from broky.client.credentials import ANONYMOUS, Credentials
from broky.client.subscription import Subscription as ClientSubscription
from broky.loadtest.histogram import LatencyHistogram
from broky.loadtest.load import Stamper, StampScanner, publish_frame, stamped_payload
from broky.loadtest.loadgen import close_gently, confirmed_subscriber, open_publisher, read_until
from broky.protocol.message import encode_message


def stamped_publisher(
    connect: Callable[[], socket.socket],
    template: bytes,
    rate: float,
    sent: Synchronized[int],
    stop: Event,
    limit: int = 0,
) -> None:
    """Send copies of ``template`` (one message) at ``rate`` messages/s, each
    stamped with its due time (ns since the epoch), until ``stop`` or ``limit``."""
    stamper = Stamper(template)
    period_ns = round(1e9 / rate)
    sock = connect()
    sock.settimeout(1.0)
    due = time.time_ns()
    count = 0
    try:
        while not stop.is_set() and not (limit and count >= limit):
            now = time.time_ns()
            batch: list[bytes] = []
            while due <= now and not (limit and count + len(batch) >= limit):
                batch.append(stamper.stamp(due))
                due += period_ns
            if batch:
                sock.sendall(b"".join(batch))
                count += len(batch)
                sent.value = count
            time.sleep(max(due - time.time_ns(), 0) / 1e9)
    except OSError:  # cut off: the run is over for this publisher
        pass
    close_gently(sock)


def stamped_subscriber(
    connect: Callable[[], socket.socket],
    received: Synchronized[int],
    results: Queue[bytes],
    ready: Event,
    stop: Event,
) -> None:
    """Read from a confirmed subscriber socket, recording now - stamp per
    message in an HDR histogram; put its encoding on ``results`` at the end."""
    histogram = LatencyHistogram()
    scanner = StampScanner(histogram.record)
    sock = connect()
    ready.set()

    def handle(data: bytes) -> None:
        received.value += scanner.feed(data, time.time_ns())

    read_until(sock, stop, handle)
    sock.close()
    results.put(histogram.encode())


def raw_latency_ends(
    address: tuple[str, int],
    key: str,
    size: int,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> tuple[Callable[[], socket.socket], bytes, Callable[[], socket.socket]]:
    """Broky's (publisher connect, one-message frame template, subscriber
    connect) for ``stamped_publisher`` and ``stamped_subscriber``."""
    template = publish_frame([(key, 1)], encode_message(stamped_payload(size)))
    return (
        lambda: open_publisher(address, tls, credentials),
        template,
        lambda: confirmed_subscriber(address, key, tls, credentials),
    )


def client_latency_publisher(
    address: tuple[str, int],
    key: str,
    payload_size: int,
    rate: float,
    sent: Synchronized[int],
    stop: Event,
    limit: int = 0,
    *,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> None:
    """Publish through the client library at a fixed ``rate``, each message
    stamped with ``ts_producer`` = the time it was *due* (ns since the epoch)."""

    async def run() -> None:
        payload = b"x" * payload_size
        period_ns = round(1e9 / rate)
        count = 0
        async with credentials.connect(
            f"{address[0]}:{address[1]}", "bench-latency-pub", tls
        ) as client:
            epoch_offset = time.time_ns() - round(trio.current_time() * 1e9)
            due = round(trio.current_time() * 1e9)
            while not stop.is_set() and not (limit and count >= limit):
                now = round(trio.current_time() * 1e9)
                while due <= now and not (limit and count >= limit):
                    await client.publish(key, payload, ts_producer=due + epoch_offset)
                    due += period_ns
                    count += 1
                sent.value = count
                await trio.sleep_until(due / 1e9)
            await client.flush()

    trio.run(run)


def client_latency_subscriber(
    address: tuple[str, int],
    patterns: Sequence[str],
    received: Synchronized[int],
    results: Queue[bytes],
    ready: Event,
    stop: Event,
    *,
    tls: ssl.SSLContext | None = None,
    credentials: Credentials = ANONYMOUS,
) -> None:
    """Subscribe through the client library and record, per message, now -
    ts_producer in an HDR histogram; put its encoding on ``results`` at the end."""
    histogram = LatencyHistogram()

    async def consume(subscription: ClientSubscription) -> None:
        record = histogram.record
        async for message in subscription:
            record(time.time_ns() - message.ts_producer)
            received.value += 1

    async def run() -> None:
        async with (
            credentials.connect(f"{address[0]}:{address[1]}", "bench-latency-sub", tls) as client,
            trio.open_nursery() as nursery,
        ):
            for pattern in patterns:
                subscription = await client.subscribe(pattern)
                nursery.start_soon(consume, subscription)
            ready.set()
            await trio.to_thread.run_sync(stop.wait, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

    trio.run(run)
    results.put(histogram.encode())
