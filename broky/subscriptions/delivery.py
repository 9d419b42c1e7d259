"""Deliveries as bytes: the Redelivered and Deliver frames of one consumer,
and the dead-letter copy of a message (sans-IO).

The dispatcher decides offsets; the driver reads their batches from the log
(``BatchCache``) and this module lays them out: consecutive offsets of one
stored batch travel as one run (a slice of it, no copy of the messages until
the frame is joined), each run carrying its partition and base offset, so a
consumer knows every message's (partition, offset). Messages delivered more
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

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

from broky.protocol.codec import encode_frame, runs_frame_parts
from broky.protocol.constants import BodyType
from broky.protocol.frames import Redelivered, Run
from broky.protocol.located import encode_located
from broky.protocol.message import decode_message, encode_message, pack_sizes
from broky.storage.batch import StoredBatch

#: Frame bytes a delivery frame may take, as a share of the consumer's frame
#: limit: the rest is room for the frame's header and run tables.
FRAME_SHARE: Final = 2


class BatchCache:
    """Stored batches of one partition by offset: what a driver round read.

    Batches are added in any order but never overlap (they come from reads
    of one log); ``find`` answers which batch holds an offset.
    """

    def __init__(self) -> None:
        self._bases: list[int] = []
        self._batches: list[StoredBatch] = []

    def add(self, batches: Iterable[StoredBatch]) -> None:
        for batch in batches:
            index = bisect_right(self._bases, batch.base_offset)
            if index and self._batches[index - 1].next_offset > batch.base_offset:
                continue  # held already
            self._bases.insert(index, batch.base_offset)
            self._batches.insert(index, batch)

    def find(self, offset: int) -> StoredBatch | None:
        index = bisect_right(self._bases, offset) - 1
        if index < 0:
            return None
        batch = self._batches[index]
        return batch if offset < batch.next_offset else None

    def cover(self, first: int, stop: int) -> Iterator[tuple[StoredBatch | None, int, int]]:
        """``[first, stop)`` in offset order as ``(batch, start, upto)``
        pieces: the held batch covering ``[start, upto)``, or None over a
        stretch no held batch covers. One bisection per call, then a step
        per piece (a span of one-message runs is one piece per message)."""
        bases, batches = self._bases, self._batches
        count = len(batches)
        index = bisect_right(bases, first) - 1
        offset = first
        while offset < stop:
            if index >= 0 and offset < batches[index].next_offset:
                batch: StoredBatch | None = batches[index]
                upto = min(stop, batches[index].next_offset)
            else:
                batch = None
                upto = min(stop, bases[index + 1]) if index + 1 < count else stop
            yield batch, offset, upto
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
        ranges: list[tuple[int, int]] = []
        find = self.find
        for first, stop in sorted(spans):
            if stop == first + 1 and find(first) is not None:
                continue  # one offset held (every key-shared delivery read this round)
            for batch, offset, upto in self.cover(first, stop):
                if batch is not None:
                    continue
                if ranges and offset - ranges[-1][1] <= gap:
                    ranges[-1] = (ranges[-1][0], max(ranges[-1][1], upto))
                else:
                    ranges.append((offset, upto))
        return ranges


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
    caller acks them away). Costs a step per stored run, not per offset.

    ``name_topic``: the stream's last ``Redelivered`` named another topic
    (or none yet), so the first frame must name ``topic``."""
    frames: list[bytes] = []
    lost: list[int] = []
    budget = max_frame_bytes // FRAME_SHARE
    chunks: list[bytes] = []
    counts: list[tuple[int, int]] = []
    used = 0
    run_batch: StoredBatch | None = None
    run_start = run_stop = 0

    def close_run() -> None:
        nonlocal run_batch, used
        if run_batch is not None:
            part = run_batch.slice(run_start, run_stop)
            chunk = encode_located(
                part.key, part.ts_broker, part.sizes, part.messages, partition, part.base_offset
            )
            chunks.append(chunk)
            used += len(chunk)
            run_batch = None

    def close_frame() -> None:
        nonlocal used, name_topic
        close_run()
        if not chunks:
            return
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
        frames.append(b"".join(runs_frame_parts(BodyType.DELIVER, stream, chunks)))
        chunks.clear()
        counts.clear()
        used = 0

    find, cover = cache.find, cache.cover
    for first, stop, count in deliveries:
        # One offset (every key-shared delivery) needs no cover generator.
        pieces = ((find(first), first, stop),) if stop == first + 1 else cover(first, stop)
        for batch, offset, upto in pieces:
            if batch is None:
                lost.extend(range(offset, upto))
                continue
            if run_batch is batch and offset == run_stop:
                run_stop = upto
            else:
                close_run()
                if used >= budget:
                    close_frame()
                run_batch, run_start, run_stop = batch, offset, upto
            if count > 1:
                counts.extend((redelivered, count) for redelivered in range(offset, upto))
    close_frame()
    return frames, lost


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
