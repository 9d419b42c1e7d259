"""A Settle's ranges gathered per partition: clipped to what each partition
can settle, single acked offsets gathered plainly, other kinds in frame order;
the compiled twin (``broky.subscriptions._passes``) gathers exactly as the
pure version."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broky.protocol.constants import SettleKind
from broky.protocol.frames import Settle
from broky.subscriptions import settle_ranges
from broky.subscriptions.settle_ranges import gather_ranges
from broky.subscriptions.tracker import AckTracker, SubscriptionImage


def _tracker(cursor: int, read_position: int) -> AckTracker:
    tracker = AckTracker(SubscriptionImage(cursor), ack_timeout=30.0)
    tracker.read_position = read_position
    return tracker


def _frame(kind: SettleKind, ranges: list[tuple[int, int, int]]) -> Settle:
    return Settle(
        stream=1,
        kind=kind,
        partitions=tuple(partition for partition, _, _ in ranges),
        first_offsets=tuple(first for _, first, _ in ranges),
        last_offsets=tuple(last for _, _, last in ranges),
    )


def test_acks_of_one_offset_are_gathered_plainly_and_ranges_clipped() -> None:
    trackers = {0: _tracker(10, 20), 1: _tracker(0, 5)}
    looked_up: list[int] = []

    def tracker_of(number: int) -> AckTracker | None:
        looked_up.append(number)
        return trackers.get(number)

    frame = _frame(
        SettleKind.ACK,
        [(0, 12, 12), (0, 5, 11), (1, 3, 3), (2, 7, 7), (0, 15, 15), (0, 18, 23), (1, 9, 9)],
    )
    spans, unconfirmed = gather_ranges(frame, tracker_of)
    assert looked_up == [0, 1, 2]  # once per partition
    assert [list(offsets) for offsets in spans[0]] == [[12, 15], [10, 11], [18, 19]]
    assert [list(offsets) for offsets in spans[1]] == [[3], []]
    assert 2 not in spans
    assert unconfirmed == 4 + 1  # 20..23 of partition 0, 9 of partition 1


def test_nacks_keep_the_frames_order() -> None:
    frame = _frame(SettleKind.NACK, [(0, 14, 14), (0, 11, 12), (0, 13, 13)])
    spans, unconfirmed = gather_ranges(frame, lambda number: _tracker(10, 20))
    assert [offset for offsets in spans[0] for offset in offsets] == [14, 11, 12, 13]
    assert unconfirmed == 0


@given(
    cursor=st.integers(0, 30),
    read=st.integers(0, 30),
    ranges=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5)), max_size=20),
    kind=st.sampled_from(list(SettleKind)),
)
def test_every_settleable_offset_once_per_range(
    cursor: int, read: int, ranges: list[tuple[int, int]], kind: SettleKind
) -> None:
    """Whatever the ranges, the offsets gathered are exactly those of each
    range inside [cursor, read position), and the unconfirmed count is the
    offsets at or above the read position."""
    position = max(cursor, read)
    frame = _frame(kind, [(0, first, first + length) for first, length in ranges])
    spans, unconfirmed = gather_ranges(frame, lambda number: _tracker(cursor, position))
    gathered = sorted(offset for offsets in spans.get(0, []) for offset in offsets)
    expected = sorted(
        offset
        for first, length in ranges
        for offset in range(first, first + length + 1)
        if cursor <= offset < position
    )
    assert gathered == expected
    assert unconfirmed == sum(
        1 for first, length in ranges for offset in range(max(first, position), first + length + 1)
    )


@given(
    trackers=st.dictionaries(
        st.integers(0, 3), st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=3
    ),
    ranges=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 40), st.integers(0, 5)), max_size=30
    ),
    kind=st.sampled_from(list(SettleKind)),
)
def test_the_compiled_twin_gathers_as_the_pure_one(
    trackers: dict[int, tuple[int, int]],
    ranges: list[tuple[int, int, int]],
    kind: SettleKind,
) -> None:
    """Any partitions (some not the consumer's), in any order, any ranges."""
    compiled = settle_ranges.gather_ranges_compiled
    if compiled is None:
        pytest.skip("the compiled twin is not in use (BROKY_PURE=1)")
    frame = _frame(kind, [(number, first, first + length) for number, first, length in ranges])
    made = {
        number: _tracker(cursor, max(cursor, read)) for number, (cursor, read) in trackers.items()
    }
    looked_up: list[list[int]] = [[], []]
    answers = []
    for calls, gather in zip(looked_up, (settle_ranges.gather_ranges_pure, compiled), strict=True):

        def tracker_of(number: int, calls: list[int] = calls) -> AckTracker | None:
            calls.append(number)
            return made.get(number)

        spans, unconfirmed = gather(frame, tracker_of)
        answers.append(({n: [list(o) for o in s] for n, s in spans.items()}, unconfirmed))
    assert answers[0] == answers[1]
    assert looked_up[0] == looked_up[1]


def test_the_compiled_twin_counts_offsets_past_int64_as_unconfirmed() -> None:
    compiled = settle_ranges.gather_ranges_compiled
    if compiled is None:
        pytest.skip("the compiled twin is not in use (BROKY_PURE=1)")
    top = 2**63 - 1
    frame = _frame(SettleKind.ACK, [(0, top - 1, top)])
    pure = settle_ranges.gather_ranges_pure(frame, lambda number: _tracker(0, 5))
    assert compiled(frame, lambda number: _tracker(0, 5)) == pure
    assert pure[1] == 2
