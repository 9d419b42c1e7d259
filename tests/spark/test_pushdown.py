"""Filter pushdown's pruning, without Spark: it never drops a row the filters accept."""

from __future__ import annotations

import operator
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

from broky.spark.columns import READ_SCHEMA
from broky.spark.planning import TO_END, OffsetRange, split_range
from broky.spark.pushdown import OFFSET, PARTITION, TOPIC, TS_BROKER, prune_for
from broky.spark.reading import BatchReader, FilteringBatchReader
from broky.spark.source import BrokyDataSource

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
KEY = ("key",)


def at(microseconds: int) -> datetime:
    """A TIMESTAMP literal as Spark hands it to ``pushFilters`` (aware, UTC)."""
    return EPOCH + timedelta(microseconds=microseconds)


def test_columns_are_those_of_the_read_schema() -> None:
    assert {TOPIC, PARTITION, OFFSET, TS_BROKER} <= {(field.name,) for field in READ_SCHEMA}


def test_topic_partition_and_offset_filters_drop_and_trim_ranges() -> None:
    ranges = [
        OffsetRange("a", 0, 0, 100),
        OffsetRange("a", 1, 0, 100),
        OffsetRange("a", 1, 100, 200),
        OffsetRange("a", 2, 0, TO_END),
        OffsetRange("b", 1, 0, 100),
    ]
    pruning = prune_for(
        [
            In(TOPIC, ("a", "c")),
            In(PARTITION, (1, 2, None)),
            GreaterThanOrEqual(OFFSET, 90),
            LessThan(OFFSET, 120),
        ]
    )
    assert pruning.prune(ranges) == [
        OffsetRange("a", 1, 90, 100),
        OffsetRange("a", 1, 100, 120),
        OffsetRange("a", 2, 90, 120),
    ]
    # An offline range running to the end stays open unless a filter bounds it.
    assert prune_for([GreaterThan(OFFSET, 5)]).prune(ranges[3:4]) == [
        OffsetRange("a", 2, 6, TO_END)
    ]
    assert prune_for([EqualTo(PARTITION, 1), EqualTo(OFFSET, 150)]).prune(ranges) == [
        OffsetRange("a", 1, 150, 151)
    ]
    # Contradictions read nothing; what pruning cannot use reads everything.
    assert prune_for([EqualTo(TOPIC, "a"), EqualTo(TOPIC, "b")]).prune(ranges) == []
    assert prune_for([In(OFFSET, (None,))]).prune(ranges) == []
    unusable: list[Filter] = [
        Not(EqualTo(PARTITION, 1)),
        EqualTo(PARTITION, True),
        LessThan(PARTITION, "1"),
        StringStartsWith(TOPIC, "a"),
        GreaterThan(TOPIC, "a"),
        EqualTo(KEY, "a"),
        IsNull(OFFSET),
        EqualNullSafe(TOPIC, None),
    ]
    assert prune_for(unusable).prune(ranges) == ranges


def test_times_narrow_the_time_range_in_nanoseconds() -> None:
    # Spark compares microseconds: ts_broker <= 9 us keeps ns up to 9999.
    pruning = prune_for([GreaterThanOrEqual(TS_BROKER, at(5)), LessThanOrEqual(TS_BROKER, at(9))])
    assert pruning.time_range(None) == (5_000, 10_000)
    assert pruning.time_range((0, 7_000)) == (5_000, 7_000)
    assert prune_for([EqualTo(TS_BROKER, at(3))]).time_range(None) == (3_000, 4_000)
    assert prune_for([In(TS_BROKER, (at(8), at(3)))]).time_range(None) == (3_000, 9_000)
    assert prune_for([LessThan(TS_BROKER, at(1))]).time_range((2_000, 3_000)) == (2_000, 1_000)
    assert (
        prune_for([LessThan(TS_BROKER, at(1)), GreaterThan(TS_BROKER, at(1))]).prune(
            [OffsetRange("a", 0, 0, 10)]
        )
        == []
    )
    # A naive datetime could be in any zone: not used.
    naive = datetime(2026, 1, 1)
    assert prune_for([GreaterThan(TS_BROKER, naive)]).time_range(None) is None
    assert prune_for([GreaterThan(TS_BROKER, naive)]).time_range((1, 2)) == (1, 2)


def test_push_filters_is_opt_in_and_hands_every_filter_back() -> None:
    plain = BrokyDataSource({"path": "/d"}).reader(READ_SCHEMA)
    # What Spark checks before refusing a reader when pushdown is off.
    assert type(plain) is BatchReader
    assert type(plain).pushFilters is DataSourceReader.pushFilters
    reader = BrokyDataSource({"path": "/d", "pushfilters": "true"}).reader(READ_SCHEMA)
    assert isinstance(reader, FilteringBatchReader)
    filters: list[Filter] = [EqualTo(PARTITION, 1), LessThan(TS_BROKER, at(5)), EqualTo(KEY, "k")]
    kept = list(reader.pushFilters(filters))
    assert len(kept) == len(filters)
    assert all(left is right for left, right in zip(kept, filters, strict=True))
    assert reader.options.time_range == (-(2**63), 5_000)


# The brute-force model: rows (topic, partition, offset, ts_broker ns) and
# SQL's three-valued logic over them.

TOPICS = ["a", "b", "c"]
#: ts_broker values in ns: 0 is null, the others straddle microseconds.
NANOSECONDS = [0, -1_500, 999, 1_000, 1_001, 2_500, 5_000, 5_999, 6_000]
LITERALS: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    TOPIC: st.sampled_from([*TOPICS, "z", 1]),
    PARTITION: st.one_of(st.integers(-1, 4), st.sampled_from([True, "1"])),
    OFFSET: st.integers(-2, 27),
    TS_BROKER: st.one_of(
        st.integers(-3, 7).map(at),
        st.just(datetime(1970, 1, 1, microsecond=3)),
    ),
    KEY: st.just("k"),
}
COMPARISONS: dict[type[Filter], Callable[[Any, Any], bool]] = {
    EqualTo: operator.eq,
    GreaterThan: operator.gt,
    GreaterThanOrEqual: operator.ge,
    LessThan: operator.lt,
    LessThanOrEqual: operator.le,
}
Row = dict[tuple[str, ...], Any]


@st.composite
def simple_filters(draw: st.DrawFn) -> Filter:
    column = draw(st.sampled_from(list(LITERALS)))
    literal = LITERALS[column] | st.none()
    kind: Any = draw(st.sampled_from([*COMPARISONS, EqualNullSafe, In, IsNull, IsNotNull, Not]))
    if kind is Not:
        return Not(draw(simple_filters()))
    if kind is In:
        return In(column, tuple(draw(st.lists(literal, max_size=3))))
    if kind in {IsNull, IsNotNull}:
        return kind(column)  # type: ignore[no-any-return]
    return kind(column, draw(literal))  # type: ignore[no-any-return]


def compare(test: Callable[[Any, Any], bool], value: Any, literal: Any) -> bool | None:
    try:
        return test(value, literal)
    except TypeError:  # e.g. an aware and a naive datetime: never true
        return None


def evaluate(pushed: Filter, row: Row) -> bool | None:
    """SQL's answer: True, False or None (unknown: the row is dropped)."""
    if isinstance(pushed, Not):
        result = evaluate(pushed.child, row)
        return None if result is None else not result
    value = row[pushed.attribute]  # type: ignore[attr-defined]
    if isinstance(pushed, IsNull | IsNotNull):
        return (value is None) == isinstance(pushed, IsNull)
    if isinstance(pushed, EqualNullSafe) and (value is None or pushed.value is None):
        return value is None and pushed.value is None
    literals = pushed.value if isinstance(pushed, In) else (pushed.value,)  # type: ignore[attr-defined]
    test = operator.eq if isinstance(pushed, In | EqualNullSafe) else COMPARISONS[type(pushed)]
    answers = [
        None if value is None or literal is None else compare(test, value, literal)
        for literal in literals
    ]
    return True if True in answers else (None if None in answers else False)


def kept_by(time_range: tuple[int, int] | None, nanoseconds: int) -> bool:
    """What ``columns.record_batches`` keeps of a run with this ts_broker."""
    return time_range is None or time_range[0] <= nanoseconds < time_range[1]


@given(
    st.data(),
    st.lists(
        st.tuples(
            st.sampled_from(TOPICS), st.integers(0, 3), st.integers(0, 10), st.integers(0, 15)
        ),
        max_size=5,
        unique_by=lambda span: span[:2],
    ),
    st.integers(0, 7),
    st.lists(simple_filters(), max_size=5),
    st.none() | st.tuples(st.sampled_from(NANOSECONDS), st.sampled_from(NANOSECONDS)),
)
def test_pruning_never_drops_a_row_the_filters_accept(
    data: st.DataObject,
    spans: list[tuple[str, int, int, int]],
    max_rows: int,
    filters: list[Filter],
    time_range: tuple[int, int] | None,
) -> None:
    ranges: list[OffsetRange] = []
    ends: dict[tuple[str, int], int] = {}
    nanoseconds: dict[tuple[str, int, int], int] = {}
    for topic, partition, start, size in spans:
        pieces = split_range(OffsetRange(topic, partition, start, start + size), max_rows)
        if data.draw(st.booleans(), "offline"):  # the last segment runs to the end
            last = pieces.pop()
            pieces.append(OffsetRange(topic, partition, last.start, TO_END))
        ranges.extend(pieces)
        ends[topic, partition] = start + size
        for offset in range(start, start + size):
            nanoseconds[topic, partition, offset] = data.draw(st.sampled_from(NANOSECONDS))

    def read(plan: list[OffsetRange], times: tuple[int, int] | None) -> set[tuple[str, int, int]]:
        # A read stops where the log ends, whatever the range's stop.
        return {
            (work.topic, work.partition, offset)
            for work in plan
            for offset in range(work.start, ends[work.topic, work.partition])
            if (work.stop == TO_END or offset < work.stop)
            and kept_by(times, nanoseconds[work.topic, work.partition, offset])
        }

    def within(piece: OffsetRange, work: OffsetRange) -> bool:
        return (piece.topic, piece.partition) == (work.topic, work.partition) and (
            work.start <= piece.start
            and (work.stop == TO_END or (piece.stop != TO_END and piece.stop <= work.stop))
        )

    def row(topic: str, partition: int, offset: int) -> Row:
        ns = nanoseconds[topic, partition, offset]
        ts = at(ns // 1000) if ns else None  # Spark's microseconds, floored; 0 is null
        return {TOPIC: topic, PARTITION: partition, OFFSET: offset, TS_BROKER: ts, KEY: "k"}

    pruning = prune_for(filters)
    plan = pruning.prune(ranges)
    # Never more than the options asked for: each range within one planned without pushdown.
    assert all(any(within(piece, work) for work in ranges) for piece in plan)
    narrowed = pruning.time_range(time_range)
    if time_range is not None:
        assert narrowed is not None
        assert time_range[0] <= narrowed[0]
        assert narrowed[1] <= time_range[1]
    unpruned = read(ranges, time_range)
    pruned = read(plan, narrowed)
    accepted = {
        position
        for position in unpruned
        if all(evaluate(pushed, row(*position)) is True for pushed in filters)
    }
    assert accepted <= pruned <= unpruned


def test_pruning_is_not_vacuous() -> None:
    # The property above would hold for a pruning that pruned nothing.
    ranges = [OffsetRange("a", partition, 0, 100) for partition in range(4)]
    pruning = prune_for([EqualTo(PARTITION, 2), GreaterThan(OFFSET, 49)])
    assert pruning.prune(ranges) == [OffsetRange("a", 2, 50, 100)]
