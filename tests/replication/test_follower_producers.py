"""A follower stores the idempotent producers of the runs it replicates, so
that it dedupes a retry once it leads (its window is rebuilt from its log)."""

from __future__ import annotations

from pathlib import Path

from broky.cluster.epochs import EpochHistory
from broky.durable.producers import Duplicate, ProducerWindow
from broky.replication.faults import LinkSwitch
from broky.replication.follower import Follower
from broky.replication.gate import PartitionReplica
from broky.replication.node_link import NodeLinks
from broky.replication.wire import ReplicatedRun
from broky.storage.log import PartitionLog
from tests.replication.test_gate import _Owner


def _replicated(base: int, count: int, producer: int, sequence: int) -> ReplicatedRun:
    sizes = b"".join((2).to_bytes(4, "little") for _ in range(count))
    return ReplicatedRun(3, base, count, b"orders.k", 7, sizes, b"mm" * count, producer, sequence)


def test_replicated_runs_keep_their_producer_in_the_follower_log(tmp_path: Path) -> None:
    replica = PartitionReplica(_Owner(), "n2", EpochHistory(), 3)  # type: ignore[arg-type]
    switch = LinkSwitch()
    follower = Follower(replica, "127.0.0.1:1", 3, 1, switch, NodeLinks(switch))
    with PartitionLog.open(str(tmp_path / "p")) as partition_log:
        follower.append(
            (_replicated(0, 2, 0xCAFE, 1), _replicated(2, 1, 0, 0), _replicated(3, 2, 0xCAFE, 9)),
            partition_log,
        )
        runs = list(partition_log.producer_runs(1 << 20))
    assert runs == [(0xCAFE, 1, 2, 0), (0xCAFE, 9, 2, 3)]
    window = ProducerWindow()
    for producer, sequence, count, offset in runs:
        window.record(producer, sequence, count, offset)
    assert window.check(0xCAFE, 9, 2) == Duplicate(3)
