"""A Settle frame's ranges gathered per partition, clipped to what each
partition's subscription can settle (sans-IO).

Each dispatcher then settles all of its ranges in one call (one pump), not
one call per range. A key-shared consumer's acks are mostly ranges of one
offset (its keys' messages are spread over the log), so an ack of one
offset is gathered as a plain offset, not as a range object: the first item
of a partition's list holds those. Only acks are gathered so, since their
order does not matter; nacks and terms keep the frame's order (it decides
the order of redeliveries' bookkeeping and of dead letters).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from broky.compiled import compiled_twin
from broky.protocol.constants import SettleKind
from broky.protocol.frames import Settle
from broky.subscriptions.tracker import AckTracker

GatherRanges = Callable[
    [Settle, Callable[[int], AckTracker | None]], tuple[dict[int, list[Sequence[int]]], int]
]


def gather_ranges_pure(
    frame: Settle, tracker_of: Callable[[int], AckTracker | None]
) -> tuple[dict[int, list[Sequence[int]]], int]:
    """The offsets ``frame`` settles, as sequences by partition number, and
    how many of its offsets were never read here (``unconfirmed``).

    ``tracker_of(number)``: the tracker of partition ``number`` this
    settle reaches, None when it is not the consumer's (its ranges are
    dropped: nothing the consumer could settle); called once per partition.
    Each range is clipped to ``[cursor, read_position)``: below the cursor
    all is acked; offsets at or above the read position were not read since
    this worker started (delivered before a restart: a consumer spread over
    workers outlives its owners), so they come again and count as
    unconfirmed.

    Each range of a key-shared consumer's settle is mostly one offset, so
    this loop runs once per acked message: the compiled twin
    (``broky.subscriptions._passes.gather_ranges``) runs it in C with the
    same results."""
    acking = frame.kind is SettleKind.ACK
    spans: dict[int, list[Sequence[int]]] = {}
    found: dict[int, tuple[AckTracker, list[int]] | None] = {}
    unconfirmed = 0
    for number, first, last in zip(
        frame.partitions, frame.first_offsets, frame.last_offsets, strict=True
    ):
        if number in found:
            entry = found[number]
        else:
            tracker = tracker_of(number)
            entry = found[number] = None if tracker is None else (tracker, [])
            if entry is not None:
                spans[number] = [entry[1]]
        if entry is None:
            continue
        tracker, singles = entry
        position = tracker.read_position
        if acking and first == last and tracker.cursor <= first < position:
            singles.append(first)
            continue
        spans[number].append(range(max(first, tracker.cursor), min(last + 1, position)))
        if last >= position:
            unconfirmed += last + 1 - max(first, position)
    return spans, unconfirmed


#: :func:`gather_ranges_pure` compiled, when it is built.
gather_ranges_compiled: GatherRanges | None = compiled_twin(
    "broky.subscriptions._passes", "gather_ranges"
)
gather_ranges: GatherRanges = gather_ranges_compiled or gather_ranges_pure
