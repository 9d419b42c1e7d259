"""Router tests, sans-IO: fake connections, real frames.

A ``Peer`` stands in for a connection: it counts ``wake`` calls and decodes
whatever its outlet hands the writer with the real FrameReader and codec, so
every assertion is about frames a client would receive.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.chunks import durable_chunk, durable_chunk_sizes
from broky.protocol.codec import decode_frame, encode_frame
from broky.protocol.constants import (
    DEFAULT_MAX_FRAME_BYTES,
    MAX_KEY_BYTES,
    MIN_MAX_FRAME_BYTES,
    ErrorCode,
    NoticeKind,
    SlowConsumerPolicy,
)
from broky.protocol.frames import Deliver, Error, Frame, Notice, Publish, Run, Subscribed
from broky.protocol.framing import FrameReader
from broky.protocol.message import Message, decode_run, encode_message, pack_sizes
from broky.router.durable_runs import DurableEncodedRun
from broky.router.fanout import ADMIT_EVERY
from broky.router.limits import RouterLimits
from broky.router.outbox import Subscription
from broky.router.router import Router

DISCONNECT = SlowConsumerPolicy.DISCONNECT


class Peer:
    """A fake connection: counts wakes, decodes what its writer would send."""

    def __init__(self, router: Router) -> None:
        self.wakes = 0
        self.outlet = router.attach(self._wake)

    def _wake(self) -> None:
        self.wakes += 1

    def take(self) -> list[Frame]:
        return decode_frames(b"".join(self.outlet.take()))

    def subscription(self, stream: int) -> Subscription:
        return self.outlet.subscriptions[stream]

    # Methods, not attribute reads, so that mypy does not narrow them across
    # the router calls that change them.
    def has_work(self) -> bool:
        return self.outlet.has_work

    def failure(self) -> tuple[ErrorCode, str] | None:
        return self.outlet.failure


def decode_frames(data: bytes) -> list[Frame]:
    reader = FrameReader(DEFAULT_MAX_FRAME_BYTES)
    frames = [decode_frame(view) for view in reader.feed(data)]
    assert reader.buffered_bytes == 0, "take() returned a partial frame"
    return frames


def make_run(key: bytes, payloads: Sequence[bytes], ts_broker: int = 0) -> Run:
    messages = [encode_message(payload) for payload in payloads]
    return Run(
        key=key,
        ts_broker=ts_broker,
        count=len(messages),
        sizes=pack_sizes([len(message) for message in messages]),
        messages=b"".join(messages),
    )


def publish(
    router: Router,
    key: bytes,
    *payloads: bytes,
    origin: Peer | None = None,
    stream: int = 0,
) -> None:
    router.publish(
        router.encode([make_run(key, payloads)], stamp_ts_broker=False),
        origin.outlet if origin else None,
        stream,
    )


def delivered(frames: Sequence[Frame], stream: int) -> list[Message]:
    """Every message the frames deliver to ``stream``, in order."""
    return [
        message
        for frame in frames
        if isinstance(frame, Deliver) and frame.stream == stream
        for run in frame.runs
        for message in decode_run(run)
    ]


def payloads(frames: Sequence[Frame], stream: int) -> list[bytes]:
    return [message.payload for message in delivered(frames, stream)]


def numbered(first: int, stop: int) -> list[bytes]:
    return [b"%d" % number for number in range(first, stop)]


def subscribed_peer(
    router: Router,
    *subscriptions: tuple[int, bytes],
    policy: SlowConsumerPolicy = SlowConsumerPolicy.DROP,
    credit: int = 0,
) -> Peer:
    """A peer with the given (stream, pattern) subscriptions, confirmations taken."""
    peer = Peer(router)
    for stream, pattern in subscriptions:
        assert router.subscribe(peer.outlet, stream, pattern, policy, credit) is not None
    assert peer.take() == [Subscribed(stream) for stream, _ in subscriptions]
    return peer


def chunk_bytes(router: Router, payload_size: int) -> int:
    """Outbox bytes one single-message run of ``payload_size`` occupies."""
    (run,) = router.encode([make_run(b"k", [bytes(payload_size)])], stamp_ts_broker=False)
    return len(run.chunk)


def assert_error(frame: Frame, code: ErrorCode, stream: int) -> None:
    assert isinstance(frame, Error)
    assert (frame.code, frame.stream) == (code, stream)
    assert frame.message


def assert_outbox_accounting(subscription: Subscription) -> None:
    assert subscription.pending_messages == sum(run.count for run in subscription.runs)
    assert subscription.pending_bytes == sum(len(run.chunk) for run in subscription.runs)


# --- subscribe / unsubscribe -------------------------------------------------------


def test_subscribe_queues_subscribed_and_wakes() -> None:
    router = Router()
    peer = Peer(router)
    subscription = router.subscribe(peer.outlet, 1, b"orders.>")
    assert subscription is not None
    assert (subscription.stream, subscription.pattern) == (1, b"orders.>")
    assert peer.wakes == 1
    assert peer.has_work()
    assert peer.take() == [Subscribed(1)]
    assert not peer.has_work()
    statistics = router.statistics()
    assert (statistics.connections, statistics.subscriptions, statistics.topics) == (1, 1, 1)


@pytest.mark.parametrize(
    "pattern",
    [b"", b"a..b", b"a.>.b", b"ord*", b"a" * (MAX_KEY_BYTES + 1), b"bad.\xff\xfe", b"a.\x00.>"],
)
def test_bad_pattern_is_a_stream_error_and_the_connection_stays_usable(pattern: bytes) -> None:
    router = Router()
    peer = Peer(router)
    assert router.subscribe(peer.outlet, 5, pattern) is None
    (frame,) = peer.take()
    assert_error(frame, ErrorCode.INVALID_PATTERN, 5)
    assert peer.failure() is None
    assert router.statistics().subscriptions == 0
    # The same stream id is still free, and the connection still works.
    assert router.subscribe(peer.outlet, 5, b"a.b") is not None
    publish(router, b"a.b", b"hello")
    frames = peer.take()
    assert frames[0] == Subscribed(5)
    assert payloads(frames, 5) == [b"hello"]


def test_duplicate_stream_is_rejected_and_the_original_stays() -> None:
    router = Router()
    peer = subscribed_peer(router, (1, b"a"))
    assert router.subscribe(peer.outlet, 1, b"b") is None
    (frame,) = peer.take()
    assert_error(frame, ErrorCode.DUPLICATE_STREAM, 1)
    assert router.statistics().subscriptions == 1
    publish(router, b"b", b"not for you")
    publish(router, b"a", b"yours")
    assert payloads(peer.take(), 1) == [b"yours"]


def test_subscription_limit_per_connection() -> None:
    router = Router(RouterLimits(max_subscriptions_per_connection=2))
    peer = subscribed_peer(router, (1, b"a"), (2, b"b"))
    assert router.subscribe(peer.outlet, 3, b"c") is None
    (frame,) = peer.take()
    assert_error(frame, ErrorCode.LIMIT_EXCEEDED, 3)
    assert peer.failure() is None
    # The limit is per connection, and freed by unsubscribing.
    subscribed_peer(router, (1, b"c"), (2, b"d"))
    router.unsubscribe(peer.outlet, 1)
    assert router.subscribe(peer.outlet, 3, b"c") is not None
    assert peer.take() == [Subscribed(3)]


def test_unsubscribe_unknown_stream_is_a_stream_error() -> None:
    router = Router()
    peer = subscribed_peer(router, (1, b"a"))
    router.unsubscribe(peer.outlet, 2)
    (frame,) = peer.take()
    assert_error(frame, ErrorCode.UNKNOWN_STREAM, 2)
    router.unsubscribe(peer.outlet, 1)
    assert peer.take() == []  # no confirmation for a good unsubscribe
    router.unsubscribe(peer.outlet, 1)  # closed already
    (frame,) = peer.take()
    assert_error(frame, ErrorCode.UNKNOWN_STREAM, 1)
    assert peer.failure() is None


def test_unsubscribe_discards_queued_runs_and_the_stream_id_can_be_reused() -> None:
    router = Router()
    peer = subscribed_peer(router, (1, b"a"))
    publish(router, b"a", b"old")
    router.unsubscribe(peer.outlet, 1)
    assert router.statistics().outbox_messages == 0
    assert router.subscribe(peer.outlet, 1, b"a") is not None
    publish(router, b"a", b"new")
    frames = peer.take()
    assert frames[0] == Subscribed(1)
    assert payloads(frames, 1) == [b"new"]


# --- publish and fan-out ---------------------------------------------------------


def test_publish_without_subscribers_counts_dropped_no_subscriber() -> None:
    router = Router()
    bystander = subscribed_peer(router, (1, b"other"))
    router.publish(
        router.encode([make_run(b"a.b", numbered(0, 3)), make_run(b"a.c", [b"x"])], False)
    )
    statistics = router.statistics()
    assert statistics.published_runs == 2
    assert statistics.published_messages == 4
    assert statistics.dropped_no_subscriber == 4
    assert statistics.delivered_messages == 0
    assert bystander.wakes == 1  # only its Subscribed
    assert bystander.take() == []


def run_identity(run: Run) -> tuple[bytes, int, int, bytes, bytes]:
    return (run.key, run.ts_broker, run.count, bytes(run.sizes), bytes(run.messages))


def test_fan_out_delivers_identical_runs_to_every_matching_subscription() -> None:
    router = Router()
    first = subscribed_peer(router, (1, b"orders.>"), (2, b"orders.eu.created"))
    second = subscribed_peer(router, (3, b"*.eu.*"))
    unrelated = subscribed_peer(router, (4, b"orders.us.>"))
    runs = [
        make_run(b"orders.eu.created", [b"m0", b"m1" * 50]),
        make_run(b"orders.eu.created", [b"m2"]),
    ]
    router.publish(router.encode(runs, stamp_ts_broker=False))

    expected = [run_identity(run) for run in runs]
    first_frames, second_frames = first.take(), second.take()
    for frames, stream in ((first_frames, 1), (first_frames, 2), (second_frames, 3)):
        got = [
            run_identity(run)
            for frame in frames
            if isinstance(frame, Deliver) and frame.stream == stream
            for run in frame.runs
        ]
        assert got == expected, stream
    assert unrelated.take() == []
    assert unrelated.wakes == 1
    assert router.statistics().delivered_messages == 3 * 3


def test_per_publisher_order_is_preserved_for_wildcard_and_exact_subscribers() -> None:
    router = Router()
    peer = subscribed_peer(router, (1, b">"), (2, b"k.1"))
    rng = random.Random(7)
    sequence = itertools.count()
    published: list[tuple[str, bytes]] = []
    frames: list[Frame] = []
    for _ in range(60):
        runs = []
        for _ in range(rng.randint(1, 6)):
            key = b"k.%d" % rng.randrange(5)
            batch = [b"%d" % next(sequence) for _ in range(rng.randint(1, 4))]
            published.extend((key.decode(), payload) for payload in batch)
            runs.append(make_run(key, batch))
        router.publish(router.encode(runs, stamp_ts_broker=False))
        if rng.random() < 0.3:
            frames.extend(peer.take())
    frames.extend(peer.take())

    everything = [(message.key, message.payload) for message in delivered(frames, 1)]
    assert everything == published
    assert payloads(frames, 2) == [payload for key, payload in published if key == "k.1"]


def test_invalid_key_is_a_stream_error_and_later_runs_are_still_routed() -> None:
    router = Router()
    subscriber = subscribed_peer(router, (1, b">"))
    publisher = Peer(router)
    runs = [
        make_run(b"a.b", [b"first"]),
        make_run(b"a..b", [b"empty token"]),
        make_run(b"a.*", [b"wildcard"]),
        make_run(b"a" * (MAX_KEY_BYTES + 1), [b"too long"]),
        make_run(b"a.c", [b"last"]),
    ]
    router.publish(router.encode(runs, stamp_ts_broker=False), publisher.outlet, 9)

    errors = publisher.take()
    assert len(errors) == 3
    for frame in errors:
        assert_error(frame, ErrorCode.INVALID_KEY, 9)
    assert publisher.wakes == 1
    assert publisher.failure() is None
    assert [(m.key, m.payload) for m in delivered(subscriber.take(), 1)] == [
        ("a.b", b"first"),
        ("a.c", b"last"),
    ]
    # Without an origin (e.g. the broker's own traffic) a bad key is skipped quietly.
    router.publish(router.encode([make_run(b"x..y", [b"z"])], stamp_ts_broker=False))
    assert subscriber.take() == []


def test_keys_that_are_not_text_are_stream_errors_and_never_reach_anyone() -> None:
    # b"k.\xff" and b"k.\xfe" would both decode to "k.\ufffd": neither may be
    # routed, counted as a topic or cached as a route.
    router = Router()
    subscriber = subscribed_peer(router, (1, b">"))
    publisher = Peer(router)
    bad = [b"bad.\xff\xfe", b"k.\xff", b"k.\xfe", b"a.with\x00nul", b"a.line\nbreak", b"a b"]
    runs = [make_run(b"a.first", [b"1"])]
    for key in bad:
        runs += [make_run(key, [b"bad"]), make_run(b"a.between", [b"2"])]
    for _ in range(2):  # a second time: a refused key is never cached as valid
        router.publish(router.encode(runs, stamp_ts_broker=False), publisher.outlet, 9)
        errors = publisher.take()
        assert len(errors) == len(bad)
        for frame in errors:
            assert_error(frame, ErrorCode.INVALID_KEY, 9)
        assert publisher.failure() is None
        received = delivered(subscriber.take(), 1)
        assert [m.key for m in received] == ["a.first"] + ["a.between"] * len(bad)
    assert {figures.key for figures in router.statistics().top_topics} == {"a.first", "a.between"}


def test_invalid_key_on_publish_stream_0_fails_the_connection() -> None:
    router = Router()
    subscriber = subscribed_peer(router, (1, b">"))
    publisher = Peer(router)
    runs = [make_run(b"a..b", [b"bad"]), make_run(b"a.c", [b"after"])]
    router.publish(router.encode(runs, stamp_ts_broker=False), publisher.outlet, 0)

    failure = publisher.failure()
    assert failure is not None
    assert failure[0] is ErrorCode.INVALID_KEY
    # Routing stopped at the bad run: the connection is being closed.
    assert delivered(subscriber.take(), 1) == []


def test_ts_broker_is_stamped_once_per_publish_when_asked() -> None:
    ticks = itertools.count(123)
    router = Router(clock=lambda: next(ticks))
    peer = subscribed_peer(router, (1, b">"))
    runs = [make_run(b"a", [b"x"], ts_broker=55), make_run(b"b", [b"y", b"z"], ts_broker=0)]
    router.publish(router.encode(runs, stamp_ts_broker=True))
    stamped = delivered(peer.take(), 1)
    assert [message.ts_broker for message in stamped] == [123, 123, 123]
    router.publish(router.encode(runs, stamp_ts_broker=True))
    assert {message.ts_broker for message in delivered(peer.take(), 1)} == {124}


def test_producer_ts_broker_passes_through_when_not_stamping() -> None:
    calls: list[None] = []

    def clock() -> int:
        calls.append(None)
        return 123

    router = Router(clock=clock)
    peer = subscribed_peer(router, (1, b">"))
    runs = [make_run(b"a", [b"x"], ts_broker=55), make_run(b"b", [b"y"], ts_broker=0)]
    router.publish(router.encode(runs, stamp_ts_broker=False))
    assert [message.ts_broker for message in delivered(peer.take(), 1)] == [55, 0]
    assert calls == []  # the clock is not read for a publish that does not stamp


# --- waking the writer -------------------------------------------------------------


def test_wake_is_called_once_per_idle_to_work_transition() -> None:
    router = Router()
    peer = Peer(router)
    router.subscribe(peer.outlet, 1, b"k")
    router.subscribe(peer.outlet, 2, b">")
    assert peer.wakes == 1
    assert peer.take() == [Subscribed(1), Subscribed(2)]
    for number in range(10):
        publish(router, b"k", b"%d" % number)
    router.unsubscribe(peer.outlet, 99)  # a control frame while already awake
    assert peer.wakes == 2
    frames = peer.take()
    assert payloads(frames, 1) == payloads(frames, 2) == numbered(0, 10)
    assert_error(frames[0], ErrorCode.UNKNOWN_STREAM, 99)  # control frames go first
    assert not peer.has_work()
    assert peer.take() == []
    assert peer.wakes == 2
    publish(router, b"k", b"again")
    assert peer.wakes == 3


def test_failing_an_outlet_wakes_it_even_when_work_is_pending() -> None:
    # The connection's wake callback is how a writer blocked on a slow socket
    # learns that it must give up: a fail() must always reach it.
    router = Router()
    peer = subscribed_peer(router, (1, b"k"))
    publish(router, b"k", b"queued")
    assert peer.wakes == 2
    peer.outlet.fail(ErrorCode.SERVER_SHUTDOWN, "the broker is shutting down")
    assert peer.wakes == 3
    assert peer.failure() == (ErrorCode.SERVER_SHUTDOWN, "the broker is shutting down")
    peer.outlet.fail(ErrorCode.IDLE_TIMEOUT, "later reason")
    assert peer.failure() == (ErrorCode.SERVER_SHUTDOWN, "the broker is shutting down")
    assert peer.has_work()


# --- slow consumers ----------------------------------------------------------------


def test_drop_policy_drops_only_for_the_full_subscription_and_reports_once_drained() -> None:
    router = Router(RouterLimits(outbox_messages=10))
    slow = subscribed_peer(router, (1, b"k"))
    fast = subscribed_peer(router, (2, b"k"))
    fast_frames: list[Frame] = []
    for number in range(25):
        publish(router, b"k", b"%d" % number)
        fast_frames.extend(fast.take())

    subscription = slow.subscription(1)
    assert subscription.dropped_messages == 15
    assert router.statistics().dropped_slow_consumer == 15
    assert payloads(fast_frames, 2) == numbered(0, 25)
    assert not any(isinstance(frame, Notice) for frame in fast_frames)
    assert fast.outlet.subscriptions[2].dropped_messages == 0

    frames = slow.take()
    assert [type(frame) for frame in frames] == [Deliver, Notice]
    assert payloads(frames, 1) == numbered(0, 10)
    assert frames[1] == Notice(1, NoticeKind.DROPPED, 15)

    # The count resets: no Notice without new drops, then only the new ones.
    publish(router, b"k", b"25")
    fast_frames.extend(fast.take())
    frames = slow.take()
    assert [type(frame) for frame in frames] == [Deliver]
    assert payloads(frames, 1) == [b"25"]
    assert subscription.unreported_drops == 0
    for number in range(26, 40):
        publish(router, b"k", b"%d" % number)
        fast_frames.extend(fast.take())
    assert payloads(fast_frames, 2) == numbered(0, 40)
    frames = slow.take()
    assert payloads(frames, 1) == numbered(26, 36)
    assert frames[-1] == Notice(1, NoticeKind.DROPPED, 4)
    assert subscription.dropped_messages == 19
    assert router.statistics().dropped_slow_consumer == 19


def test_drop_policy_bounds_bytes_and_counts_messages_not_runs() -> None:
    router = Router()
    run_bytes = chunk_bytes(router, 40)
    router = Router(RouterLimits(outbox_bytes=3 * run_bytes + run_bytes // 2))
    peer = subscribed_peer(router, (1, b"k"))
    for number in range(5):
        publish(router, b"k", bytes(40 - len(b"%d" % number)) + b"%d" % number)
    subscription = peer.subscription(1)
    assert subscription.pending_bytes == 3 * run_bytes
    assert subscription.dropped_messages == 2
    # A multi-message run is dropped whole and counted per message.
    router.publish(router.encode([make_run(b"k", [b"a", b"b", b"c"])], stamp_ts_broker=False))
    assert subscription.dropped_messages == 5
    frames = peer.take()
    assert len(payloads(frames, 1)) == 3
    assert frames[-1] == Notice(1, NoticeKind.DROPPED, 5)


def test_a_run_larger_than_the_outbox_is_dropped_and_reported_promptly() -> None:
    router = Router(RouterLimits(outbox_messages=2))
    peer = subscribed_peer(router, (1, b"k"))
    publish(router, b"k", b"a", b"b", b"c")
    assert peer.wakes == 2  # nothing queued, but the Notice is work
    assert peer.take() == [Notice(1, NoticeKind.DROPPED, 3)]
    assert peer.take() == []


def test_drop_notice_waits_until_the_outbox_has_drained() -> None:
    router = Router()
    run_bytes = chunk_bytes(router, 8)
    router = Router(RouterLimits(outbox_messages=6, write_batch_bytes=3 * run_bytes))
    peer = subscribed_peer(router, (1, b"k"))
    for number in range(8):
        publish(router, b"k", b"%08d" % number)
    first = peer.take()
    assert len(payloads(first, 1)) == 3
    assert not any(isinstance(frame, Notice) for frame in first)
    second = peer.take()
    assert len(payloads(second, 1)) == 3
    assert second[-1] == Notice(1, NoticeKind.DROPPED, 2)


def test_disconnect_policy_fails_the_connection_once() -> None:
    router = Router(RouterLimits(outbox_messages=2))
    slow = subscribed_peer(router, (1, b"k"), policy=DISCONNECT)
    other = subscribed_peer(router, (2, b"k"))
    other_frames: list[Frame] = []

    def publish_number(number: int) -> None:
        publish(router, b"k", b"%d" % number)
        other_frames.extend(other.take())

    publish_number(0)
    publish_number(1)
    assert slow.failure() is None
    wakes = slow.wakes
    publish_number(2)
    failure = slow.failure()
    assert failure is not None
    code, message = failure
    assert code is ErrorCode.SLOW_CONSUMER
    assert "subscription 1" in message
    assert slow.wakes == wakes + 1  # the writer learns even though work was pending
    assert router.statistics().slow_consumer_disconnects == 1
    for number in range(3, 6):
        publish_number(number)
    statistics = router.statistics()
    assert statistics.slow_consumer_disconnects == 1  # one connection, one disconnect
    assert statistics.dropped_slow_consumer == 0  # disconnecting is not dropping
    assert other.failure() is None
    assert payloads(other_frames, 2) == numbered(0, 6)


def test_two_overflowing_subscriptions_of_one_connection_count_one_disconnect() -> None:
    router = Router(RouterLimits(outbox_messages=1))
    peer = subscribed_peer(router, (1, b"k"), (2, b">"), policy=DISCONNECT)
    publish(router, b"k", b"a", b"b")
    assert peer.failure() is not None
    assert router.statistics().slow_consumer_disconnects == 1


# --- flow control --------------------------------------------------------------------


def varied(number: int) -> bytes:
    """Payloads of different lengths, so a wrong split boundary shows."""
    return b"%d:" % number + b"x" * (number * 7 % 23)


def test_credit_limits_delivery_and_splits_runs_exactly() -> None:
    router = Router(clock=lambda: 777)
    peer = subscribed_peer(router, (1, b"k.>"), credit=5)
    subscription = peer.subscription(1)
    runs = [
        make_run(b"k.a", [varied(n) for n in range(3)]),
        make_run(b"k.b", [varied(n) for n in range(3, 7)]),
        make_run(b"k.c", [varied(n) for n in range(7, 9)]),
    ]
    router.publish(router.encode(runs, stamp_ts_broker=True))

    frames = peer.take()
    (deliver,) = frames
    assert isinstance(deliver, Deliver)
    assert [(run.key, run.count, run.ts_broker) for run in deliver.runs] == [
        (b"k.a", 3, 777),
        (b"k.b", 2, 777),
    ]
    assert payloads(frames, 1) == [varied(n) for n in range(5)]
    assert_outbox_accounting(subscription)
    assert subscription.pending_messages == 4

    # Out of credit: new runs wait, nothing wakes the writer.
    wakes = peer.wakes
    publish(router, b"k.d", varied(9))
    assert peer.wakes == wakes
    assert not peer.has_work()
    assert peer.take() == []

    router.grant(peer.outlet, 1, 3)
    assert peer.wakes == wakes + 1
    frames = peer.take()
    (deliver,) = frames
    assert isinstance(deliver, Deliver)
    assert [(run.key, run.count, run.ts_broker) for run in deliver.runs] == [
        (b"k.b", 2, 777),
        (b"k.c", 1, 777),
    ]
    assert [m.key for m in delivered(frames, 1)] == ["k.b", "k.b", "k.c"]
    assert payloads(frames, 1) == [varied(n) for n in range(5, 8)]
    assert_outbox_accounting(subscription)

    router.grant(peer.outlet, 1, 100)
    frames = peer.take()
    assert payloads(frames, 1) == [varied(8), varied(9)]
    assert (subscription.pending_messages, subscription.pending_bytes) == (0, 0)
    assert subscription.delivered_messages == 10
    assert router.statistics().delivered_messages == 10


def test_credit_is_a_window_across_takes() -> None:
    router = Router()
    peer = subscribed_peer(router, (1, b"k"), credit=4)
    frames: list[Frame] = []
    for number in range(10):
        publish(router, b"k", b"%d" % number)
        frames.extend(peer.take())
    assert payloads(frames, 1) == numbered(0, 4)
    router.grant(peer.outlet, 1, 2)
    router.grant(peer.outlet, 1, 1)
    assert payloads(peer.take(), 1) == numbered(4, 7)
    assert peer.take() == []


def test_grant_for_unknown_or_unwindowed_streams_is_ignored() -> None:
    router = Router()
    peer = subscribed_peer(router, (1, b"k"))
    router.grant(peer.outlet, 99, 10)
    router.grant(peer.outlet, 1, 10)
    assert peer.take() == []
    assert peer.subscription(1).credit is None
    for number in range(20):
        publish(router, b"k", b"%d" % number)
    assert payloads(peer.take(), 1) == numbered(0, 20)


# --- write budget ----------------------------------------------------------------------


def test_take_respects_the_write_budget_and_leaves_the_rest() -> None:
    router = Router()
    run_bytes = chunk_bytes(router, 8)
    budget = 3 * run_bytes + run_bytes // 2
    router = Router(RouterLimits(write_batch_bytes=budget))
    peer = subscribed_peer(router, (1, b"k"))
    for number in range(10):
        publish(router, b"k", b"%08d" % number)
    wakes = peer.wakes
    taken: list[list[bytes]] = []
    while peer.has_work():
        parts = peer.outlet.take()
        batch = payloads(decode_frames(b"".join(parts)), 1)
        deliver_header = 64 + 4 * len(batch)  # 56 bytes + one offset per run, padded
        assert sum(map(len, parts)) <= budget + run_bytes + deliver_header
        taken.append(batch)
    assert [len(batch) for batch in taken] == [4, 4, 2]
    assert [payload for batch in taken for payload in batch] == [b"%08d" % n for n in range(10)]
    assert peer.wakes == wakes  # the writer came straight back; no extra wakes


def test_take_serves_subscriptions_round_robin() -> None:
    router = Router()
    run_bytes = chunk_bytes(router, 8)
    router = Router(RouterLimits(write_batch_bytes=2 * run_bytes + run_bytes // 2))
    peer = subscribed_peer(router, (1, b"a"), (2, b"b"))
    for number in range(6):
        publish(router, b"a", b"a%07d" % number)
    for number in range(6):
        publish(router, b"b", b"b%07d" % number)
    served = []
    while peer.has_work():
        frames = peer.take()
        served.append(
            [(frame.stream, len(frame.runs)) for frame in frames if isinstance(frame, Deliver)]
        )
    assert served == [[(1, 3)], [(2, 3)], [(1, 3)], [(2, 3)]]


# --- connections, topics, statistics -------------------------------------------------


def test_detach_removes_every_subscription_and_topic() -> None:
    router = Router()
    leaving = subscribed_peer(router, (1, b"a"), (2, b"a.*"), (3, b">"))
    staying = subscribed_peer(router, (1, b"a"))
    publish(router, b"a", b"queued")
    statistics = router.statistics()
    assert (statistics.connections, statistics.subscriptions, statistics.topics) == (2, 4, 3)
    assert statistics.outbox_messages == 3

    router.detach(leaving.outlet)
    statistics = router.statistics()
    assert (statistics.connections, statistics.subscriptions, statistics.topics) == (1, 1, 1)
    assert statistics.outbox_messages == 1
    assert leaving.outlet.subscriptions == {}
    publish(router, b"a.b", b"nobody")
    assert router.statistics().dropped_no_subscriber == 1
    publish(router, b"a", b"only staying")
    assert payloads(staying.take(), 1) == [b"queued", b"only staying"]

    router.detach(staying.outlet)
    statistics = router.statistics()
    assert (statistics.connections, statistics.subscriptions, statistics.topics) == (0, 0, 0)


def test_topic_lives_while_it_has_subscribers() -> None:
    router = Router()
    first = subscribed_peer(router, (1, b"orders.>"))
    second = subscribed_peer(router, (7, b"orders.>"))
    assert (router.statistics().subscriptions, router.statistics().topics) == (2, 1)
    router.unsubscribe(first.outlet, 1)
    assert (router.statistics().subscriptions, router.statistics().topics) == (1, 1)
    router.unsubscribe(second.outlet, 7)
    assert (router.statistics().subscriptions, router.statistics().topics) == (0, 0)
    publish(router, b"orders.eu", b"x")
    assert router.statistics().dropped_no_subscriber == 1


def test_statistics_account_for_every_published_message() -> None:
    router = Router(RouterLimits(outbox_messages=5))
    peer = subscribed_peer(router, (1, b"k"))
    for first in (0, 2, 4):
        publish(router, b"k", *numbered(first, first + 2))  # the third run overflows
    publish(router, b"other", b"a", b"b", b"c")  # no subscriber
    publish(router, b"k..x", b"bad", b"key", b"run", b"!", origin=peer, stream=3)  # rejected
    frames = peer.take()
    assert payloads(frames, 1) == numbered(0, 4)
    assert frames[-1] == Notice(1, NoticeKind.DROPPED, 2)
    publish(router, b"k", b"waiting")

    statistics = router.statistics()
    subscription = peer.subscription(1)
    assert statistics.published_runs == 5
    assert statistics.published_messages == 10
    assert statistics.delivered_messages == 4 == subscription.delivered_messages
    assert statistics.dropped_slow_consumer == 2 == subscription.dropped_messages
    assert statistics.dropped_no_subscriber == 3
    assert statistics.outbox_messages == 1 == subscription.pending_messages
    assert statistics.outbox_bytes == subscription.pending_bytes == chunk_bytes(router, 7)
    assert statistics.published_messages == (
        statistics.delivered_messages
        + statistics.dropped_slow_consumer
        + statistics.dropped_no_subscriber
        + statistics.outbox_messages
    )
    assert statistics.match_cache_keys == 2  # k and other; a bad key is never cached
    assert (statistics.connections, statistics.subscriptions, statistics.topics) == (1, 1, 1)


# --- the client's frame limit ---------------------------------------------------


def test_deliver_frames_fit_the_clients_frame_limit_and_runs_split_between_messages() -> None:
    router = Router(RouterLimits(outbox_bytes=16 << 20, write_batch_bytes=8 << 20))
    subscriber = subscribed_peer(router, (1, b"k"))
    subscriber.outlet.max_frame_bytes = MIN_MAX_FRAME_BYTES
    payload_list = [b"%06d" % number + bytes(994) for number in range(300)]  # ~300 KiB run
    publish(router, b"k", *payload_list)

    data = b"".join(subscriber.outlet.take())
    reader = FrameReader(MIN_MAX_FRAME_BYTES)  # raises if any frame is larger
    frames = [decode_frame(view) for view in reader.feed(data)]
    assert reader.buffered_bytes == 0
    assert len(frames) >= 5
    assert payloads(frames, 1) == payload_list
    assert_outbox_accounting(subscriber.subscription(1))
    assert subscriber.subscription(1).pending_messages == 0


def test_a_message_larger_than_the_clients_frame_limit_is_dropped_and_reported() -> None:
    router = Router(RouterLimits(outbox_bytes=16 << 20))
    subscriber = subscribed_peer(router, (1, b"k"))
    subscriber.outlet.max_frame_bytes = MIN_MAX_FRAME_BYTES
    publish(router, b"k", b"small-1", bytes(MIN_MAX_FRAME_BYTES), b"small-2")

    frames = subscriber.take()
    assert payloads(frames, 1) == [b"small-1", b"small-2"]
    assert frames[-1] == Notice(1, NoticeKind.DROPPED, 1)
    assert router.statistics().dropped_slow_consumer == 1
    assert_outbox_accounting(subscriber.subscription(1))


@pytest.mark.parametrize("request_kind", ["subscribe", "unsubscribe"])
def test_a_refused_request_on_stream_0_fails_the_connection(request_kind: str) -> None:
    # Stream 0 names the connection: an Error on it closes the connection,
    # so the broker must close it too rather than answer and carry on.
    router = Router()
    peer = Peer(router)
    if request_kind == "subscribe":
        router.subscribe(peer.outlet, 0, b"fine.pattern")
    else:
        router.unsubscribe(peer.outlet, 0)
    failure = peer.failure()
    assert failure is not None
    assert failure[0] in (ErrorCode.MALFORMED_FRAME, ErrorCode.UNKNOWN_STREAM)
    assert not peer.outlet.subscriptions


# --- stored runs of durable topics (broky.durable.owner) -------------------------


@settings(max_examples=60, deadline=None)
@given(picks=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4)), min_size=1, max_size=150))
def test_count_unrouted_counts_as_publish_counts_runs_no_one_wants(
    picks: list[tuple[int, int]],
) -> None:
    """An owner that skips the chunks of runs ``wanted`` says no one takes
    leaves the router's counters as publishing them would have, and the
    busiest keys' figures never above what the keys carried (a key enters
    them by the same one-in-ADMIT_EVERY sampling, though not on its first
    route as in ``publish``)."""
    runs = [make_run(b"stored.k%d" % key, numbered(0, count)) for key, count in picks]
    published, counted = Router(), Router()
    for router in (published, counted):
        subscribed_peer(router, (1, b"elsewhere.>"))
    encoded = [
        DurableEncodedRun(run.key, run.count, durable_chunk(run, 5, 0, 0), None, 0) for run in runs
    ]
    published.publish(encoded)
    keys = [run.key for run in runs]
    assert counted.wanted(keys) is None
    counted.count_unrouted(runs)
    assert attrs.evolve(counted.statistics(), top_topics=()) == attrs.evolve(
        published.statistics(), top_topics=()
    )
    carried: dict[bytes, list[int]] = {}
    for run, size in zip(runs, durable_chunk_sizes(runs), strict=True):
        figures = carried.setdefault(run.key, [0, 0])
        figures[0] += run.count
        figures[1] += size
    for key, (messages, size) in counted.topics.table.items():
        assert messages <= carried[key][0]
        assert size <= carried[key][1]
    assert (
        sum(messages for messages, _ in counted.topics.table.values())
        >= (len(runs) - len(set(carried))) // ADMIT_EVERY
    )


def test_wanted_names_the_keys_a_subscription_takes() -> None:
    router = Router()
    subscribed_peer(router, (1, b"stored.a"))
    assert router.wanted([b"stored.b", b"stored.a", b"stored.c"]) == [False, True, False]
    assert router.wanted([b"stored.b"]) is None
    assert router.wanted([b"stored.b", b"bad..key"]) == [False, True]  # publish answers it


def test_durable_chunk_sizes_are_the_chunks_lengths() -> None:
    decoded = decode_frame(
        memoryview(encode_frame(Publish(1, (make_run(b"a.b", numbered(0, 3)),))))[4:]
    )
    assert isinstance(decoded, Publish)
    runs = [*decoded.runs, make_run(b"c", [b"built in memory"])]
    assert decoded.runs[0].chunk is not None
    assert runs[-1].chunk is None
    for run in (runs, runs[:1]):
        assert durable_chunk_sizes(run) == [len(durable_chunk(r, 9, 2, 40)) for r in run]
