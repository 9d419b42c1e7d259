"""Deliveries as bytes: the Redelivered and Deliver frames of one consumer,
and the dead-letter copy of a message (sans-IO).

The dispatcher decides offsets; the driver reads their batches from the log
(``BatchCache``, one span per stored batch) and this module lays them out:
the delivered offsets of each stored run travel as one located chunk,
written straight from the batch's columns, carrying its partition and base
offset, so a consumer knows every message's (partition, offset). Messages delivered more
than once are listed, with their counts, in a ``Redelivered`` frame just
before the ``Deliver`` frame that carries them. A ``Redelivered`` also
names the topic of every ``Deliver`` after it on the stream until the next
one (the ``Deliver`` frame has no topic field), so when a stream's deliveries
switch to another topic the first frame gets a ``Redelivered``, listing no
messages if none is redelivered: a consumer over a pattern that spans
several durable topics can name every message's topic in its ``Settle``.
First deliveries of the topic a stream last named cost nothing extra.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final

from broky.compiled import compiled_twin
from broky.protocol.chunks import sized_runs_frame_parts
from broky.protocol.codec import encode_frame
from broky.protocol.constants import BodyType
from broky.protocol.frames import Redelivered, Run
from broky.protocol.located import encode_located_blob, run_index
from broky.protocol.message import decode_message, encode_message, pack_sizes
from broky.storage.batch import StoredBatch
from broky.storage.batch_reading import BatchSpan, RecordBatch

#: Frame bytes a delivery frame may take, as a share of the consumer's frame
#: limit: the rest is room for the frame's header and run tables.
FRAME_SHARE: Final = 2


#: A segment of deliveries (``delivery_segments``): a held span's index,
#: ascending start/stop pairs of offsets in it, its redelivered offsets
#: with their counts.
Segment = tuple[int, list[int], list[tuple[int, int]]]
#: A :data:`Segment` with the held span itself in place of its index.
SpanSegment = tuple[BatchSpan, list[int], list[tuple[int, int]]]


class BatchCache:
    """Stored batches of one partition by offset: what a driver round read.

    Spans (one per stored batch, ``LogReader.read_spans``) are added in any
    order but never overlap (they come from reads of one log); ``find``
    answers which run holds an offset.
    """

    def __init__(self) -> None:
        self._bases: list[int] = []
        #: Each held span's stop, parallel to ``_bases`` (``segments`` reads both).
        self._stops: list[int] = []
        self._spans: list[BatchSpan] = []
        #: Run indexes (``located.run_index``) of the held batches laid out
        #: from this round, by ``id``.
        self._indexes: dict[int, bytes] = {}

    def add(self, spans: Iterable[BatchSpan]) -> None:
        """Hold ``spans``; the parts of one that held spans cover already
        are left out (batches kept from earlier rounds may overlap a new
        read in any way), so the held spans stay sorted and disjoint."""
        for span in spans:
            index = bisect_right(self._bases, span.start)
            if index < len(self._bases) and self._bases[index] < span.stop:
                gaps = [(a, b) for held, a, b in self.cover(span.start, span.stop) if held is None]
                for start, stop in reversed(gaps):
                    self._insert(BatchSpan(span.batch, start, stop))
            elif not index or self._stops[index - 1] <= span.start:
                self._insert(span)
            elif self._stops[index - 1] < span.stop:
                self._insert(BatchSpan(span.batch, self._stops[index - 1], span.stop))

    def _insert(self, span: BatchSpan) -> None:
        index = bisect_right(self._bases, span.start)
        self._bases.insert(index, span.start)
        self._stops.insert(index, span.stop)
        self._spans.insert(index, span)

    def keep_from(self, floor: int | None, max_bytes: int) -> int:
        """Drop the spans below ``floor`` (None: every span), then the
        lowest ones while the rest hold more than ``max_bytes`` of stored
        batches: what a driver keeps for its next rounds. Returns the
        stored bytes kept."""
        spans = self._spans
        drop = len(spans) if floor is None else bisect_right(self._stops, floor)
        held = sum(span.batch.stored_bytes for span in spans[drop:])
        while drop < len(spans) and held > max_bytes:
            held -= spans[drop].batch.stored_bytes
            drop += 1
        if drop:
            del self._bases[:drop], self._stops[:drop], spans[:drop]
        # Indexed by ``id``: a batch dropped here may be freed and its id reused.
        self._indexes.clear()
        return held

    def find(self, offset: int) -> StoredBatch | None:
        """The held run holding ``offset``, sliced to that one message."""
        index = bisect_right(self._bases, offset) - 1
        if index < 0 or offset >= self._spans[index].stop:
            return None
        return next(self._spans[index].runs(offset, offset + 1))

    def cover(self, first: int, stop: int) -> Iterator[tuple[BatchSpan | None, int, int]]:
        """``[first, stop)`` in offset order as ``(span, start, upto)``
        pieces: the held span covering ``[start, upto)``, or None over a
        stretch no held span covers. One bisection per call, then a step
        per piece (one per stored batch, however many runs it holds)."""
        bases, spans = self._bases, self._spans
        count = len(spans)
        index = bisect_right(bases, first) - 1
        offset = first
        while offset < stop:
            if index >= 0 and offset < spans[index].stop:
                span: BatchSpan | None = spans[index]
                upto = min(stop, spans[index].stop)
            else:
                span = None
                upto = min(stop, bases[index + 1]) if index + 1 < count else stop
            yield span, offset, upto
            offset = upto
            if index + 1 < count and bases[index + 1] <= offset:
                index += 1

    def missing(self, spans: Iterable[tuple[int, int]], gap: int = 0) -> list[tuple[int, int]]:
        """The ranges ``[first, stop)`` of the offsets of ``spans`` (each
        ``[first, stop)``) not held, merged, and merged across up to ``gap``
        offsets between them: every log read refills a read window (a
        ``pread`` of up to a MiB), so key-shared deliveries scattered over
        many keys are cheaper read as a few spans than one read each. Costs
        a bisection per held batch or missing range, not per offset."""
        spans = spans if isinstance(spans, list) else list(spans)
        if spans and self.holds(*span_bounds(spans)):
            # The usual round: every delivery lies in batches this round
            # read, held back to back (one pass, at C speed when compiled:
            # no sort and no Python step per delivery).
            return []
        ranges: list[tuple[int, int]] = []
        bases, stops = self._bases, self._stops
        # The held span the last bisection found: sorted, most spans of a
        # round (a key-shared delivery per message or two, all read this
        # round) fall in the one before's, with no bisection.
        held_stop = -1
        for first, stop in sorted(spans):
            if stop <= held_stop:
                continue
            index = bisect_right(bases, first) - 1
            if index >= 0 and first < stops[index]:
                held_stop = stops[index]
                if stop <= held_stop:
                    continue
            for span, offset, upto in self.cover(first, stop):
                if span is not None:
                    continue
                if ranges and offset - ranges[-1][1] <= gap:
                    ranges[-1] = (ranges[-1][0], max(ranges[-1][1], upto))
                else:
                    ranges.append((offset, upto))
        return ranges

    def holds(self, first: int, stop: int) -> bool:
        """Whether held spans cover ``[first, stop)`` without a gap."""
        bases, stops = self._bases, self._stops
        index = bisect_right(bases, first) - 1
        if index < 0 or first >= stops[index]:
            return False
        while stops[index] < stop:
            if index + 1 == len(bases) or bases[index + 1] != stops[index]:
                return False
            index += 1
        return True

    def run_index(self, batch: RecordBatch) -> bytes:
        """``batch``'s run index (``located.run_index``), built at its first
        delivery of a round (one pass over its run table, in C when
        compiled) and shared by every consumer's deliveries from it: they
        then cost the messages laid out, not the runs between them."""
        index = self._indexes.get(id(batch))
        if index is None:
            index = run_index(batch.counts, batch.key_lengths, batch.sizes)
            self._indexes[id(batch)] = index
        return index

    def segments(
        self, deliveries: Sequence[tuple[int, int, int]]
    ) -> tuple[list[SpanSegment], list[int]]:
        """:func:`delivery_segments` over the held spans, with each
        segment's span itself."""
        segments, lost = delivery_segments(deliveries, self._bases, self._stops)
        return self.spans_of(segments), lost

    def bounds(self) -> tuple[list[int], list[int]]:
        """The held spans' bases and stops, what :func:`delivery_segments`
        cuts along (the lists themselves: read them before any ``add``)."""
        return self._bases, self._stops

    def spans_of(self, segments: list[Segment]) -> list[SpanSegment]:
        """``segments`` (cut along :meth:`bounds`) with each span index
        replaced by the held span itself."""
        spans = self._spans
        return [(spans[index], ranges, counts) for index, ranges, counts in segments]


def span_bounds_pure(spans: list[tuple[int, int]]) -> tuple[int, int]:
    """The lowest first and the highest stop of ``spans`` (each
    ``[first, stop)``, not empty as a list): what ``BatchCache.missing``
    checks the held spans against before anything else. Its compiled twin
    (``broky.subscriptions._passes.span_bounds``) reads the pairs in C."""
    if not spans:
        raise ValueError("no spans to bound")
    return min(first for first, _ in spans), max(stop for _, stop in spans)


#: :func:`span_bounds_pure` compiled, when it is built.
span_bounds_compiled: Callable[[list[tuple[int, int]]], tuple[int, int]] | None = compiled_twin(
    "broky.subscriptions._passes", "span_bounds"
)
span_bounds = span_bounds_compiled or span_bounds_pure


DeliverySegments = Callable[
    [Sequence[tuple[int, int, int]], list[int], list[int]], tuple[list[Segment], list[int]]
]


def delivery_segments_pure(
    deliveries: Sequence[tuple[int, int, int]], bases: list[int], stops: list[int]
) -> tuple[list[Segment], list[int]]:
    """``deliveries`` (``(first, stop, delivery count)`` in delivery order)
    cut along the held spans ``[bases[i], stops[i])`` (sorted, disjoint):
    the segments, each ``(span index, ascending start/stop pairs, the
    redelivered offsets with their counts)``, in order, a new one wherever
    the span changes or the offsets go down; and the offsets no span holds,
    in order (trimmed by retention).

    What ``delivery_frames`` lays out as one encoder call per segment. Why
    a pass of its own: a key-shared consumer's deliveries are a message or
    two each, so this loop runs about once per delivered message; the
    compiled twin (``broky.subscriptions._passes.delivery_segments``) runs
    it in C with the same results."""
    segments: list[Segment] = []
    lost: list[int] = []
    current = -1
    ranges: list[int] = []
    counts: list[tuple[int, int]] = []
    held = len(bases)
    for first, stop, count in deliveries:
        offset = first
        index = bisect_right(bases, offset) - 1
        while offset < stop:
            if index >= 0 and offset < stops[index]:
                upto = min(stop, stops[index])
                if index == current and offset >= ranges[-1]:
                    if offset == ranges[-1]:
                        ranges[-1] = upto
                    else:
                        ranges += (offset, upto)
                else:
                    current, ranges, counts = index, [offset, upto], []
                    segments.append((index, ranges, counts))
                if count > 1:
                    counts.extend((redelivered, count) for redelivered in range(offset, upto))
            else:
                upto = min(stop, bases[index + 1]) if index + 1 < held else stop
                lost.extend(range(offset, upto))
            offset = upto
            if index + 1 < held and bases[index + 1] <= offset:
                index += 1
    return segments, lost


#: :func:`delivery_segments_pure` compiled, when it is built.
delivery_segments_compiled: DeliverySegments | None = compiled_twin(
    "broky.subscriptions._passes", "delivery_segments"
)
delivery_segments: DeliverySegments = delivery_segments_compiled or delivery_segments_pure


def delivery_frames(
    stream: int,
    topic: str,
    partition: int,
    deliveries: Sequence[tuple[int, int, int]],
    cache: BatchCache,
    max_frame_bytes: int,
    *,
    name_topic: bool,
) -> tuple[list[bytes], list[int]]:
    """The frames carrying ``deliveries`` (``(first, stop, delivery count)``:
    offsets ``[first, stop)`` in delivery order) to ``stream``, and the
    offsets the cache did not hold (trimmed from the log by retention: the
    caller acks them away). Costs a step per stored batch, and a located
    chunk per stored run laid out from the batch's columns
    (``encode_located_blob``), not a step per offset: deliveries that go on
    up one batch are laid out by one call, however many they are (a
    key-shared consumer's share of a batch over many keys is scattered
    deliveries of a message or two each).

    ``name_topic``: the stream's last ``Redelivered`` named another topic
    (or none yet), so the first frame must name ``topic``."""
    segments, lost = cache.segments(deliveries)
    frames = segment_frames(
        stream, topic, partition, segments, cache, max_frame_bytes, name_topic=name_topic
    )
    return frames, lost


def segment_frames(
    stream: int,
    topic: str,
    partition: int,
    segments: list[SpanSegment],
    cache: BatchCache,
    max_frame_bytes: int,
    *,
    name_topic: bool,
) -> list[bytes]:
    """:func:`delivery_frames` of deliveries already cut along the held
    spans (``BatchCache.segments``, or ``round_events.sort_segments`` for
    a whole round's events at once)."""
    frames: list[bytes] = []
    budget = max_frame_bytes // FRAME_SHARE
    #: The open frame's chunks, back to back in pieces (a stored run's
    #: chunks are one piece), and each chunk's length (packed uint32s).
    blobs: list[bytes] = []
    lengths: list[bytes] = []
    counts: list[tuple[int, int]] = []
    used = 0
    #: The open run: ascending ``start, stop`` pairs of one held span.
    run_span: BatchSpan | None = None
    run_ranges: list[int] = []
    #: Where the open run's entries begin in ``counts`` (ascending offsets).
    run_counts = 0

    def close_run() -> None:
        nonlocal run_span, used
        if run_span is None:
            return
        batch = run_span.batch
        run_span = None
        # One bytes for all the chunks of this span's ranges (a chunk a
        # message when keys change on every message), not one each.
        laid_out, laid_lengths = encode_located_blob(
            batch.ts_brokers,
            batch.counts,
            batch.key_lengths,
            batch.keys,
            batch.sizes,
            batch.messages,
            batch.base_offset,
            run_ranges,
            partition,
            run_starts=index_of(batch),
        )
        if not laid_out:
            return
        if used + len(laid_out) <= budget:
            blobs.append(laid_out)
            lengths.append(laid_lengths)
            used += len(laid_out)
            return
        # Past the budget: the frame ends between two stored runs, and the
        # redelivery counts of the runs after the cut go with them.
        firsts = (
            first
            for pair in range(0, len(run_ranges), 2)
            for first in run_firsts(
                batch.base_offset, batch.counts, run_ranges[pair], run_ranges[pair + 1]
            )
        )
        sizes = struct.unpack(f"<{len(laid_lengths) // 4}I", laid_lengths)
        position = 0
        for index, (size, chunk_first) in enumerate(zip(sizes, firsts, strict=True)):
            if used >= budget:
                close_frame(chunk_first)
            blobs.append(laid_out[position : position + size])
            lengths.append(laid_lengths[4 * index : 4 * index + 4])
            position += size
            used += size

    def run_firsts(
        offset: int, stored_counts: Sequence[int], start: int, stop: int
    ) -> Iterator[int]:
        """The first offset of each stored run in ``[start, stop)``."""
        for count in stored_counts:
            if offset >= stop:
                return
            if offset + count > start:
                yield max(offset, start)
            offset += count

    def close_frame(carry_from: int | None = None) -> None:
        """End the frame; redelivery counts of the open run's offsets from
        ``carry_from`` on stay for the next one."""
        nonlocal used, name_topic, run_counts
        if not blobs:
            return
        carried: list[tuple[int, int]] = []
        if carry_from is not None:
            cut = bisect_left(counts, (carry_from, 0), run_counts)
            carried = counts[cut:]
            del counts[cut:]
        if counts or name_topic:
            name_topic = False
            frames.append(
                encode_frame(
                    Redelivered(
                        stream,
                        partitions=(partition,) * len(counts),
                        offsets=tuple(offset for offset, _ in counts),
                        counts=tuple(count for _, count in counts),
                        topic=topic,
                    )
                )
            )
        frames.append(
            b"".join(sized_runs_frame_parts(BodyType.DELIVER, stream, blobs, b"".join(lengths)))
        )
        blobs.clear()
        lengths.clear()
        counts[:] = carried
        run_counts = 0
        used = 0

    index_of = cache.run_index
    for span, ranges, redeliveries in segments:
        close_run()
        if used >= budget:
            close_frame()
        run_span, run_ranges = span, ranges
        run_counts = len(counts)
        counts += redeliveries
    close_run()
    close_frame()
    return frames


def dead_letter_run(
    batch: StoredBatch, offset: int, key: bytes, tags: Sequence[tuple[str, str]]
) -> Run:
    """The message at ``offset`` of ``batch`` as a one-message run on ``key``
    (the dead-letter topic), its tags extended with ``tags``; payload,
    ``key_partition``, uid and producer time are kept."""
    part = batch.slice(offset, offset + 1)
    message = decode_message(part.messages, batch.key.decode(errors="replace"), batch.ts_broker)
    encoded = encode_message(
        message.payload,
        key_partition=message.key_partition,
        ts_producer=message.ts_producer,
        uid=message.uid,
        tags=(*message.tags, *tags),
    )
    return Run(key, 0, 1, pack_sizes([len(encoded)]), encoded)
