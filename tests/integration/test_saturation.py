"""Saturation: when the broker is the bottleneck, publishers slow down, and a
subscriber that keeps up loses nothing (broky.router.pressure).

Four publisher processes write pre-encoded frames flat out at a broker in
this process, and a subscriber process reads everything as fast as its
socket delivers. Counts are bounded; nothing here asserts a rate.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from broky import Config, SlowConsumerPolicy
from broky.loadtest import loadgen
from broky.loadtest.load import Load
from broky.protocol.frames import Subscribe, Subscribed
from tests.conftest import RawConnection, StartBroker, eventually, raw_connection
from tests.mesh.test_nodes import nodes

#: Spawned, not forked: this process runs trio and pytest-timeout's thread.
CONTEXT = multiprocessing.get_context("spawn")
PUBLISHERS = 4


async def _fan_in(
    address: tuple[str, int],
    load: Load,
    per_publisher: int,
    all_sent: Callable[[int], Awaitable[object]] | None = None,
) -> tuple[int, int, int]:
    """Four raw publisher processes flat out (``per_publisher`` messages
    each) and one raw subscriber process reading everything; returns the
    messages sent, received and announced as dropped (Notice). ``all_sent``
    is awaited with the total before the subscriber is given time to settle."""
    received = CONTEXT.Value("q", 0, lock=False)
    noticed = CONTEXT.Value("q", 0, lock=False)
    ready, stop = CONTEXT.Event(), CONTEXT.Event()
    subscriber = CONTEXT.Process(
        target=loadgen.raw_subscribers,
        args=(address, [load.pattern], received, noticed, ready, stop),
    )
    sent = [CONTEXT.Value("q", 0, lock=False) for _ in range(PUBLISHERS)]
    publishers = [
        CONTEXT.Process(
            target=loadgen.raw_publisher,
            args=(address, load, 0, counter, stop, per_publisher),
            # Backpressure on a loaded machine can hold a send past the
            # benchmark's 0.5 s; here every message must go out.
            kwargs={"send_timeout": 30.0},
        )
        for counter in sent
    ]
    try:
        subscriber.start()
        assert await trio.to_thread.run_sync(ready.wait, 30)
        for publisher in publishers:
            publisher.start()
        for publisher in publishers:
            await trio.to_thread.run_sync(publisher.join, 60)
            assert publisher.exitcode == 0
        total = sum(counter.value for counter in sent)
        assert total >= PUBLISHERS * per_publisher
        if all_sent is not None:
            await all_sent(total)
        await _until_settled(lambda: received.value, total)
    finally:
        stop.set()
        for process in (*publishers, subscriber):
            if process.pid is not None:
                await trio.to_thread.run_sync(process.join, 10)
                if process.is_alive():
                    process.kill()
    return total, received.value, noticed.value


@pytest.mark.slow
@pytest.mark.parametrize(
    ("load", "per_publisher", "with_stalled"),
    [
        (Load(), 250_000, False),
        (Load(), 250_000, True),
        # 1,000 keys cycled one message at a time: a far slower broker, as
        # real traffic (device or order ids) makes it; still nothing lost.
        (Load(keys=1000, run=1), 25_000, False),
    ],
    ids=["one-key", "one-key-beside-a-stalled-one", "1000-keys"],
)
async def test_flat_out_fan_in_loses_nothing_for_a_subscriber_that_keeps_up(
    start_broker: StartBroker, load: Load, per_publisher: int, with_stalled: bool
) -> None:
    broker = await start_broker(Config(port=0))
    assert broker.address is not None

    async def all_published(total: int) -> None:
        await eventually(lambda: broker.statistics().router.published_messages == total)

    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            stalled: RawConnection | None = None
            if with_stalled:
                stalled = await stack.enter_async_context(
                    raw_connection(broker, receive_buffer=4096)
                )
                await stalled.handshake("stalled")
                await stalled.send_frame(
                    Subscribe(1, load.pattern.encode(), SlowConsumerPolicy.DROP, 0)
                )
                assert await stalled.receive_frame() == Subscribed(1)
            total, received, _ = await _fan_in(broker.address, load, per_publisher, all_published)
            stats = broker.statistics().router
    assert received == total
    if with_stalled:
        # The stalled subscriber alone lost messages: everything it missed
        # is counted against it, nothing against the one that kept up.
        assert stats.dropped_slow_consumer > 0
        assert stats.delivered_messages + stats.dropped_slow_consumer + stats.outbox_messages <= (
            2 * total
        )
    else:
        assert stats.dropped_slow_consumer == 0


async def _until_settled(count: Callable[[], int], expected: int) -> None:
    """Wait until ``count()`` reaches ``expected`` or stops growing for 5 s
    (then the caller's assertion says how many are missing)."""
    last, since = -1, trio.current_time()
    while count() < expected and trio.current_time() - since < 5.0:
        if count() != last:
            last, since = count(), trio.current_time()
        await trio.sleep(0.01)


@pytest.mark.slow
async def test_flat_out_fan_in_through_two_workers_loses_nothing(tmp_path: Path) -> None:
    """Connections handed to two workers round-robin: half the publishers'
    runs cross a link to the subscriber's worker. When that path is the
    bottleneck, the link reader pauses for the subscriber, the other worker's
    readers pause for the link, and TCP slows the publishers: nothing lost.
    The link's outbox is bound like a client's (4 MiB, not 16), so an
    overflow is quick if any of that failed."""
    config = tmp_path / "broky.toml"
    config.write_text(
        'host = "127.0.0.1"\nport = 0\nworkers = 2\naccept = "handoff"\n'
        'log_level = "error"\nsystem_events = false\nsystem_metrics_interval = 0\n'
        "link_outbox_bytes = 4194304\n"
    )
    with nodes() as start, trio.fail_after(120):
        node = start(["--config", str(config)])
        host, port = node.address.rsplit(":", 1)
        total, received, noticed = await _fan_in((host, int(port)), Load(keys=1000, run=1), 100_000)
    assert received == total
    assert noticed == 0  # no drop Notice either
