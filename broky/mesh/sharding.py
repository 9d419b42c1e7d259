"""Ownership by ``key_partition``: which router owns a partition.

Ephemeral messages are matched where they enter (the ingress router) and go
one hop to every router with interest: nothing is owned, because nothing
needs a single point of order beyond "per publisher". Ownership matters for
durable topics, where each partition has one appender: the partition is
``xxh3_64(key_partition) % partitions``, and its owner worker is chosen by
``broky.durable.ownership.partition_owner``, so every worker (and, with
replication, every node) agrees without coordination, and the same key
always lands on the same partition.
"""

from __future__ import annotations

import xxhash


def partition_of(key_partition: bytes, partitions: int) -> int:
    """The partition a message's ``key_partition`` maps to (stable across
    processes, versions and machines: xxh3 has no per-process seed)."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return xxhash.xxh3_64_intdigest(key_partition) % partitions
