"""The durable image of one (subscription, partition) as bytes, and back.

One row per (subscription, topic, partition) holds the image as one blob, so
a group commit writes one ``INSERT OR REPLACE`` per changed partition instead
of a row per acked range. Layout: unsigned LEB128 varints, each offset
written as its distance from the previous value (acked ranges and counts are
sorted, so the numbers stay small):

    version=1, cursor, limit - cursor,
    n_ranges, (first - previous_end, last - first) * n_ranges,
    n_counts, (offset - previous_offset, count) * n_counts

where ``previous_end`` starts at the cursor and is ``last + 1`` after each
range, and ``previous_offset`` starts at the cursor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from broky.compiled import compiled_twin
from broky.storage.errors import StorageError
from broky.subscriptions.tracker import SubscriptionImage

IMAGE_VERSION: Final = 1


def _put(out: bytearray, value: int) -> None:
    if value < 0:
        raise ValueError(f"negative value {value} in a subscription image")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def put_pairs_pure(
    out: bytearray, previous: int, pairs: Sequence[tuple[int, int]], ranges: bool
) -> None:
    """Write ``pairs`` as the image lays them out, each first as its
    distance from ``previous`` (the cursor, to begin with): ``ranges``,
    acked (first, last) ranges, each followed by ``last - first`` and
    counting the next from ``last + 1``; else (offset, count) pairs, each
    count as it is and the next offset from this one.

    The compiled twin (``broky.subscriptions._passes.put_pairs``) writes
    the same bytes: a key-shared subscription's acked offsets above the
    cursor are scattered (each consumer acks its own keys), so a
    partition's image holds thousands of short ranges, encoded again at
    every group commit, a Python call per number here."""
    for first, second in pairs:
        _put(out, first - previous)
        if ranges:
            _put(out, second - first)
            previous = second + 1
        else:
            _put(out, second)
            previous = first


PutPairs = Callable[[bytearray, int, Sequence[tuple[int, int]], bool], None]
#: The compiled twin, when built (None otherwise, and with ``BROKY_PURE=1``).
put_pairs_compiled: PutPairs | None = compiled_twin("broky.subscriptions._passes", "put_pairs")
put_pairs: PutPairs = put_pairs_compiled or put_pairs_pure


def encode_image(image: SubscriptionImage) -> bytes:
    out = bytearray()
    _put(out, IMAGE_VERSION)
    _put(out, image.cursor)
    _put(out, max(0, image.limit - image.cursor))
    _put(out, len(image.acked))
    put_pairs(out, image.cursor, image.acked, True)
    _put(out, len(image.counts))
    put_pairs(out, image.cursor, image.counts, False)
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._position = 0

    def take(self) -> int:
        data = self._data
        value = shift = 0
        while True:
            if self._position >= len(data) or shift > 63:
                raise StorageError("subscription image is truncated or corrupt")
            byte = data[self._position]
            self._position += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    @property
    def done(self) -> bool:
        return self._position == len(self._data)


def decode_image(data: bytes) -> SubscriptionImage:
    """The image in ``data``; a StorageError if it is not one this code wrote."""
    reader = _Reader(data)
    version = reader.take()
    if version != IMAGE_VERSION:
        raise StorageError(f"subscription image version {version}, this broker knows 1")
    cursor = reader.take()
    limit = cursor + reader.take()
    acked: list[tuple[int, int]] = []
    previous = cursor
    for _ in range(reader.take()):
        first = previous + reader.take()
        last = first + reader.take()
        acked.append((first, last))
        previous = last + 1
    counts: list[tuple[int, int]] = []
    previous = cursor
    for _ in range(reader.take()):
        offset = previous + reader.take()
        counts.append((offset, reader.take()))
        previous = offset
    if not reader.done:
        raise StorageError("subscription image has trailing bytes")
    return SubscriptionImage(cursor, tuple(acked), limit, tuple(counts))
