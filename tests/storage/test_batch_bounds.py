"""The rule that cuts an append's runs into record batches (broky.storage.batch_bounds)."""

from __future__ import annotations

from itertools import accumulate

from hypothesis import given
from hypothesis import strategies as st

from broky.storage.batch_bounds import BATCH_OVERHEAD, BATCH_TARGET_BYTES, batch_bounds

SEGMENT = 1024 * 1024


def test_small_runs_share_one_batch() -> None:
    ends = list(accumulate([200] * 10))
    assert batch_bounds(ends, 0, SEGMENT) == [(0, 10)]


def test_a_batch_closes_at_the_target() -> None:
    run = 64 * 1024
    ends = list(accumulate([run] * 8))
    bounds = batch_bounds(ends, 0, SEGMENT)
    assert bounds == [(0, 3), (3, 6), (6, 8)]  # 4 runs + overhead exceed 256 KiB


def test_a_run_too_big_for_the_target_gets_a_batch_of_its_own() -> None:
    ends = list(accumulate([100, BATCH_TARGET_BYTES * 2, 100]))
    assert batch_bounds(ends, 0, SEGMENT) == [(0, 1), (1, 2), (2, 3)]


def test_a_run_that_no_longer_fits_the_segment_starts_the_next() -> None:
    ends = [100_000]
    # 1,000 bytes left in the active segment: the run goes alone, and the
    # segment it lands in (after the roll) had room.
    assert batch_bounds(ends, SEGMENT - 1_000, SEGMENT) == [(0, 1)]


@given(
    sizes=st.lists(st.integers(8, 300_000), min_size=0, max_size=60),
    filled=st.integers(0, SEGMENT),
)
def test_batches_cover_every_run_in_order_and_respect_the_target(
    sizes: list[int], filled: int
) -> None:
    ends = list(accumulate(sizes))
    bounds = batch_bounds(ends, filled, SEGMENT)
    covered = [index for start, stop in bounds for index in range(start, stop)]
    assert covered == list(range(len(sizes)))
    for start, stop in bounds:
        assert stop > start
        if stop - start > 1:
            assert sum(sizes[start:stop]) + BATCH_OVERHEAD <= BATCH_TARGET_BYTES
