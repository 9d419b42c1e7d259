"""ServerConnection over in-memory streams, on trio's autojump clock.

These tests drive one broker-side connection task with a hand-written client
(the raw connection from conftest) and check the timing rules of
docs/protocol.md: Welcome carries the limits, the broker pings a quiet client
after ``heartbeat_interval``, closes it after ``idle_timeout`` (or
``handshake_timeout`` before Hello), and every close is counted by reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio
import trio.testing

from broky.connection.handler import ServerConnection
from broky.connection.inproc import pipe_pair
from broky.connection.liveness import TIMEOUT_JITTER
from broky.connection.reasons import CloseReason
from broky.connection.settings import ConnectionCounters, ConnectionSettings
from broky.connection.writer import CLOSE_TIMEOUT
from broky.protocol.codec import encode_frame
from broky.protocol.constants import PROTOCOL_VERSION, ErrorCode, SlowConsumerPolicy
from broky.protocol.frames import (
    Error,
    Hello,
    Ping,
    Pong,
    Publish,
    Run,
    Subscribe,
    Subscribed,
)
from broky.protocol.framing import encode_preamble
from broky.protocol.message import encode_message, pack_sizes
from broky.router.limits import RouterLimits
from broky.router.router import Router
from tests.conftest import RawConnection

SETTINGS = ConnectionSettings(
    max_frame_bytes=128 * 1024,
    heartbeat_interval=1.0,
    idle_timeout=3.0,
    handshake_timeout=2.0,
    frame_timeout=2.0,
    timeout_jitter=0.0,  # exact deadlines; test_timeouts_of_a_flood_are_spread has jitter
)
#: Slack allowed on top of a deadline on the virtual clock (the keepalive
#: task sleeps at least 10 ms between checks).
SLACK = 0.05

StreamPair = Callable[[], tuple[trio.abc.Stream, trio.abc.Stream]]


@attrs.define
class Harness:
    client: RawConnection
    connection: ServerConnection
    counters: ConnectionCounters
    router: Router
    done: trio.Event


def _memory_pair() -> tuple[trio.abc.Stream, trio.abc.Stream]:
    return trio.testing.memory_stream_pair()


@asynccontextmanager
async def serve_one(
    *,
    limits: RouterLimits | None = None,
    streams: StreamPair = _memory_pair,
    settings: ConnectionSettings = SETTINGS,
) -> AsyncIterator[Harness]:
    client_end, server_end = streams()
    router = Router(limits)
    counters = ConnectionCounters()
    connection = ServerConnection(server_end, router, settings, counters, "test-peer")
    done = trio.Event()

    async def run() -> None:
        try:
            await connection.run()
        finally:
            done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        yield Harness(RawConnection(client_end), connection, counters, router, done)
        nursery.cancel_scope.cancel()


async def test_handshake_answers_preamble_and_welcome_with_limits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(5):
        async with serve_one() as harness:
            welcome = await harness.client.handshake("adapter-test")
            assert welcome.protocol_version == PROTOCOL_VERSION
            assert welcome.server_name.startswith("broky/")
            assert welcome.max_frame_bytes == 128 * 1024
            assert welcome.heartbeat_interval_ms == 1000
            assert welcome.idle_timeout_ms == 3000
            assert harness.connection.client_name == "adapter-test"
            assert harness.counters.opened == 1
            assert harness.counters.current == 1


async def test_ping_is_answered_with_pong_of_same_nonce(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(5):
        async with serve_one() as harness:
            await harness.client.handshake()
            await harness.client.send_frame(Ping(41))
            await harness.client.send_frame(Ping(2**63 + 5))
            assert await harness.client.receive_frame() == Pong(41)
            assert await harness.client.receive_frame() == Pong(2**63 + 5)


async def test_broker_pings_a_quiet_client_and_keeps_it_while_it_answers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(30):
        async with serve_one() as harness:
            await harness.client.handshake()
            quiet_since = trio.current_time()
            # Three idle timeouts' worth of pings, each answered: the
            # connection must stay up, one ping per heartbeat interval.
            for _ in range(9):
                frame = await harness.client.receive_frame()
                assert isinstance(frame, Ping), frame
                waited = trio.current_time() - quiet_since
                assert 1.0 <= waited <= 1.0 + SLACK
                await harness.client.send_frame(Pong(frame.nonce))
                quiet_since = trio.current_time()
            assert not harness.done.is_set()
            assert not harness.counters.closed


async def test_idle_timeout_closes_with_error_and_counts_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(30):
        async with serve_one() as harness:
            await harness.client.handshake()
            start = trio.current_time()
            pings = 0
            while True:
                frame = await harness.client.receive_frame()
                if not isinstance(frame, Ping):
                    break
                pings += 1
            assert isinstance(frame, Error)
            assert (frame.code, frame.stream) == (ErrorCode.IDLE_TIMEOUT, 0)
            assert 3.0 <= trio.current_time() - start <= 3.0 + SLACK
            assert pings == 2  # at 1 s and 2 s, unanswered
            await harness.client.wait_closed()
            await harness.done.wait()
            assert harness.counters.closed == {CloseReason.IDLE_TIMEOUT: 1}
            assert harness.counters.current == 0


async def test_handshake_timeout_when_hello_never_comes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(30):
        async with serve_one() as harness:
            start = trio.current_time()
            await harness.client.send(encode_preamble())
            # No Ping before the handshake: the first frame is the Error.
            error = await harness.client.receive_frame()
            assert isinstance(error, Error)
            assert (error.code, error.stream) == (ErrorCode.IDLE_TIMEOUT, 0)
            assert 2.0 <= trio.current_time() - start <= 2.0 + SLACK
            await harness.client.wait_closed()
            await harness.done.wait()
            assert harness.counters.closed == {CloseReason.IDLE_TIMEOUT: 1}


async def test_handshake_timeout_counts_from_connect_not_from_last_byte(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A client that trickles its preamble a byte at a time must not hold a
    # half-open connection past the handshake timeout.
    with trio.fail_after(30):
        async with serve_one() as harness:
            start = trio.current_time()

            async def trickle() -> None:
                for byte in encode_preamble():
                    await harness.client.send(bytes([byte]))
                    await trio.sleep(0.5)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trickle)
                await harness.done.wait()
                nursery.cancel_scope.cancel()
            assert trio.current_time() - start <= 2.0 + CLOSE_TIMEOUT
            assert harness.counters.closed == {CloseReason.IDLE_TIMEOUT: 1}


async def test_a_frame_trickled_after_hello_is_closed_at_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Each byte used to reset the idle timer: a peer sending one byte every
    # half second held its connection (and a max_connections slot) forever.
    with trio.fail_after(60):
        async with serve_one() as harness:
            await harness.client.handshake()
            frame = encode_frame(Ping(1))
            started = trio.current_time()

            async def trickle() -> None:
                for byte in frame * 100:
                    await harness.client.send(bytes([byte]))
                    await trio.sleep(0.5)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trickle)
                error = await harness.client.receive_error()
                nursery.cancel_scope.cancel()
            assert error.code is ErrorCode.IDLE_TIMEOUT
            assert "too slowly" in error.message
            # The frame's grace (frame_timeout) plus its few bytes at 64 KiB/s.
            assert 2.0 <= trio.current_time() - started <= 2.0 + SLACK
            await harness.done.wait()
            assert harness.counters.closed == {CloseReason.IDLE_TIMEOUT: 1}


async def test_a_big_frame_arriving_steadily_outlives_the_idle_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A large publish on a slow link must not be cut by the idle timeout: as
    # long as it keeps arriving at 64 KiB/s or faster, the frame deadline
    # holds, not idle_timeout (here 1 s, less than the frame takes).
    settings = attrs.evolve(SETTINGS, heartbeat_interval=0.5, idle_timeout=1.0, frame_timeout=0.5)
    with trio.fail_after(60):
        async with serve_one(settings=settings) as harness:
            await harness.client.handshake()
            run = _run_of(110, 1000)
            frame = encode_frame(Publish(1, (run,))) + encode_frame(Ping(9))
            chunk = 7 * 1024
            started = trio.current_time()
            for position in range(0, len(frame), chunk):
                await harness.client.send(frame[position : position + chunk])
                await trio.sleep(0.1)  # 70 KiB/s
            assert trio.current_time() - started > settings.idle_timeout
            assert await harness.client.receive_frame() == Pong(9)
            assert not harness.counters.closed


async def test_timeouts_of_a_flood_are_spread(autojump_clock: trio.testing.MockClock) -> None:
    # Connections opened in one instant that never say Hello must not all
    # time out in one instant: closing thousands at once stalls everyone.
    settings = ConnectionSettings(handshake_timeout=2.0)
    closed_at: list[float] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(50):

                async def one() -> None:
                    async with serve_one(settings=settings) as harness:
                        await harness.done.wait()
                        closed_at.append(trio.current_time())

                nursery.start_soon(one)
    assert len(closed_at) == 50
    assert min(closed_at) >= 2.0
    assert max(closed_at) <= 2.0 * (1 + TIMEOUT_JITTER) + SLACK
    assert max(closed_at) - min(closed_at) > 2.0 * TIMEOUT_JITTER / 2


async def test_client_connection_error_closes_with_client_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(5):
        async with serve_one() as harness:
            await harness.client.handshake()
            await harness.client.send_frame(Error(ErrorCode.INTERNAL, "client gives up", 0))
            frames = await harness.client.frames_until_closed()
            # The broker does not answer a connection error with one of its own.
            assert not [frame for frame in frames if isinstance(frame, Error)]
            await harness.done.wait()
            assert harness.counters.closed == {CloseReason.CLIENT_ERROR: 1}


async def test_client_stream_error_keeps_the_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(5):
        async with serve_one() as harness:
            await harness.client.handshake()
            await harness.client.send_frame(Error(ErrorCode.INTERNAL, "stream 5 failed", 5))
            await harness.client.send_frame(Ping(7))
            assert await harness.client.receive_frame() == Pong(7)
            assert not harness.done.is_set()
            assert not harness.counters.closed


async def test_frame_before_hello_is_malformed(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(5):
        async with serve_one() as harness:
            await harness.client.send(encode_preamble() + encode_frame(Ping(1)))
            error = await harness.client.receive_frame()
            assert isinstance(error, Error)
            assert (error.code, error.stream) == (ErrorCode.MALFORMED_FRAME, 0)
            await harness.client.wait_closed()
            await harness.done.wait()
            assert harness.counters.closed == {CloseReason.PROTOCOL_ERROR: 1}


def _run_of(count: int, size: int) -> Run:
    messages = [encode_message(bytes(size)) for _ in range(count)]
    return Run(b"big.data", 0, count, pack_sizes([len(m) for m in messages]), b"".join(messages))


def _small_pipe() -> tuple[trio.abc.Stream, trio.abc.Stream]:
    return pipe_pair(max_buffer_bytes=4096)


async def _subscribe_and_stall(harness: Harness, policy: SlowConsumerPolicy) -> None:
    """Subscribe, then publish far more than the 4 KiB pipe holds, unread."""
    await harness.client.handshake()
    await harness.client.send_frame(Subscribe(1, b"big.>", policy, 0))
    assert await harness.client.receive_frame() == Subscribed(1)
    router = harness.router
    for _ in range(2):
        router.publish(router.encode([_run_of(50, 1000)], False))
    await trio.sleep(0.1)  # the writer took both runs and is blocked in send_all
    assert router.statistics().outbox_bytes == 0
    # A control frame queued behind the blocked write marks the outlet busy.
    await harness.client.send_frame(Ping(1))
    await trio.sleep(0.1)


async def test_shutdown_abandons_a_write_blocked_by_a_client_that_does_not_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(10):
        async with serve_one(streams=_small_pipe) as harness:
            await _subscribe_and_stall(harness, SlowConsumerPolicy.DROP)
            assert not harness.done.is_set()
            start = trio.current_time()
            harness.connection.shutdown()
            await harness.done.wait()
            assert trio.current_time() - start <= CLOSE_TIMEOUT + SLACK
            assert harness.counters.closed == {CloseReason.SERVER_SHUTDOWN: 1}


async def test_slow_consumer_disconnect_closes_a_stalled_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limits = RouterLimits(outbox_bytes=128 * 1024)
    with trio.fail_after(10):
        async with serve_one(streams=_small_pipe, limits=limits) as harness:
            await _subscribe_and_stall(harness, SlowConsumerPolicy.DISCONNECT)
            router = harness.router
            assert router.counters.slow_consumer_disconnects == 0
            start = trio.current_time()
            while not router.counters.slow_consumer_disconnects:
                router.publish(router.encode([_run_of(50, 1000)], False))
            await harness.done.wait()
            assert trio.current_time() - start <= CLOSE_TIMEOUT + SLACK
            assert harness.counters.closed == {CloseReason.SLOW_CONSUMER: 1}
            assert router.statistics().connections == 0
            assert router.statistics().subscriptions == 0


async def test_client_eof_is_counted_as_client_closed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(5):
        async with serve_one() as harness:
            await harness.client.handshake()
            await harness.client.stream.aclose()
            await harness.done.wait()
            assert harness.counters.closed == {CloseReason.CLIENT_CLOSED: 1}
            assert harness.counters.current == 0


async def test_hello_frame_counts_received_and_sent_bytes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(5):
        async with serve_one() as harness:
            sent = encode_preamble() + encode_frame(Hello(client_name="x"))
            await harness.client.send(sent)
            await harness.client.receive_frame()
            assert harness.counters.bytes_received == len(sent)
            assert harness.counters.bytes_sent > len(encode_preamble())
