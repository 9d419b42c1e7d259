"""Partition and owner choice: stable, spread and within range."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broky.durable.ownership import partition_owner
from broky.mesh.sharding import partition_of


def test_known_values_are_stable() -> None:
    # Pinned: a change here would move every durable key to another partition.
    assert partition_of(b"", 16) == 0x2D06800538D394C2 % 16
    assert partition_of(b"customer-42", 1) == 0


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=1024))
def test_partition_is_in_range_and_deterministic(key: bytes, partitions: int) -> None:
    partition = partition_of(key, partitions)
    assert 0 <= partition < partitions
    assert partition_of(key, partitions) == partition


def test_keys_spread_evenly() -> None:
    counts = Counter(partition_of(b"user-%d" % number, 8) for number in range(80_000))
    assert len(counts) == 8
    assert max(counts.values()) < 1.1 * min(counts.values())


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_every_worker_owns_partitions(workers: int) -> None:
    owners = Counter(partition_owner("orders", partition, workers) for partition in range(64))
    assert set(owners) == set(range(workers))


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="partitions"):
        partition_of(b"k", 0)
    with pytest.raises(ValueError, match="workers"):
        partition_owner("orders", 0, 0)
