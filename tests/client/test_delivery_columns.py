"""Deliveries built straight from buffered runs, and batches folded into ranges.

``convert_runs`` (compiled) must do exactly what ``convert_runs_pure`` does
on any runs, intact or with bytes flipped: the same runs taken, the same
Deliveries, the same counts popped, the same run stopped at; and what a
consumer hands out must be what ``decode_run`` decodes, whichever way each
run went. ``settle_ranges`` twins agree, and each (topic, partition)'s
ranges cover exactly its deliveries' offsets. ``RangeSet.add_range``, and a
batcher fed folded batches, hold what adding each offset would.
"""

from __future__ import annotations

import struct
from collections import deque

import pytest
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from broky.client.buffered import FrameRuns
from broky.client.consumer import Consumer
from broky.client.consumer_options import consumer_options
from broky.client.delivery import (
    Counts,
    Delivery,
    _twins,
    convert_runs_pure,
    settle_ranges,
    settle_ranges_pure,
)
from broky.client.settling import RangeSet, SettleBatcher
from broky.protocol.chunk_reading import RUNS_FRAME_RUNS_AT, read_runs_frame
from broky.protocol.chunks import encode_located_chunk, runs_frame_parts
from broky.protocol.codec import count_located, decode_frame, decode_located
from broky.protocol.constants import BodyType, SettleKind
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Deliver, LocatedDeliver, Run
from broky.protocol.located import read_chunk_runs_pure, read_located_run
from broky.protocol.message import Message, decode_run, encode_message
from tests.client.test_consumer_tracking import Recorder
from tests.client.test_decoding import _run, runs

PROPERTY = settings(max_examples=300, deadline=None)
compiled = pytest.mark.skipif(_twins is None, reason="the compiled delivery builder is not built")
flips = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3)


def _flipped(run: Run, changes: list[tuple[int, int]]) -> Run:
    data = bytearray(run.messages)
    for position, value in changes:
        if data:
            data[position % len(data)] = value
    return Run(
        run.key, run.ts_broker, run.count, run.sizes, bytes(data), run.partition, run.base_offset
    )


def _fields(delivery: Delivery) -> tuple[object, ...]:
    return (delivery.topic, delivery.delivery_count, delivery.message, delivery.tags)


def _consumer() -> Consumer:
    return Consumer(Recorder(), 1, consumer_options("orders.>", "s", "shared", {}))


@compiled
@PROPERTY
@given(
    st.lists(st.tuples(runs(), flips), max_size=6),
    st.integers(0, 8),
    st.integers(1, 80),
    st.integers(0, 40),
    st.lists(st.integers(-1, 60), max_size=4),
)
@example(  # two runs that exactly fill the limit, the second with a redelivered count
    [
        (_run([encode_message(b"p", ts_producer=n) for n in (1, 2)], b"k", 5, base), [])
        for base in (0, 2)
    ],
    8,
    4,
    0,
    [3],
)
def test_compiled_converter_does_what_the_pure_one_does(
    drawn: list[tuple[Run, list[tuple[int, int]]]],
    max_runs: int,
    limit: int,
    taken: int,
    counted: list[int],
) -> None:
    assert _twins is not None
    convert_compiled = _twins[0]
    consumer = _consumer()
    buffered = [_flipped(run, changes) for run, changes in drawn]
    counts: Counts = {("t", 3, offset): 2 + offset for offset in counted}
    results = []
    for convert in (convert_compiled, convert_runs_pure):
        left: deque[Run | FrameRuns] = deque(buffered)
        popped, into = dict(counts), []  # type: ignore[var-annotated]
        used_taken = convert(left, max_runs, limit, taken, consumer, "t", popped, into)
        results.append((used_taken, len(left), popped, [_fields(item) for item in into]))
        assert all(type(item) is Delivery for item in into)
    assert results[0] == results[1]


@PROPERTY
@given(st.lists(st.tuples(runs(), flips), max_size=5), st.integers(1, 60))
def test_a_consumer_hands_out_what_decode_run_decodes(
    drawn: list[tuple[Run, list[tuple[int, int]]]], limit: int
) -> None:
    """Fast runs through ``convert_runs``, the rest through ``_convert``:
    in order, the messages ``decode_run`` decodes (undecodable runs dropped)."""
    consumer = _consumer()
    buffered = [_flipped(run, changes) for run, changes in drawn]
    expected: list[Message] = []
    for run in buffered:
        try:
            expected += decode_run(run)
        except RemoteProtocolError:  # the consumer drops it, logged
            continue
    if buffered:
        consumer._deliver(tuple(buffered))
    got: list[Message] = []

    async def take_all() -> None:
        # Until it waits for more runs: the autojump clock then ends it.
        with trio.move_on_after(60):
            for _ in range(sum(run.count for run in buffered) + 1):
                batch = await consumer._next_batch(limit)
                assert len(batch) <= max(limit, *(run.count for run in buffered))
                got.extend(delivery.message for delivery in batch)

    trio.run(take_all, clock=MockClock(autojump_threshold=0))
    assert got == expected


def test_a_run_of_another_layout_keeps_its_message_and_the_next_runs_still_convert() -> None:
    consumer = _consumer()
    tagged = _run([encode_message(b"t", tags=[("a", "b")])], b"k", 1, 10)
    plain = _run([encode_message(b"p"), encode_message(b"q")], b"k", 1, 11)
    consumer._deliver((plain, tagged, plain))
    batch = trio.run(consumer._next_batch, 100)
    assert [delivery.payload for delivery in batch] == [b"p", b"q", b"t", b"p", b"q"]
    assert batch[2].tags == (("a", "b"),)
    assert [delivery.offset for delivery in batch] == [11, 12, 10, 11, 12]


deliveries = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2), st.integers(0, 12)), max_size=40
)


def _deliveries(drawn: list[tuple[str, int, int]]) -> list[Delivery]:
    consumer = _consumer()
    return [
        Delivery(consumer, Message("k", b"", partition=partition, offset=offset), topic, 1)
        for topic, partition, offset in drawn
    ]


@PROPERTY
@given(deliveries)
def test_settle_ranges_cover_each_pairs_deliveries_in_order(
    drawn: list[tuple[str, int, int]],
) -> None:
    folded = settle_ranges(_deliveries(drawn))
    assert folded == settle_ranges_pure(_deliveries(drawn))
    pairs = list(dict.fromkeys((topic, partition) for topic, partition, _ in drawn))
    assert [(topic, partition) for topic, partition, *_ in folded] == pairs
    for topic, partition, firsts, lasts, ascending in folded:
        unfolded = [
            offset
            for first, last in zip(firsts, lasts, strict=True)
            for offset in range(first, last + 1)
        ]
        assert unfolded == [o for t, p, o in drawn if (t, p) == (topic, partition)]
        # Maximal: neighbouring ranges could not have been one.
        gaps = [after - before for before, after in zip(lasts, firsts[1:], strict=False)]
        assert 1 not in gaps
        assert ascending == all(gap > 1 for gap in gaps)


def test_a_batch_of_consecutive_deliveries_is_one_range() -> None:
    batch = _deliveries([("a", 1, offset) for offset in range(500)])
    assert settle_ranges(batch) == [("a", 1, [0], [499], True)]


def test_interleaved_partitions_fold_per_partition() -> None:
    batch = _deliveries([("a", 0, 5), ("a", 1, 3), ("a", 0, 6), ("a", 1, 9), ("a", 0, 8)])
    assert settle_ranges(batch) == [("a", 0, [5, 8], [6, 8], True), ("a", 1, [3, 9], [3, 9], True)]


@PROPERTY
@given(st.lists(deliveries, max_size=4))
def test_folded_batches_hold_what_adding_each_offset_holds(
    batches: list[list[tuple[str, int, int]]],
) -> None:
    folded_batcher = SettleBatcher(1, max_offsets=10**6)
    one_by_one = SettleBatcher(1, max_offsets=10**6)
    for drawn in batches:
        folded_batcher.add_folded(SettleKind.ACK, settle_ranges(_deliveries(drawn)), len(drawn))
        for topic, partition, offset in drawn:
            one_by_one.add(SettleKind.ACK, topic, partition, offset)
    assert folded_batcher.pending == one_by_one.pending
    assert folded_batcher.take() == one_by_one.take()


@PROPERTY
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 6)), max_size=30))
def test_add_range_holds_what_adding_each_offset_holds(spans: list[tuple[int, int]]) -> None:
    ranges = RangeSet()
    held: set[int] = set()
    for first, length in spans:
        ranges.add_range(first, first + length)
        held.update(range(first, first + length + 1))
    expected: list[tuple[int, int]] = []
    for offset in sorted(held):
        if expected and expected[-1][1] + 1 == offset:
            expected[-1] = (expected[-1][0], offset)
        else:
            expected.append((offset, offset))
    assert ranges.ranges() == expected


def test_a_range_counts_every_offset_toward_the_batch() -> None:
    batcher = SettleBatcher(1, max_offsets=10)
    assert not batcher.add_range(SettleKind.ACK, "t", 0, 0, 8)
    assert batcher.pending == 9
    assert batcher.add_range(SettleKind.ACK, "t", 0, 9, 9)
    (frame,) = batcher.take()
    assert (frame.first_offsets, frame.last_offsets) == ((0,), (9,))


def _deliver_frame(drawn: list[Run], flips_at: list[tuple[int, int]]) -> bytes:
    """A Deliver frame (after its size prefix) of ``drawn`` as located
    chunks, with bytes past its header flipped."""
    chunks = [
        encode_located_chunk(
            run.key, run.ts_broker, run.sizes, run.messages, run.partition, run.base_offset
        )
        for run in drawn
    ]
    frame = bytearray(b"".join(runs_frame_parts(BodyType.DELIVER, 1, chunks))[4:])
    for position, value in flips_at:
        at = RUNS_FRAME_RUNS_AT + position
        if at < len(frame):
            frame[at] = value
    return bytes(frame)


def _taken(consumer: Consumer, limit: int) -> list[list[tuple[object, ...]]]:
    """Every batch of at most ``limit`` the consumer hands out, until it waits."""
    got: list[list[tuple[object, ...]]] = []

    async def take_all() -> None:
        with trio.move_on_after(60):
            for _ in range(consumer.buffered_messages + 1):
                batch = await consumer._next_batch(limit)
                got.append(list(map(_fields, batch)))

    trio.run(take_all, clock=MockClock(autojump_threshold=0))
    return got


def _outcome(decode: object, frame: bytes) -> object:
    assert callable(decode)
    try:
        return decode(memoryview(frame))
    except RemoteProtocolError:
        return "malformed"


@PROPERTY
@given(
    st.lists(runs(), max_size=6),
    st.lists(st.tuples(st.integers(0, 3_000), st.integers(0, 255)), max_size=3),
    st.integers(1, 60),
)
def test_runs_left_in_the_frame_give_what_decoded_runs_give(
    drawn: list[Run], flips_at: list[tuple[int, int]], limit: int
) -> None:
    """A durable Deliver read in place (``decode_located``, a consumer's
    ``convert_located`` or, at a run of another layout, ``take_run``) hands
    out what the frame's decoded runs give, and fails to decode alike."""
    frame = _deliver_frame(drawn, flips_at)
    located, reference = _outcome(decode_located, frame), _outcome(decode_frame, frame)
    if reference == "malformed" or located == "malformed":
        assert located == reference
        return
    assert isinstance(reference, Deliver)
    consumer, expected = _consumer(), _consumer()
    if isinstance(located, LocatedDeliver):
        assert located.count == sum(run.count for run in reference.runs)
        consumer._deliver_located(located)
    else:
        assert located == reference
        consumer._deliver(reference.runs)
    expected._deliver(reference.runs)
    assert consumer.buffered_messages == expected.buffered_messages
    assert _taken(consumer, limit) == _taken(expected, limit)


def test_a_client_reads_a_durable_deliver_in_place() -> None:
    frame = _deliver_frame([_run([encode_message(b"p")] * 3, b"k", 1, 40)], [])
    decoded = decode_located(memoryview(frame))
    if count_located is None:
        assert isinstance(decoded, Deliver)  # the pure reader: every frame decodes as usual
        return
    assert isinstance(decoded, LocatedDeliver)
    assert (decoded.runs, decoded.count) == (1, 3)
    consumer = _consumer()
    consumer._deliver_located(decoded)
    batches = _taken(consumer, 2)
    offsets = [[fields[2].offset for fields in batch] for batch in batches]  # type: ignore[attr-defined]
    assert offsets == [[40, 41], [42]]  # one run converted whole, handed out in batches of 2


@pytest.mark.skipif(count_located is None, reason="the compiled chunk reader is not in use")
@PROPERTY
@given(
    st.lists(runs(), max_size=6),
    st.lists(st.tuples(st.integers(0, 3_000), st.integers(0, 255)), max_size=3),
)
def test_count_located_accepts_exactly_what_the_pure_reader_reads_as_located(
    drawn: list[Run], flips_at: list[tuple[int, int]]
) -> None:
    frame = memoryview(_deliver_frame(drawn, flips_at))
    head = read_runs_frame(frame)
    if head is None:
        return
    runs_count = head[4]
    read = read_chunk_runs_pure(frame, RUNS_FRAME_RUNS_AT, runs_count)
    slots = struct.unpack_from(f"<{runs_count}I", frame, RUNS_FRAME_RUNS_AT)
    located = [
        read_located_run(frame, RUNS_FRAME_RUNS_AT + 4 * index + uoffset)
        for index, uoffset in enumerate(slots)
    ]
    expected = -1
    if all(run is not None for run in located) and read == located:
        expected = sum(run.count for run in located if run is not None)
    assert count_located is not None
    assert count_located(frame, RUNS_FRAME_RUNS_AT, runs_count) == expected
