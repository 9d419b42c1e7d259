"""Topic policies and partitioning, the state store, and the offline reader."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from broky.protocol.constants import UID_BYTES
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import Run
from broky.protocol.message import decode_run, encode_message, pack_sizes
from broky.storage.errors import CorruptRecordError, StorageError
from broky.storage.log import PartitionLog
from broky.storage.reader import iter_batches, iter_records, list_partitions
from broky.storage.state import PartitionCursor, StateStore
from broky.storage.topics import (
    TopicPolicies,
    TopicPolicy,
    partition_for,
    partition_run,
    sticky_keys,
)
from tests.storage.runs import make_run


def test_first_declared_matching_policy_wins() -> None:
    policies = TopicPolicies(
        [
            TopicPolicy(name="eu-orders", pattern=b"orders.eu.>", partitions=2),
            TopicPolicy(name="orders", pattern=b"orders.>"),
            TopicPolicy(name="system", pattern=b"$SYS.>"),
        ]
    )
    assert policies.match(b"orders.eu.created").name == "eu-orders"  # type: ignore[union-attr]
    assert policies.match(b"orders.us.created").name == "orders"  # type: ignore[union-attr]
    assert policies.match(b"$SYS.load").name == "system"  # type: ignore[union-attr]
    assert policies.match(b"metrics.cpu") is None, "no rule: stays ephemeral"
    with pytest.raises(RemoteProtocolError):
        policies.match(b"bad..key")


@pytest.mark.parametrize(
    "settings",
    [
        {"name": "../x", "pattern": b"a"},
        {"name": "ok", "pattern": b"a.>.b"},
        {"name": "ok", "pattern": b"a", "partitions": 0},
    ],
)
def test_bad_policies_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises((StorageError, RemoteProtocolError)):
        TopicPolicy(**settings)  # type: ignore[arg-type]


def test_duplicate_topic_names_are_refused() -> None:
    with pytest.raises(StorageError):
        TopicPolicies([TopicPolicy(name="t", pattern=b"a"), TopicPolicy(name="t", pattern=b"b")])


def test_partition_is_xxh3_of_key_partition_modulo_partitions() -> None:
    assert partition_for(b"customer-7", 12) == xxhash.xxh3_64_intdigest(b"customer-7") % 12


def test_partition_run_splits_by_key_partition_and_keeps_order() -> None:
    kps = [b"p%d" % (i % 3) for i in range(9)]
    run = make_run(b"orders.x", [b"m%d" % i for i in range(9)], key_partitions=kps)
    assert partition_run(run, 1) == [(0, run)]
    pieces = partition_run(run, 4)
    payloads = [m.payload for _, piece in pieces for m in decode_run(piece)]
    assert payloads == [b"m%d" % i for i in range(9)]
    for partition, piece in pieces:
        for message in decode_run(piece):
            assert partition == partition_for(message.key_partition, 4)
    same = make_run(b"k", [b"a", b"b"])  # no key_partition: the run key decides
    assert partition_run(same, 4) == [(partition_for(b"k", 4), same)]


def test_partition_run_reads_key_partition_from_any_layout() -> None:
    """The quick "has it a key_partition?" check agrees with a full decode for
    messages with and without the field, uids and tags, in one run."""
    rng = random.Random(3)
    messages, expected = [], []
    for index in range(300):
        kp = rng.choice([b"", b"a", b"customer-%d" % index])
        uid = bytes(20) if rng.random() < 0.3 else b""
        tags = [("t", "v")] if rng.random() < 0.3 else []
        messages.append(encode_message(b"m%d" % index, kp, 0, uid, tags))
        expected.append(partition_for(kp or b"k.x", 5))
    run = Run(b"k.x", 0, len(messages), pack_sizes([len(m) for m in messages]), b"".join(messages))
    got = [partition for partition, piece in partition_run(run, 5) for _ in range(piece.count)]
    assert got == expected


def test_state_store_saves_atomically_and_reloads(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    store = StateStore.open(path)
    store.save("sub-a", [PartitionCursor("orders", 0, 10, ((12, 14), (20, 20)))])
    store.save("sub-a", [PartitionCursor("orders", 1, 3)])

    def fail_mid_transaction() -> None:
        with store.transaction() as transaction:
            transaction.save("sub-a", PartitionCursor("orders", 0, 99))
            raise RuntimeError("crash mid-transaction")

    with pytest.raises(RuntimeError):
        fail_mid_transaction()
    store.close()
    store = StateStore.open(path)
    assert store.load("sub-a") == [
        PartitionCursor("orders", 0, 10, ((12, 14), (20, 20))),
        PartitionCursor("orders", 1, 3),
    ]
    assert store.subscriptions() == ["sub-a"]
    with store.transaction() as transaction:
        transaction.delete("sub-a")
    assert store.load("sub-a") == []
    store.close()


def test_offline_reader_sees_every_record_and_stops_at_a_write_in_progress(
    tmp_path: Path,
) -> None:
    for partition in range(2):
        with PartitionLog.open(str(tmp_path / "orders" / str(partition))) as log:
            log.append([make_run(b"o.%d" % partition, [b"a", b"b"])])
    (tmp_path / "orders" / "not-a-partition").mkdir()
    assert [(f.topic, f.partition) for f in list_partitions(str(tmp_path))] == [
        ("orders", 0),
        ("orders", 1),
    ]
    records = list(iter_records(str(tmp_path)))
    assert [(r.partition, r.offset, r.key) for r in records] == [
        (0, 0, b"o.0"),
        (0, 1, b"o.0"),
        (1, 0, b"o.1"),
        (1, 1, b"o.1"),
    ]
    files = list_partitions(str(tmp_path))[0]
    segment = os.path.join(files.directory, f"{0:020d}.log")
    with open(segment, "ab") as file:
        file.write(b"\x40\x00\x00\x00 half a batch")
    assert [b.base_offset for b in iter_batches(files, from_offset=1)] == [1]


def test_offline_reader_raises_on_damage_in_a_sealed_segment(tmp_path: Path) -> None:
    directory = tmp_path / "t" / "0"
    with PartitionLog.open(str(directory)) as log:
        log.append([make_run(b"k", [b"1"])])
        log.roll()
        log.append([make_run(b"k", [b"2"])])
    first = directory / f"{0:020d}.log"
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError):
        list(iter_batches(list_partitions(str(tmp_path))[0]))


@given(
    st.lists(
        st.tuples(st.binary(max_size=12), st.booleans(), st.binary(max_size=20)),
        min_size=1,
        max_size=6,
    )
)
def test_sticky_keys_are_each_message_key_partition_or_the_run_key(
    messages: list[tuple[bytes, bool, bytes]],
) -> None:
    """What a key-shared slot follows: read with one look per message
    without a key_partition, the same as the full field read."""
    blobs = [
        encode_message(payload, key_partition=partition_key, uid=b"u" * UID_BYTES if uid else b"")
        for partition_key, uid, payload in messages
    ]
    sizes = pack_sizes([len(blob) for blob in blobs])
    got = sticky_keys(b"orders.eu", sizes, b"".join(blobs))
    assert got == [partition_key or b"orders.eu" for partition_key, _, _ in messages]
