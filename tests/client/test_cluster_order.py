"""ClusterPublisher's rule for sending a batch while earlier ones of the
same partition are unresolved (``_may_send``), across producer ids.

A give-up starts a new producer id; a partition holds back only the
producer whose run it refused (``SequenceGap``), so a batch of the new id
queued behind a refused batch of the old one could be stored first, and
the old one, accepted later by a leader that never held it back, after it:
both acked, out of call order (one netns Jepsen run showed one such
message). Without the producer check the second assertion of the first
test fails.
"""

from __future__ import annotations

from typing import Any

from broky.client.cluster import ClusterPublisher, _Batch, _Extras

X: Any = object()  # a connection (only its identity matters here)
Y: Any = object()


def _publisher(*batches: _Batch) -> ClusterPublisher:
    publisher = ClusterPublisher(None, ["127.0.0.1:1"], 1.0, "t")  # type: ignore[arg-type]
    publisher._batches.extend(batches)
    return publisher


def _batch(order: int, producer: int, client: Any = None, key: str = "orders.k") -> _Batch:
    batch = _Batch(order, key, [b"m"], _Extras(b"", (), b""), producer, order)
    batch.client = client
    return batch


def test_a_new_producers_batch_waits_for_the_old_producers_earlier_ones() -> None:
    old = _batch(1, producer=7, client=X)
    new = _batch(2, producer=8)
    publisher = _publisher(old, new)
    # The same producer may queue behind it on its connection (the partition
    # holds the later run back if it refuses the earlier one).
    assert publisher._may_send(_batch(2, producer=7), X)
    # Another producer may not, even on that connection.
    assert not publisher._may_send(new, X)
    assert not publisher._may_send(new, Y)
    # Acked or given up: the new producer's batch goes.
    publisher._batches.remove(old)
    assert publisher._may_send(new, X)


def test_batches_of_other_partitions_are_not_held_by_another_producer() -> None:
    old = _batch(1, producer=7, client=X, key="orders.a")
    new = _batch(2, producer=8, key="orders.b")
    publisher = _publisher(old, new)
    # Partitions not known yet: related, so it waits.
    assert not publisher._may_send(new, Y)
    publisher._partitions[old.route] = 0
    publisher._partitions[new.route] = 1
    assert publisher._may_send(new, Y)


def test_a_later_batch_in_flight_still_keeps_an_earlier_one_back() -> None:
    earlier = _batch(1, producer=7)
    later = _batch(2, producer=7, client=X)
    assert not _publisher(earlier, later)._may_send(earlier, X)
