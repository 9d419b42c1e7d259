"""Which oldest segments retention deletes (broky.storage.retention)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broky.storage.retention import expired_prefix


def test_nothing_goes_without_a_limit() -> None:
    assert expired_prefix([10, 10, 10], [1, 2, 3], 100, None, None) == 0


def test_by_age_the_old_prefix_goes_but_never_the_active_segment() -> None:
    assert expired_prefix([10, 10, 10], [1, 2, 3], 100, 50, None) == 2


def test_by_bytes_the_oldest_go_until_the_rest_fits() -> None:
    assert expired_prefix([10, 20, 30, 5], [0, 0, 0, 0], 0, None, 40) == 2


def test_deletion_stops_at_the_first_segment_kept() -> None:
    # The second segment is young: the third, though old, stays (contiguous log).
    assert expired_prefix([10, 10, 10, 10], [1, 90, 1, 95], 100, 50, None) == 1


@given(
    segments=st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 100)), min_size=1),
    age=st.none() | st.integers(0, 100),
    limit=st.none() | st.integers(0, 5000),
)
def test_the_prefix_is_exactly_what_the_rules_remove(
    segments: list[tuple[int, int]], age: int | None, limit: int | None
) -> None:
    sizes = [size for size, _ in segments]
    times = [time for _, time in segments]
    now = 100
    deleted = expired_prefix(sizes, times, now, age, limit)
    assert 0 <= deleted <= len(segments) - 1

    def removable(index: int) -> bool:
        expired = age is not None and times[index] < now - age
        return expired or (limit is not None and sum(sizes[index:]) > limit)

    assert all(removable(index) for index in range(deleted))
    if deleted < len(segments) - 1:
        assert not removable(deleted)
