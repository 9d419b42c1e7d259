"""Delivery frames from stored batches (sans-IO), dead-letter copies, and
subscription definitions: properties over any batches and any deliveries."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broky.protocol.codec import decode_frame
from broky.protocol.constants import StartKind, SubscriptionKind
from broky.protocol.frames import Consume, Deliver, Redelivered, Run
from broky.protocol.located import encode_located_blob
from broky.protocol.message import decode_run, encode_message, pack_sizes
from broky.storage.batch import StoredBatch, encode_runs
from broky.storage.batch_reading import BatchSpan, RecordBatch, decode_batch
from broky.subscriptions import delivery
from broky.subscriptions.definition import Definition, DefinitionError
from broky.subscriptions.delivery import BatchCache, dead_letter_run, delivery_frames
from tests.subscriptions.spans import held_spans


def _run(base: int, count: int, key: bytes) -> Run:
    messages = [encode_message(str(base + i).encode(), key_partition=b"kp") for i in range(count)]
    return Run(key, 7, count, pack_sizes([len(m) for m in messages]), b"".join(messages))


def span(base: int, run_counts: list[int], start: int = 0, stop: int | None = None) -> BatchSpan:
    """A stored batch at ``base`` of runs of ``run_counts`` messages (keys
    changing from run to run), verified as a log read does, as a span of it."""
    runs, offset = [], base
    for index, count in enumerate(run_counts):
        runs.append(_run(offset, count, b"orders.k%d" % (index % 3)))
        offset += count
    record = decode_batch(encode_runs(base, 7, runs), 0)
    return BatchSpan(record, max(start, base), offset if stop is None else min(stop, offset))


def batch(base: int, count: int) -> StoredBatch:
    return next(span(base, [count]).runs())


@st.composite
def batches_and_deliveries(
    draw: st.DrawFn,
) -> tuple[list[BatchSpan], list[tuple[int, int, int]]]:
    shapes = draw(st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=4), max_size=8))
    batches, base = [], draw(st.integers(0, 50))
    for run_counts in shapes:
        batches.append(span(base, run_counts))
        base += sum(run_counts)
    # Spans in any order, some past the batches (trimmed), no offset twice.
    spans: list[tuple[int, int, int]] = []
    taken: set[int] = set()
    for first, length, count in draw(
        st.lists(st.tuples(st.integers(0, base + 5), st.integers(1, 5), st.integers(1, 4)))
    ):
        offsets = set(range(first, first + length))
        if not offsets & taken:
            taken |= offsets
            spans.append((first, first + length, count))
    return batches, spans


@given(batches_and_deliveries(), st.sampled_from([300, 600, 2048, 1 << 20]), st.booleans())
def test_frames_carry_exactly_the_deliveries_in_order(
    case: tuple[list[BatchSpan], list[tuple[int, int, int]]], frame_bytes: int, name_topic: bool
) -> None:
    batches, deliveries = case
    cache = BatchCache()
    cache.add(reversed(batches))  # any order of adding
    cache.add(batches[:1])  # and twice
    held = {o for b in batches for o in range(b.start, b.stop)}
    frames, lost = delivery_frames(
        9, "orders", 3, deliveries, cache, frame_bytes, name_topic=name_topic
    )
    if name_topic and frames:
        # The stream last named another topic: the first frame names this one.
        assert isinstance(decode_frame(frames[0][4:]), Redelivered)
    offsets = [(o, count) for first, stop, count in deliveries for o in range(first, stop)]
    assert lost == [offset for offset, _ in offsets if offset not in held]
    seen: list[tuple[int, int]] = []
    counts: dict[int, int] = {}
    for data in frames:
        frame = decode_frame(data[4:])
        if isinstance(frame, Redelivered):
            assert not counts  # each Redelivered is followed by its Deliver
            assert frame.topic == "orders"
            counts = dict(zip(frame.offsets, frame.counts, strict=True))
            assert set(frame.partitions) <= {3}
            continue
        assert isinstance(frame, Deliver)
        assert frame.stream == 9
        for run in frame.runs:
            for message in decode_run(run):
                assert (message.partition, int(message.payload)) == (3, message.offset)
                seen.append((message.offset, counts.pop(message.offset, 1)))
        assert not counts
    assert seen == [(offset, count) for offset, count in offsets if offset in held]


def test_missing_merges_ranges_of_what_is_not_held() -> None:
    cache = BatchCache()
    cache.add([span(10, [2, 1, 2])])
    offsets = [(o, o + 1) for o in (3, 4, 5, 11, 15, 16, 20)]
    assert cache.missing(offsets) == [(3, 6), (15, 17), (20, 21)]
    # Across gaps of up to 4 offsets: one span (a held offset inside is read again).
    assert cache.missing(offsets, gap=4) == [(3, 6), (15, 21)]
    assert cache.missing([(0, 1), (15, 16), (30, 31)], gap=20) == [(0, 31)]
    # Spans: only their parts outside held batches.
    assert cache.missing([(8, 18), (12, 13), (30, 33)]) == [(8, 10), (15, 18), (30, 33)]
    # A span inside the held batch needs nothing; one running past it, its tail.
    assert cache.missing([(11, 14), (10, 15)]) == []
    assert cache.missing([(11, 14), (13, 17)]) == [(15, 17)]


def test_missing_sees_gaps_between_held_batches_that_touch_its_bounds() -> None:
    """Batches held back to back hold everything between the lowest and the
    highest needed offset; a gap between two held batches does not."""
    cache = BatchCache()
    cache.add([span(10, [2, 3]), span(15, [5])])
    assert cache.missing(iter([(19, 20), (10, 11), (14, 16)])) == []
    cache.add([span(22, [3])])
    assert cache.missing([(10, 11), (24, 25)]) == []
    assert cache.missing([(10, 11), (19, 23), (24, 25)]) == [(20, 22)]
    assert cache.missing([(9, 11), (24, 26)]) == [(9, 10), (25, 26)]


def test_a_dead_letter_keeps_the_message_and_adds_the_tags() -> None:
    stored = batch(4, 3)
    run = dead_letter_run(stored, 5, b"_dlq.s.orders", (("dlq.offset", "5"),))
    [message] = decode_run(run)
    assert (message.key, message.payload, message.key_partition) == ("_dlq.s.orders", b"5", b"kp")
    assert message.tags == (("dlq.offset", "5"),)


def test_definitions_round_trip_and_refuse_what_they_cannot_be() -> None:
    frame = Consume(
        1,
        "billing v2",
        b"orders.>",
        kind=SubscriptionKind.KEY_SHARED,
        start=StartKind.OFFSET,
        ack_timeout_ms=1500,
        backoff_ms=(10, 2000),
        max_deliveries=4,
        start_offsets=(5, 6),
    )
    definition = Definition.from_consume(frame)
    assert Definition.from_json(definition.to_json()) == definition
    assert definition.dead_letter_key("orders") == b"_dlq.billing_v2.orders"
    assert definition.dead_letter_key("orders", b"_dlq.>") == b"_dlq.billing_v2.orders"
    assert definition.dead_letter_key("orders", b"dlq.*") == b"dlq.billing_v2"
    assert definition.dead_letter_key("orders", b"a.*.*.*.b") == b"a.billing_v2.orders._.b"
    assert definition.dead_letter_key("orders", b"dead") == b"dead"
    assert definition.options.backoff == (0.01, 2.0)
    assert definition.mismatch(frame) is None
    assert "fixed at creation" in (definition.mismatch(Consume(1, "billing v2", b"orders.>")) or "")
    for bad in (
        Consume(1, "", b"orders.>"),
        Consume(1, "a\nb", b"orders.>"),
        Consume(1, "k", b"orders.>", kind=SubscriptionKind.KEY_SHARED, ack_timeout_ms=0),
    ):
        with pytest.raises(DefinitionError):
            Definition.from_consume(bad)
    with pytest.raises(DefinitionError):
        Definition.from_json('{"version": 2}')


def test_scattered_deliveries_from_one_batch_are_laid_out_by_one_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key-shared consumer's share of a batch over many keys (every other
    message here) costs one encoder call, not one per delivery."""
    calls: list[list[int]] = []
    encode = encode_located_blob

    def counted(*args: Any, **keywords: Any) -> tuple[bytes, bytes]:
        calls.append(list(args[7]))
        return encode(*args, **keywords)

    monkeypatch.setattr(delivery, "encode_located_blob", counted)
    cache = BatchCache()
    cache.add([span(100, [1] * 10)])
    deliveries = [(offset, offset + 1, 1) for offset in range(100, 110, 2)]
    frames, lost = delivery_frames(9, "orders", 3, deliveries, cache, 1 << 20, name_topic=False)
    assert calls == [[100, 101, 102, 103, 104, 105, 106, 107, 108, 109]]
    assert lost == []
    (frame,) = (decode_frame(data[4:]) for data in frames)
    assert isinstance(frame, Deliver)
    assert [message.offset for run in frame.runs for message in decode_run(run)] == list(
        range(100, 110, 2)
    )


@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(1, 6)), max_size=6),
    st.lists(
        st.tuples(st.integers(0, 60), st.integers(1, 6), st.sampled_from([1, 1, 2, 5])),
        max_size=25,
    ),
)
def test_the_compiled_segments_pass_cuts_as_the_pure_one(
    layout: list[tuple[int, int]], deliveries: list[tuple[int, int, int]]
) -> None:
    """Held spans with gaps between them, deliveries in any order, some
    past or between the spans, some redelivered: the same segments and the
    same lost offsets, in the same order."""
    compiled = delivery.delivery_segments_compiled
    if compiled is None:
        pytest.skip("the compiled twin is not in use (BROKY_PURE=1)")
    bases, stops = held_spans(layout)
    given_deliveries = [(first, first + length, count) for first, length, count in deliveries]
    pure = delivery.delivery_segments_pure(given_deliveries, bases, stops)
    assert compiled(given_deliveries, bases, stops) == pure
    # Triples that are not tuples (read unpacked) cut alike.
    as_lists: Any = [list(triple) for triple in given_deliveries]
    assert compiled(as_lists, bases, stops) == pure


@given(st.lists(st.tuples(st.integers(-5, 60), st.integers(-5, 60)), min_size=1, max_size=20))
def test_the_compiled_span_bounds_are_the_pure_ones(spans: list[tuple[int, int]]) -> None:
    compiled = delivery.span_bounds_compiled
    if compiled is None:
        pytest.skip("the compiled twin is not in use (BROKY_PURE=1)")
    pure = delivery.span_bounds_pure(spans)
    assert pure == (min(a for a, _ in spans), max(b for _, b in spans))
    assert compiled(spans) == pure
    as_lists: Any = [list(pair) for pair in spans]
    assert compiled(as_lists) == pure
    for bound in (compiled, delivery.span_bounds_pure):
        with pytest.raises(ValueError, match="no spans"):
            bound([])


class _Walking(BatchCache):
    """A cache whose deliveries are laid out with no run index: the
    encoder walks each batch from its start."""

    def run_index(self, batch: RecordBatch) -> bytes:
        return None  # type: ignore[return-value]


@given(st.lists(st.integers(1, 4), min_size=1, max_size=60), st.data())
def test_deliveries_inside_a_batch_lay_out_alike_walked_or_indexed(
    runs: list[int], data: st.DataObject
) -> None:
    """Whether the encoder walks the batch from its start or jumps through
    the batch's run index (``BatchCache.run_index``, what deliveries use):
    the same frames, for scattered deliveries anywhere inside a batch of up
    to 60 runs (ranges far enough apart to jump)."""
    total = sum(runs)
    offsets = data.draw(st.sets(st.integers(100, 100 + total - 1), min_size=1, max_size=12))
    deliveries = [(offset, offset + 1, 1) for offset in sorted(offsets)]
    laid_out = []
    for cache in (_Walking(), BatchCache()):
        cache.add([span(100, runs)])
        laid_out.append(
            delivery_frames(9, "orders", 3, deliveries, cache, 1 << 20, name_topic=False)
        )
    assert laid_out[0] == laid_out[1]
