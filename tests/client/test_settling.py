"""Ack batching: offsets folded into ranges, frames per topic and kind, receipts."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from broky.client.settling import MAX_RANGES_PER_FRAME, RangeSet, SettleBatcher
from broky.protocol.codec import encode_frame
from broky.protocol.constants import MIN_MAX_FRAME_BYTES, SettleKind
from broky.protocol.frames import Settle


def _offsets_of(ranges: list[tuple[int, int]]) -> set[int]:
    return {offset for first, last in ranges for offset in range(first, last + 1)}


@given(st.lists(st.integers(min_value=0, max_value=300), max_size=200))
def test_ranges_hold_exactly_the_added_offsets_as_maximal_disjoint_ranges(
    offsets: list[int],
) -> None:
    held = RangeSet()
    for offset in offsets:
        held.add(offset)
    ranges = held.ranges()
    assert _offsets_of(ranges) == set(offsets)
    assert all(first <= last for first, last in ranges)
    # Sorted, and two ranges never touch (else they would be one).
    assert all(a_last + 1 < b_first for (_, a_last), (b_first, _) in itertools.pairwise(ranges))


def test_in_order_acks_are_one_range() -> None:
    held = RangeSet()
    for offset in range(1000, 5000):
        held.add(offset)
    assert held.ranges() == [(1000, 4999)]


def test_a_gap_filled_later_joins_both_sides() -> None:
    held = RangeSet()
    for offset in (1, 2, 4, 5, 3):
        held.add(offset)
    assert held.ranges() == [(1, 5)]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(SettleKind)),
            st.sampled_from(["orders", "audit"]),
            st.integers(min_value=0, max_value=3),
            st.integers(min_value=0, max_value=500),
        ),
        max_size=300,
    )
)
def test_take_settles_every_outcome_once_with_fresh_sequences(
    outcomes: list[tuple[SettleKind, str, int, int]],
) -> None:
    batcher = SettleBatcher(stream=7, max_offsets=10_000)
    for kind, topic, partition, offset in outcomes:
        batcher.add(kind, topic, partition, offset)
    frames = batcher.take()
    assert batcher.pending == 0
    assert batcher.take() == []
    settled = {
        (frame.kind, frame.topic, partition, offset)
        for frame in frames
        for partition, first, last in zip(
            frame.partitions, frame.first_offsets, frame.last_offsets, strict=True
        )
        for offset in range(first, last + 1)
    }
    assert settled == set(outcomes)
    assert all(frame.stream == 7 for frame in frames)
    sequences = [frame.sequence for frame in frames]
    assert sequences == list(range(1, len(frames) + 1))
    # One frame per (kind, topic) here: no group has more ranges than one frame holds.
    assert len({(frame.kind, frame.topic) for frame in frames}) == len(frames)


def test_add_says_when_the_batch_is_full() -> None:
    batcher = SettleBatcher(stream=1, max_offsets=3)
    assert not batcher.add(SettleKind.ACK, "t", 0, 1)
    assert not batcher.add(SettleKind.ACK, "t", 0, 2)
    assert batcher.add(SettleKind.ACK, "t", 0, 3)
    assert batcher.take() == [
        Settle(
            stream=1, sequence=1, partitions=(0,), first_offsets=(1,), last_offsets=(3,), topic="t"
        )
    ]


def test_nacks_with_different_delays_or_reasons_travel_apart() -> None:
    batcher = SettleBatcher(stream=1)
    batcher.add(SettleKind.NACK, "t", 0, 1, delay_ms=100)
    batcher.add(SettleKind.NACK, "t", 0, 2, delay_ms=200)
    batcher.add(SettleKind.TERM, "t", 0, 3, reason="bad")
    frames = batcher.take()
    assert [(f.kind, f.delay_ms, f.reason, f.first_offsets) for f in frames] == [
        (SettleKind.NACK, 100, "", (1,)),
        (SettleKind.NACK, 200, "", (2,)),
        (SettleKind.TERM, -1, "bad", (3,)),
    ]


def test_many_scattered_acks_split_into_frames_a_broker_accepts() -> None:
    batcher = SettleBatcher(stream=1, max_offsets=100_000)
    for offset in range(
        0, 2 * (MAX_RANGES_PER_FRAME + 10), 2
    ):  # every other offset: no ranges merge
        batcher.add(SettleKind.ACK, "orders", 5, offset)
    frames = batcher.take()
    assert [len(frame.partitions) for frame in frames] == [MAX_RANGES_PER_FRAME, 10]
    # Each fits the smallest frame limit a broker may announce (MIN_MAX_FRAME_BYTES).
    assert all(len(encode_frame(frame)) < MIN_MAX_FRAME_BYTES for frame in frames)
