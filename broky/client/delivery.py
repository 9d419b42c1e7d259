"""A durable subscription's delivered messages (``Delivery``), built from
buffered runs in one pass, and a batch of them folded back into offset ranges.

A consumer of a ``shared`` subscription whose keys change on every message
is handed one run per message. Wrapping each through its ``Message`` (a
9-tuple) and then a ``Delivery`` cost two objects and some twenty Python
calls per message, and acking a batch one more Python call per message: the
consumer process, not the broker, set the rate (shared_x4 in
``benchmarks/bench_consumers.py``). So a ``Delivery`` holds the message's
fields itself (the ``Message`` is built on first read of ``.message``), and:

- ``convert_runs`` turns the buffered runs, as many whole runs as fit the
  caller's limit, into Deliveries: every message in the fixed layout
  ``encode_message`` writes for a payload-only message (``decoding.py``).
  It stops at the first run holding any other layout, which the consumer
  converts the general way (``decode_delivered_run``, with its errors).
- ``settle_ranges`` folds a sequence of Deliveries into ranges of
  consecutive offsets per (topic, partition), which the settle batcher
  takes a partition's ranges at a time.

Both are pure Python here (``*_pure``) with compiled twins in
``broky.client._deliveries``, held equal by hypothesis properties
(tests/client/test_delivery_columns.py); ``BROKY_PURE=1`` runs these.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from broky.client.buffered import FrameRuns
from broky.client.decoding import _FAST_HEAD, _PAYLOAD_AT, _PAYLOAD_UOFFSET, FAST_PREFIX
from broky.client.settling import FoldedRanges
from broky.compiled import compiled_twin
from broky.protocol.codec import u32_array
from broky.protocol.constants import SettleKind
from broky.protocol.frames import Run
from broky.protocol.message import Message, Tags

if TYPE_CHECKING:
    from broky.client.consumer import Consumer


class Delivery:
    """One delivered message of a durable subscription and the means to settle it.

    Settle each delivery once: ``ack`` (done), ``nack`` (redeliver, now or
    after ``delay`` seconds), ``term`` (never redeliver: to the dead-letter
    topic) or, any number of times before, ``in_progress`` (still working:
    restarts the ack timeout). The calls only record the outcome; the
    consumer sends outcomes in batches (``Consumer.flush`` to wait for them).

    ``key``, ``payload``, ``partition`` and ``offset`` are plain attributes
    (the compiled builder fills them without running ``__init__``);
    ``message`` is built from them when first read, unless the delivery was
    decoded the general way (a message with tags, a uid or a key partition),
    which keeps its ``Message``.
    """

    __slots__ = (
        "_consumer",
        "_message",
        "_ts_broker",
        "_ts_producer",
        "delivery_count",
        "key",
        "offset",
        "partition",
        "payload",
        "topic",
    )

    def __init__(self, consumer: Consumer, message: Message, topic: str, count: int) -> None:
        self._consumer = consumer
        self._message: Message | None = message
        #: The durable topic (the ``[[durable]]`` name) holding the message,
        #: as the broker named it ("" only from a broker that named none
        #: before this delivery, see ``Consumer``).
        self.topic = topic
        #: How many times the broker has delivered this message, this time included.
        self.delivery_count = count
        self.key = message.key
        self.payload = message.payload
        self.partition = message.partition
        self.offset = message.offset
        self._ts_producer = message.ts_producer
        self._ts_broker = message.ts_broker

    @property
    def message(self) -> Message:
        """The decoded message (key, payload, tags, partition, offset, stamps)."""
        message = self._message
        if message is None:
            message = self._message = Message(
                self.key,
                self.payload,
                b"",
                self._ts_producer,
                self._ts_broker,
                b"",
                (),
                self.partition,
                self.offset,
            )
        return message

    @property
    def tags(self) -> Tags:
        """The message's attributes, as (name, value) pairs in publish order."""
        message = self._message
        return () if message is None else message.tags

    @property
    def retry_count(self) -> int:
        """Deliveries before this one (0 on the first delivery)."""
        return self.delivery_count - 1

    @property
    def age(self) -> float:
        """Seconds since the broker received the message (its ``ts_broker``),
        by this machine's clock; 0.0 when the message has no broker stamp."""
        stamp = self._ts_broker
        return max(0.0, (time.time_ns() - stamp) / 1e9) if stamp else 0.0

    async def ack(self) -> None:
        """Done with the message: it is never delivered again once the ack is committed."""
        self._consumer._settle(SettleKind.ACK, (self,))

    async def nack(self, delay: float | None = None) -> None:
        """Redeliver the message after ``delay`` seconds (None: the
        subscription's backoff schedule; 0: now), to this or another consumer."""
        delay_ms = -1 if delay is None else max(0, round(delay * 1000))
        self._consumer._settle(SettleKind.NACK, (self,), delay_ms)

    async def term(self, reason: str = "") -> None:
        """Never redeliver: the message goes to the dead-letter topic with
        ``reason`` and is acked here."""
        self._consumer._settle(SettleKind.TERM, (self,), reason=reason)

    async def in_progress(self) -> None:
        """Still working on it: the broker restarts its ack timeout."""
        self._consumer._settle(SettleKind.IN_PROGRESS, (self,))

    def __repr__(self) -> str:
        return (
            f"Delivery(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
            f"key={self.key!r}, delivery_count={self.delivery_count})"
        )


_new_delivery = object.__new__
#: A delivery count taken from ``counts`` by (topic, partition, offset).
Counts = dict[tuple[str, int, int], int]


def _fast_rows(run: Run) -> list[tuple[bytes, int]] | None:
    """(payload, ts_producer) of every message of ``run`` when all are in
    the fixed layout and the sizes cover the messages exactly; else None."""
    count = run.count
    data = run.messages
    if memoryview(run.sizes).nbytes != 4 * count:
        return None
    sizes = u32_array(memoryview(run.sizes))
    if sum(sizes) != memoryview(data).nbytes:
        return None
    rows = []
    position = 0
    for size in sizes:
        end = position + size
        if size < _PAYLOAD_AT:
            return None
        prefix, stamp, uoffset, payload_length = _FAST_HEAD.unpack_from(data, position)
        payload_at = position + _PAYLOAD_AT
        if (
            prefix != FAST_PREFIX
            or uoffset != _PAYLOAD_UOFFSET
            or payload_at + payload_length > end
        ):
            return None
        rows.append((bytes(data[payload_at : payload_at + payload_length]), stamp))
        position = end
    return rows


def convert_runs_pure(
    runs: deque[Run | FrameRuns],
    max_runs: int,
    limit: int,
    taken: int,
    consumer: Consumer,
    topic: str,
    counts: Counts,
    into: list[Delivery],
) -> tuple[int, int]:
    """Convert up to ``max_runs`` runs from the front of ``runs`` (popping
    them) into Deliveries of ``topic`` appended to ``into``: whole runs
    while ``taken`` plus their messages stays within ``limit`` (the first
    whatever its size when ``taken`` is 0), stopping before a run not all in
    the fixed layout and before a ``FrameRuns``. A message's delivery count
    is popped from ``counts`` (1 when absent). Returns (runs converted,
    ``taken`` plus their messages). (``broky.client._deliveries.convert_runs``
    is the compiled twin.)"""
    used = 0
    while used < max_runs and runs:
        run = runs[0]
        if not isinstance(run, Run):
            break  # runs left in a frame: convert_located's
        count = run.count
        if taken and taken + count > limit:
            break
        rows = _fast_rows(run)
        if rows is None:
            break
        runs.popleft()
        key = run.key.decode(errors="replace")
        base, ts_broker = run.base_offset, run.ts_broker
        partition = run.partition if base >= 0 else -1
        for index, (payload, stamp) in enumerate(rows):
            offset = base + index if base >= 0 else -1
            delivery = _new_delivery(Delivery)
            delivery._consumer = consumer
            delivery._message = None
            delivery.topic = topic
            delivery.delivery_count = counts.pop((topic, partition, offset), 1) if counts else 1
            delivery.key = key
            delivery.payload = payload
            delivery.partition = partition
            delivery.offset = offset
            delivery._ts_producer = stamp
            delivery._ts_broker = ts_broker
            into.append(delivery)
        used += 1
        taken += count
    return used, taken


class _Fold:
    """One (topic, partition)'s ranges while ``settle_ranges_pure`` folds."""

    __slots__ = ("ascending", "firsts", "lasts")

    def __init__(self, offset: int) -> None:
        self.firsts = [offset]
        self.lasts = [offset]
        self.ascending = True


def settle_ranges_pure(deliveries: Sequence[Delivery]) -> list[FoldedRanges]:
    """The deliveries' offsets as ranges per (topic, partition), in the
    order each pair first appears: ``(topic, partition, firsts, lasts,
    ascending)``, a delivery whose offset is its pair's last plus one
    extending that pair's last range (``broky.client._deliveries.
    settle_ranges`` is the compiled twin).

    Grouped, not one range per stretch of the batch: a key-shared
    consumer's batch interleaves partitions and skips offsets (the other
    consumers' keys), so most of its deliveries are ranges of one, and
    handing them to the batcher one call each was a third of the consumer
    process's CPU. ``ascending``: each range starts above the one before it
    plus one (the ranges are disjoint and maximal), so the batcher may
    append them whole."""
    folds: dict[tuple[str, int], _Fold] = {}
    here: tuple[str, int] | None = None
    fold: _Fold | None = None
    for delivery in deliveries:
        offset = delivery.offset
        pair = (delivery.topic, delivery.partition)
        if pair != here or fold is None:
            here = pair
            fold = folds.get(pair)
            if fold is None:
                fold = folds[pair] = _Fold(offset)
                continue
        lasts = fold.lasts
        if offset == lasts[-1] + 1:
            lasts[-1] = offset
            continue
        if offset <= lasts[-1]:
            fold.ascending = False
        fold.firsts.append(offset)
        lasts.append(offset)
    return [
        (topic, partition, fold.firsts, fold.lasts, fold.ascending)
        for (topic, partition), fold in folds.items()
    ]


ConvertRuns = Callable[
    [deque[Run | FrameRuns], int, int, int, "Consumer", str, Counts, list[Delivery]],
    tuple[int, int],
]
SettleRanges = Callable[[Sequence[Delivery]], list[FoldedRanges]]
ConvertLocated = Callable[
    [FrameRuns, int, int, "Consumer", str, Counts, list[Delivery]], tuple[int, int]
]


def _compiled() -> tuple[ConvertRuns, SettleRanges, ConvertLocated] | None:
    """The compiled twins, bound to ``Delivery`` (None: not built, or
    ``Delivery``'s slots not laid out as they expect)."""
    module = "broky.client._deliveries"
    bind: Callable[[type, type], bool] | None = compiled_twin(module, "bind")
    if bind is None or not bind(Delivery, Run):
        return None
    return (
        compiled_twin(module, "convert_runs"),
        compiled_twin(module, "settle_ranges"),
        compiled_twin(module, "convert_located"),
    )


_twins = _compiled()
#: ``convert_runs_pure`` or its compiled twin.
convert_runs: Final[ConvertRuns] = convert_runs_pure if _twins is None else _twins[0]
#: ``settle_ranges_pure`` or its compiled twin.
settle_ranges: Final[SettleRanges] = settle_ranges_pure if _twins is None else _twins[1]
#: The compiled reader of a ``FrameRuns``'s runs in place, or None: its
#: pure counterpart is ``FrameRuns.take_run`` then ``convert_runs_pure``
#: (the consumer's path without it), as the frame's runs decode anyway.
convert_located: Final[ConvertLocated | None] = None if _twins is None else _twins[2]
