"""Partition ownership among workers, the per-partition lock, and the
supervisor's hand-over of durable policies to its workers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import trio

from broky.durable.config import parse_policy, policy_table
from broky.durable.ownership import PartitionLock, partition_owner
from broky.durable.store import DurableStore
from broky.router.router import Router
from broky.storage.errors import StorageError
from broky.storage.topics import TopicPolicy


def test_consecutive_partitions_go_to_consecutive_workers() -> None:
    owners = [partition_owner("orders", partition, 3) for partition in range(6)]
    assert owners == [(owners[0] + partition) % 3 for partition in range(6)]
    assert all(partition_owner("orders", partition, 1) == 0 for partition in range(6))


def test_single_partition_topics_spread_over_the_workers() -> None:
    counts = Counter(partition_owner(f"topic{n}", 0, 3) for n in range(100))
    assert set(counts) == {0, 1, 2}
    assert max(counts.values()) / min(counts.values()) <= 1.5


def test_a_partition_directory_has_one_owner(tmp_path: Path) -> None:
    lock = PartitionLock(str(tmp_path / "orders" / "0"))
    with pytest.raises(StorageError, match="locked by another process"):
        PartitionLock(str(tmp_path / "orders" / "0"))
    lock.release()
    PartitionLock(str(tmp_path / "orders" / "0")).release()


async def test_a_worker_opens_only_the_partitions_it_owns(tmp_path: Path) -> None:
    policy = TopicPolicy(name="orders", pattern=b"orders.>", partitions=8)
    stores = [
        DurableStore(str(tmp_path), [policy], Router(), worker=index, workers=3)
        for index in range(3)
    ]
    async with trio.open_nursery() as nursery:
        for store in stores:
            await nursery.start(store.run)
        # (Each store also has the built-in dead-letter topic, _dlq.)
        owned = [
            sorted(partition for topic, partition in store.owners if topic == "orders")
            for store in stores
        ]
        assert sorted(p for partitions in owned for p in partitions) == list(range(8))
        for index, partitions in enumerate(owned):
            assert all(partition_owner("orders", p, 3) == index for p in partitions)
        # A second process for worker 0 (a restart racing the old one) is refused.
        with pytest.raises(StorageError, match="locked"):
            DurableStore(str(tmp_path), [policy], Router(), worker=0, workers=3).open()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "table",
    [
        {"pattern": "a.>", "partitions": 3, "roll": "daily 01:30 -02:15", "fsync": "interval"},
        {"pattern": "b.*", "roll": 7.5, "retention_bytes": 1000, "retention_seconds": 60},
        {"name": "c", "pattern": "c", "segment_bytes": 65536, "fsync": "never"},
    ],
)
def test_policies_reach_the_workers_unchanged(table: dict[str, object]) -> None:
    policy = parse_policy(table, 0)
    assert parse_policy(policy_table(policy), 0) == policy
