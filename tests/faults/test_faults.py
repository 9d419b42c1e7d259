"""Fault tests: clients that vanish, stall, never speak, or come by the thousand.

Each runs against a real broker on port 0 (the broker lives in the test
process, so its memory is this process's memory) and checks the same thing:
the broker keeps serving a healthy client within a bound, and its queues stay
within the configured limits.
"""

from __future__ import annotations

import resource
import socket
import struct
import time
from collections.abc import Iterator
from functools import partial

import pytest
import trio

import broky
from broky import Broker, Config, SlowConsumerPolicy
from broky.protocol.codec import encode_frame
from broky.protocol.frames import Publish, Run, Subscribe, Subscribed
from broky.protocol.framing import encode_preamble
from broky.protocol.message import encode_message, pack_sizes
from tests.conftest import StartBroker, address_of, eventually, raw_connection


def _publish_frame(key: bytes, payload: bytes) -> bytes:
    blob = encode_message(payload)
    return encode_frame(Publish(1, (Run(key, 0, 1, pack_sizes([len(blob)]), blob),)))


async def _round_trip(address: str, key: str = "faults.alive") -> float:
    """Seconds a fresh client takes to subscribe, publish and receive its message."""
    began = time.perf_counter()
    async with broky.connect(address) as client, client.subscription(key) as subscription:
        await client.publish(key, b"alive")
        async for message in subscription:
            assert message.payload == b"alive"
            break
    return time.perf_counter() - began


def _memory_kib(field: str) -> int:
    """A figure from /proc/self/status (VmRSS, VmHWM), in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


@pytest.fixture
def many_files() -> Iterator[int]:
    """Raise this process's open-file soft limit to its hard limit for the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    yield target
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _need_files(limit: int, connections: int) -> None:
    # Both ends of every connection live in this process, plus some slack.
    needed = 2 * connections + 200
    if limit < needed:
        pytest.skip(f"RLIMIT_NOFILE hard limit {limit} < {needed} needed for {connections} sockets")


# --- clients vanishing mid-frame ------------------------------------------------


async def test_clients_vanishing_mid_frame(broker: Broker) -> None:
    address = address_of(broker)
    frame = _publish_frame(b"faults.half", b"x" * 200)
    vanished = 60
    with trio.fail_after(20):
        async with (
            broky.connect(address) as subscriber,
            broky.connect(address) as publisher,
            subscriber.subscription("faults.pair") as subscription,
        ):
            baseline = broker.statistics().connections_current
            for index in range(vanished):
                async with raw_connection(broker) as raw:
                    await raw.handshake()
                    await raw.send(frame[: len(frame) // 2])
                    if index % 2:
                        # SO_LINGER 0: close sends a reset, not a FIN.
                        raw.stream.setsockopt(  # type: ignore[attr-defined]
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                await publisher.publish("faults.pair", str(index).encode())
            received = []
            async for message in subscription:
                received.append(message.payload)
                if len(received) == vanished:
                    break
            await eventually(lambda: broker.statistics().connections_current == baseline)
    assert received == [str(index).encode() for index in range(vanished)]
    assert broker.statistics().router.published_messages == vanished


# --- half-open connections ------------------------------------------------------


async def test_silent_connections_are_closed_by_the_handshake_timeout(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(Config(port=0, handshake_timeout=0.5))
    silent, preamble_only = 20, 20

    async def wait_closed(send: bytes) -> float:
        async with raw_connection(broker) as raw:
            if send:
                await raw.send(send)
            began = time.perf_counter()
            await raw.wait_closed()
            return time.perf_counter() - began

    waits: list[float] = []

    async def one(send: bytes) -> None:
        waits.append(await wait_closed(send))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for _ in range(silent):
                nursery.start_soon(one, b"")
            for _ in range(preamble_only):
                nursery.start_soon(one, encode_preamble())
        assert await _round_trip(address_of(broker)) < 1
        await eventually(lambda: broker.statistics().connections_current == 0)
    print(f"handshake timeout 0.5 s: closed after {min(waits):.2f}..{max(waits):.2f} s")
    assert len(waits) == silent + preamble_only
    assert max(waits) < 1.5


# --- 2,000 concurrent connections -------------------------------------------------


@pytest.mark.slow
async def test_two_thousand_concurrent_connections(broker: Broker, many_files: int) -> None:
    count = 2000
    _need_files(many_files, count)
    address = address_of(broker)
    handshaken = 0
    all_open = trio.Event()
    release = trio.Event()

    async def hold() -> None:
        nonlocal handshaken
        async with raw_connection(broker) as raw:
            await raw.handshake()
            handshaken += 1
            if handshaken == count:
                all_open.set()
            await release.wait()

    with trio.fail_after(45):
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(hold)
            await all_open.wait()
            await eventually(lambda: broker.statistics().connections_current >= count)
            reached = broker.statistics().connections_current
            async with broky.connect(address) as client:
                began = time.perf_counter()
                await client.flush()
                flush_seconds = time.perf_counter() - began
            round_trip = await _round_trip(address)
            release.set()
        await eventually(lambda: broker.statistics().connections_current == 0)
    print(
        f"{reached} concurrent connections; flush {flush_seconds * 1000:.1f} ms, "
        f"pub/sub round trip {round_trip * 1000:.1f} ms; VmHWM {_memory_kib('VmHWM') // 1024} MiB"
    )
    assert reached >= count
    assert flush_seconds < 1
    assert round_trip < 2


# --- stalled subscribers ----------------------------------------------------------


@pytest.mark.slow
async def test_stalled_subscribers_among_a_thousand_connections(
    start_broker: StartBroker, many_files: int
) -> None:
    outbox_bytes = 256 * 1024
    stalled_count, healthy_count, idle_count = 100, 20, 879  # + the publisher = 1000
    _need_files(many_files, 1000)
    broker = await start_broker(Config(port=0, outbox_bytes=outbox_bytes))
    address = address_of(broker)
    messages, size, batch = 4000, 1024, 200
    key = "faults.burst"
    rss_before = _memory_kib("VmRSS")
    peak_outbox = 0
    received = [0] * healthy_count
    stalled_ready = 0
    done = trio.Event()

    async def stalled() -> None:
        nonlocal stalled_ready
        async with raw_connection(broker, receive_buffer=4096) as raw:
            await raw.handshake()
            await raw.send_frame(Subscribe(1, key.encode(), SlowConsumerPolicy.DROP, 0))
            assert await raw.receive_frame() == Subscribed(1)
            stalled_ready += 1
            await done.wait()  # never reads again

    async def idle() -> None:
        async with raw_connection(broker) as raw:
            await raw.handshake()
            await done.wait()

    async def healthy(index: int, task_status: trio.TaskStatus[None]) -> None:
        async with broky.connect(address) as client, client.subscription(key) as subscription:
            task_status.started()
            async for message in subscription:
                assert int.from_bytes(message.payload[:4], "little") == received[index]
                received[index] += 1
                if received[index] == messages:
                    return

    async def watch() -> None:
        nonlocal peak_outbox
        while True:
            peak_outbox = max(peak_outbox, broker.statistics().router.outbox_bytes)
            await trio.sleep(0.002)

    with trio.fail_after(50):
        async with trio.open_nursery() as nursery:
            for _ in range(stalled_count):
                nursery.start_soon(stalled)
            for _ in range(idle_count):
                nursery.start_soon(idle)
            for index in range(healthy_count):
                await nursery.start(healthy, index)
            await eventually(lambda: stalled_ready == stalled_count)
            await eventually(lambda: broker.statistics().connections_current == 999)
            nursery.start_soon(watch)
            began = time.perf_counter()
            async with broky.connect(address) as publisher:
                for seq in range(messages):
                    await publisher.publish(key, seq.to_bytes(4, "little") + bytes(size - 4))
                    if seq % batch == batch - 1:
                        await publisher.flush()
                        # Stay within a window of the slowest healthy subscriber, as a
                        # well-behaved producer would; the stalled ones never catch up.
                        await eventually(partial(lambda s: min(received) > s - 2 * batch, seq))
                await publisher.flush()
            await eventually(lambda: min(received) == messages)
            burst_seconds = time.perf_counter() - began
            stats = broker.statistics()
            done.set()
            nursery.cancel_scope.cancel()
    rss_peak = _memory_kib("VmHWM")
    print(
        f"1000 connections, {stalled_count} stalled: {messages} x {size} B to {healthy_count} "
        f"healthy in {burst_seconds:.2f} s; peak outbox {peak_outbox / 2**20:.1f} MiB "
        f"(bound {stalled_count * outbox_bytes / 2**20:.0f} MiB); RSS before {rss_before // 1024} "
        f"MiB, peak (VmHWM) {rss_peak // 1024} MiB; dropped {stats.router.dropped_slow_consumer}"
    )
    assert received == [messages] * healthy_count
    assert peak_outbox <= stalled_count * outbox_bytes + (healthy_count + 1) * outbox_bytes
    assert stats.router.dropped_slow_consumer > 0
    assert rss_peak < 1024 * 1024  # KiB: a generous 1 GiB for the whole test process
