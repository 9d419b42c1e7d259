"""Offset and partition planning, without Spark."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broky.spark.planning import (
    TO_END,
    OffsetRange,
    OffsetsError,
    PartitionSpan,
    StreamOffsets,
    TopicSelection,
    advance,
    batch_ranges,
    initial_offsets,
    segment_ranges,
    split_range,
    stream_ranges,
)


def test_selection_by_name_pattern_and_partition() -> None:
    selection = TopicSelection(frozenset({"orders", "audit"}), re.compile("o.*"), frozenset({1}))
    assert selection.selected("orders", 1)
    assert not selection.selected("orders", 0)
    assert not selection.selected("audit", 1)  # named, but the pattern must match too
    assert not selection.selected("other", 1)
    assert TopicSelection().selected("anything", 7)


def test_batch_ranges_clamp_to_what_is_held_and_split() -> None:
    spans = [PartitionSpan("a", 0, 100, 1_000), PartitionSpan("a", 1, 0, 0)]
    assert batch_ranges(spans) == [OffsetRange("a", 0, 100, 1_000)]
    assert batch_ranges(spans, 50, 2_000) == [OffsetRange("a", 0, 100, 1_000)]
    assert batch_ranges(spans, {"a": {"0": 400}}, {"a": {"0": 700}}, 150) == [
        OffsetRange("a", 0, 400, 550),
        OffsetRange("a", 0, 550, 700),
    ]
    assert batch_ranges(spans, {"a": {"0": 800}}, {"a": {"0": 700}}) == []


def test_segment_ranges_cut_at_segment_boundaries() -> None:
    bases = [0, 100, 250]
    assert segment_ranges("t", 2, bases, 0, TO_END) == [
        OffsetRange("t", 2, 0, 100),
        OffsetRange("t", 2, 100, 250),
        OffsetRange("t", 2, 250, TO_END),
    ]
    assert segment_ranges("t", 2, bases, 120, 260) == [
        OffsetRange("t", 2, 120, 250),
        OffsetRange("t", 2, 250, 260),
    ]
    assert segment_ranges("t", 2, bases, 120, 200) == [OffsetRange("t", 2, 120, 200)]
    assert segment_ranges("t", 2, bases, 300, TO_END) == [OffsetRange("t", 2, 300, TO_END)]


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(0, 3_000))
def test_split_range_covers_the_range_exactly(start: int, length: int, max_rows: int) -> None:
    pieces = split_range(OffsetRange("t", 0, start, start + length), max_rows)
    covered = [offset for piece in pieces for offset in range(piece.start, piece.stop)]
    assert covered == list(range(start, start + length))
    if max_rows:
        assert all(piece.rows <= max_rows for piece in pieces)


def test_offsets_json_is_canonical_whatever_the_insertion_order() -> None:
    one = StreamOffsets({("b", 10): 5, ("a", 2): 1, ("b", 2): 7})
    two = StreamOffsets({("b", 2): 7, ("a", 2): 1, ("b", 10): 5})
    assert json.dumps(one.to_json()) == json.dumps(two.to_json())
    assert json.dumps(one.to_json()) == '{"a": {"2": 1}, "b": {"2": 7, "10": 5}}'
    assert StreamOffsets.from_json(one.to_json()) == one
    with pytest.raises(OffsetsError):
        StreamOffsets.from_json({"a": 3})


def test_initial_offsets() -> None:
    spans = [PartitionSpan("a", 0, 10, 50), PartitionSpan("a", 1, 0, 5)]
    assert initial_offsets(spans, "earliest").positions == {("a", 0): 10, ("a", 1): 0}
    assert initial_offsets(spans, "latest").positions == {("a", 0): 50, ("a", 1): 5}
    assert initial_offsets(spans, {"a": {"1": 3}}).positions == {("a", 0): 10, ("a", 1): 3}
    assert initial_offsets(spans, 20).positions == {("a", 0): 20, ("a", 1): 5}


def test_advance_shares_a_row_limit_and_never_stalls_a_partition() -> None:
    start = StreamOffsets({("a", 0): 0, ("a", 1): 0, ("a", 2): 0})
    spans = [
        PartitionSpan("a", 0, 0, 1_000),
        PartitionSpan("a", 1, 0, 10),
        PartitionSpan("a", 2, 0, 0),
    ]
    assert advance(start, spans).positions == {("a", 0): 1_000, ("a", 1): 10, ("a", 2): 0}
    assert advance(start, spans, 100).positions == {("a", 0): 90, ("a", 1): 10, ("a", 2): 0}
    spans = [PartitionSpan("a", partition, 0, 100) for partition in range(3)]
    assert sum(advance(start, spans, 2).positions.values()) == 2
    # With nothing new the end is the start: Spark then runs no batch.
    assert advance(start, [PartitionSpan("a", 0, 0, 0)]).to_json() == start.to_json()


def test_a_new_partition_is_recorded_first_then_read_from_its_start() -> None:
    start = StreamOffsets({("a", 0): 5})
    spans = [PartitionSpan("a", 0, 0, 5), PartitionSpan("b", 0, 40, 60)]
    end = advance(start, spans)
    assert end.positions == {("a", 0): 5, ("b", 0): 40}
    assert stream_ranges(start, end) == []
    later = advance(end, spans)
    assert stream_ranges(end, later) == [OffsetRange("b", 0, 40, 60)]


def test_retention_past_the_position_fails_unless_told_to_skip() -> None:
    start = StreamOffsets({("a", 0): 5})
    spans = [PartitionSpan("a", 0, 20, 30)]
    with pytest.raises(OffsetsError, match="deleted by retention"):
        advance(start, spans)
    assert advance(start, spans, fail_on_data_loss=False).positions == {("a", 0): 30}


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 500)), min_size=1, max_size=6),
    st.integers(0, 700),
)
def test_batches_tile_the_log_without_gap_or_overlap(
    partitions: list[tuple[int, int]], max_rows: int
) -> None:
    spans = [
        PartitionSpan("t", index, low, low + size) for index, (low, size) in enumerate(partitions)
    ]
    position = initial_offsets(spans, "earliest")
    read: list[tuple[int, int]] = []
    for _ in range(2_000):
        end = advance(position, spans, max_rows)
        if end == position:
            break
        for piece in stream_ranges(position, end, 97):
            read.extend((piece.partition, offset) for offset in range(piece.start, piece.stop))
        position = end
    expected = [(span.partition, o) for span in spans for o in range(span.start, span.end)]
    assert sorted(read) == sorted(expected)
    assert len(read) == len(set(read))
