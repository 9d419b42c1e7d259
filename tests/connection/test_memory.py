"""A closed connection's buffers are freed when it closes, not by the collector.

Python's cycle collector runs by object counts, not bytes: a connection that
closes with megabytes buffered (an unfinished frame, a full outbox) and sits
in a reference cycle keeps them until the collector happens to run. These
tests churn such connections with the collector disabled and measure the
process's resident memory, which is what an operator sees.
"""

from __future__ import annotations

import gc
import os
import struct
from collections.abc import Iterator
from contextlib import AsyncExitStack
from functools import partial

import pytest
import trio

from broky import Broker, Config, SlowConsumerPolicy
from broky.protocol.codec import encode_frame
from broky.protocol.frames import Hello, Publish, Run, Subscribe, Subscribed
from broky.protocol.framing import encode_preamble
from broky.protocol.message import encode_message, pack_sizes
from broky.router.outbox import DEFAULT_WRITE_BATCH_BYTES
from tests.conftest import StartBroker, eventually, raw_connection

MIB = 1024 * 1024
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
#: Allocator slack on top of the documented bound: the interpreter, the
#: allocator's arenas and the test's own buffers.
SLACK_BYTES = 64 * MIB


def resident_bytes() -> int:
    """This process's resident set size (the broker runs in it)."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


@pytest.fixture
def collector_disabled() -> Iterator[None]:
    """Run the test with the cycle collector off, as between two of its runs."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


async def _send_unfinished_frame(broker: Broker, frame_bytes: int, *, hello: bool) -> None:
    """Connect, announce a frame of ``frame_bytes``, send all of it but its
    last byte, and close: the broker buffers it all, then sees the close."""
    assert broker.address is not None
    stream = await trio.open_tcp_stream(*broker.address)
    try:
        head = encode_preamble()
        if hello:
            head += encode_frame(Hello(client_name="churn"))
        await stream.send_all(head + struct.pack("<I", frame_bytes) + bytes(frame_bytes - 1))
    finally:
        await stream.aclose()


@pytest.mark.slow
@pytest.mark.usefixtures("collector_disabled")
@pytest.mark.parametrize("hello", [True, False], ids=["after-hello", "before-hello"])
async def test_unfinished_frames_are_freed_on_close(start_broker: StartBroker, hello: bool) -> None:
    broker = await start_broker(Config(port=0))
    frame_bytes = broker.config.max_frame_bytes
    concurrent, rounds = 25, 6
    # docs/architecture.md "Memory": each open connection holds at most
    # write_batch_bytes + max_frame_bytes; a closed one holds nothing.
    bound = concurrent * (frame_bytes + DEFAULT_WRITE_BATCH_BYTES) + SLACK_BYTES
    baseline = resident_bytes()
    peak = 0
    with trio.fail_after(60):
        for _ in range(rounds):
            async with trio.open_nursery() as nursery:
                for _ in range(concurrent):
                    nursery.start_soon(
                        partial(_send_unfinished_frame, broker, frame_bytes, hello=hello)
                    )
            await eventually(lambda: broker.counters.current == 0)
            peak = max(peak, resident_bytes() - baseline)
    # Leaking, six rounds of 25 x 4 MiB grow by ~600 MiB; the bound is ~176 MiB.
    assert peak < bound, f"resident memory grew by {peak / MIB:.0f} MiB (bound {bound / MIB:.0f})"


@pytest.mark.slow
@pytest.mark.usefixtures("collector_disabled")
async def test_full_outboxes_are_freed_on_close(start_broker: StartBroker) -> None:
    outbox_bytes = 4 * MIB
    broker = await start_broker(Config(port=0, outbox_bytes=outbox_bytes))
    subscribers, rounds = 8, 6
    message = encode_message(bytes(1000))
    # One key per subscriber: fanned-out runs share their bytes, distinct ones do not.
    runs = tuple(
        Run(b"fill.%d" % index, 0, 200, pack_sizes([len(message)] * 200), message * 200)
        for index in range(subscribers)
    )
    publish = encode_frame(Publish(1, runs))
    bound = subscribers * (outbox_bytes + DEFAULT_WRITE_BATCH_BYTES) + SLACK_BYTES
    baseline = resident_bytes()
    peak = 0
    with trio.fail_after(60):
        async with raw_connection(broker) as publisher:
            await publisher.handshake("publisher")
            for _ in range(rounds):
                async with AsyncExitStack() as stack:
                    for index in range(subscribers):
                        stalled = await stack.enter_async_context(
                            raw_connection(broker, receive_buffer=4096)
                        )
                        await stalled.handshake("stalled")
                        await stalled.send_frame(
                            Subscribe(1, b"fill.%d" % index, SlowConsumerPolicy.DROP, 0)
                        )
                        assert await stalled.receive_frame() == Subscribed(1)
                    # Fill every outbox to three quarters before they close.
                    while (
                        broker.statistics().router.outbox_bytes
                        < subscribers * outbox_bytes * 3 // 4
                    ):
                        await publisher.send(publish)
                        await trio.sleep(0.001)
                    peak = max(peak, resident_bytes() - baseline)
                await eventually(lambda: broker.counters.current == 1)
                assert broker.statistics().router.outbox_bytes == 0
    peak = max(peak, resident_bytes() - baseline)
    # Leaking, six rounds of 8 x 3 MiB grow by ~150 MiB; the bound is ~100 MiB.
    assert peak < bound, f"resident memory grew by {peak / MIB:.0f} MiB (bound {bound / MIB:.0f})"
