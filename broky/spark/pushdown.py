"""Filter pushdown for batch reads: the filters Spark pushes, as planning bounds.

Pure values, no Spark session and no I/O: ``prune_for`` turns the filters
of a query (pyspark's ``Filter`` dataclasses, ANDed) into a ``Pruning``,
which drops or trims planned offset ranges and narrows the time range.

Pruning errs towards reading more than the filters accept: a filter on a
column or with a value it cannot use is ignored, ``IN`` on offsets or times
keeps the span from the smallest value to the largest, and nothing is
inferred from ``NOT``. Spark re-applies every filter after the read (the reader
reports none as handled), so rows the pruned plan still reads but a filter
rejects never reach the query; the one property that matters is that
pruning never drops a row all the filters accept (the property test in
``tests/spark/test_pushdown.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Final

import attrs
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from broky.spark.columns import READ_SCHEMA
from broky.spark.planning import TO_END, OffsetRange

#: Bounds past any int64 column value (offsets, partitions, timestamps).
LOWEST: Final = -(2**63)
BEYOND: Final = 2**63
#: The columns pruning uses, as ``Filter.attribute`` spells them (a
#: ``READ_SCHEMA`` lookup, so that renaming a column fails here, not silently).
TOPIC, PARTITION, OFFSET, TS_BROKER = (
    (READ_SCHEMA[name].name,) for name in ("topic", "partition", "offset", "ts_broker")
)
#: A filter's literal as an integer key of its column, or None if unusable.
_Converter = Callable[[object], int | None]
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)
_NS_PER_US: Final = 1000


@attrs.frozen(slots=True)
class Interval:
    """Integers ``[low, high)``: half-open, like offset ranges."""

    low: int = LOWEST
    high: int = BEYOND

    @property
    def empty(self) -> bool:
        return self.high <= self.low

    @property
    def bounded(self) -> bool:
        """Whether it excludes any int64 value."""
        return self.low > LOWEST or self.high < BEYOND

    def __and__(self, other: Interval) -> Interval:
        return Interval(max(self.low, other.low), min(self.high, other.high))

    def __contains__(self, value: int) -> bool:
        return self.low <= value < self.high


@attrs.frozen(slots=True)
class Domain:
    """The values of one integer column the filters leave: an interval and,
    after ``=`` or ``IN``, a set of values (None: any in the interval)."""

    bounds: Interval = Interval()
    values: frozenset[int] | None = None

    def __and__(self, other: Domain) -> Domain:
        if self.values is None or other.values is None:
            values = self.values if other.values is None else other.values
        else:
            values = self.values & other.values
        return Domain(self.bounds & other.bounds, values)

    def __contains__(self, value: int) -> bool:
        return value in self.bounds and (self.values is None or value in self.values)

    def span(self) -> Interval:
        """The smallest interval holding every value left (empty if none is)."""
        if self.values is None:
            return self.bounds
        kept = [value for value in self.values if value in self.bounds]
        return Interval(min(kept), max(kept) + 1) if kept else Interval(0, 0)


@attrs.frozen
class Pruning:
    """What the pushed filters allow, per column pruning can use.

    ``topics`` None allows every topic; ``time`` is on ``ts_broker`` in ns.
    """

    topics: frozenset[str] | None = None
    partitions: Domain = Domain()
    offsets: Domain = Domain()
    time: Domain = Domain()

    @property
    def empty(self) -> bool:
        """Whether no row can pass: then no range needs reading at all."""
        return (
            (self.topics is not None and not self.topics)
            or self.partitions.span().empty
            or self.offsets.span().empty
            or self.time.span().empty
        )

    def prune(self, ranges: Iterable[OffsetRange]) -> list[OffsetRange]:
        """``ranges`` without those the filters rule out, trimmed to the offsets
        they allow: never a range or an offset that ``ranges`` did not hold."""
        if self.empty:
            return []
        window = self.offsets.span()
        kept = []
        for work in ranges:
            if self.topics is not None and work.topic not in self.topics:
                continue
            if work.partition not in self.partitions:
                continue
            # TO_END is -1: compare with BEYOND in its place, lest a
            # filter ``offset < -1`` read as "to the end".
            start = max(work.start, window.low)
            stop = window.high if work.stop == TO_END else min(work.stop, window.high)
            if stop <= start:
                continue
            kept.append(
                OffsetRange(work.topic, work.partition, start, TO_END if stop == BEYOND else stop)
            )
        return kept

    def time_range(self, given: tuple[int, int] | None) -> tuple[int, int] | None:
        """``given`` (the ``startTime``/``endTime`` range in ns, or None)
        narrowed to the times the filters allow (``low >= high`` if none)."""
        window = self.time.span()
        if given is not None:
            window &= Interval(*given)
        elif not window.bounded:
            return None
        return window.low, window.high


def prune_for(filters: Iterable[Filter]) -> Pruning:
    """The pruning the ANDed ``filters`` allow; filters it cannot use are ignored."""
    pruning = Pruning()
    for pushed in filters:
        # NOT has no attribute (its child has): nothing is inferred from it.
        column = getattr(pushed, "attribute", None)
        if column == TOPIC:
            topics = _texts(pushed)
            if topics is not None:
                known = pruning.topics
                pruning = attrs.evolve(pruning, topics=topics if known is None else known & topics)
        elif column == PARTITION:
            pruning = attrs.evolve(pruning, partitions=pruning.partitions & _domain(pushed, _int))
        elif column == OFFSET:
            pruning = attrs.evolve(pruning, offsets=pruning.offsets & _domain(pushed, _int))
        elif column == TS_BROKER:
            pruning = attrs.evolve(pruning, time=pruning.time & _time_domain(pushed))
    return pruning


def _int(value: object) -> int | None:
    # bool is an int to Python, but never a value of an integer column.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _microseconds(value: object) -> int | None:
    # Spark hands TIMESTAMP literals over as aware datetimes; a naive one
    # could be in any zone, so it is not used.
    if not isinstance(value, datetime) or value.tzinfo is None:
        return None
    return (value - _EPOCH) // _MICROSECOND


def _texts(pushed: Filter) -> frozenset[str] | None:
    """The topics ``=`` / ``IN`` allow (None: the filter says nothing usable)."""
    if isinstance(pushed, EqualTo | EqualNullSafe):
        return frozenset([pushed.value]) if isinstance(pushed.value, str) else None
    if isinstance(pushed, In):
        values = [value for value in pushed.value if value is not None]
        if all(isinstance(value, str) for value in values):
            return frozenset(values)
    return None


#: The keys each comparison allows, given its literal's key. (By exact
#: type: a subclass Spark might add later is ignored, not misread.)
_COMPARISONS: Final[dict[type[Filter], Callable[[int], Interval]]] = {
    EqualTo: lambda value: Interval(value, value + 1),
    EqualNullSafe: lambda value: Interval(value, value + 1),
    GreaterThan: lambda value: Interval(value + 1),
    GreaterThanOrEqual: Interval,
    LessThan: lambda value: Interval(high=value),
    LessThanOrEqual: lambda value: Interval(high=value + 1),
}


def _domain(pushed: Filter, convert: _Converter) -> Domain:
    """The values of an integer column ``pushed`` allows; everything if it
    is not a comparison, ``=`` or ``IN`` with values ``convert`` accepts."""
    if isinstance(pushed, In):
        # ``x IN (1, NULL)`` is true only where ``x = 1``: a null adds nothing.
        values = [convert(value) for value in pushed.value if value is not None]
        if any(value is None for value in values):
            return Domain()
        return Domain(values=frozenset(value for value in values if value is not None))
    interval = _COMPARISONS.get(type(pushed))
    value = convert(getattr(pushed, "value", None))
    if interval is None or value is None:
        return Domain()
    return Domain(interval(value))


def _time_domain(pushed: Filter) -> Domain:
    """``_domain`` on ``ts_broker``: Spark compares microseconds (the stored
    ns floored), so microsecond ``[a, b)`` is ns ``[a * 1000, b * 1000)``."""
    span = _domain(pushed, _microseconds).span()
    if not span.bounded:
        return Domain()
    low = span.low * _NS_PER_US if span.low > LOWEST else LOWEST
    high = span.high * _NS_PER_US if span.high < BEYOND else BEYOND
    return Domain(Interval(low, high))
