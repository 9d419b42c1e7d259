"""The durable publish path's shortcuts give what the general code gives:
the durable chunk taken from a wire chunk, the split of a run by
``key_partition``, and PublishAck's packed vectors."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.chunk_reading import read_chunk_run
from broky.protocol.chunks import (
    CHUNK_TABLE_OFFSET,
    durable_chunk,
    encode_durable_run_chunk,
    encode_run_chunk,
)
from broky.protocol.codec import decode_frame, encode_frame, read_bytes, table_fields
from broky.protocol.errors import RemoteProtocolError
from broky.protocol.frames import PublishAck, Run
from broky.protocol.message import decode_run, encode_message, pack_sizes
from broky.storage.topics import key_partition, partition_for, partition_run

messages = st.lists(
    st.tuples(st.binary(max_size=40), st.sampled_from([b"", b"a", b"b", b"c", b"dd"])),
    min_size=1,
    max_size=8,
)


def wire_run(key: bytes, ts_broker: int, specs: list[tuple[bytes, bytes]]) -> Run:
    """A run as the broker decodes it from a Publish frame (with its chunk)."""
    encoded = [encode_message(payload, key_partition=kp) for payload, kp in specs]
    chunk = encode_run_chunk(
        key, ts_broker, pack_sizes([len(m) for m in encoded]), b"".join(encoded)
    )
    run = read_chunk_run(memoryview(chunk), CHUNK_TABLE_OFFSET)
    assert run is not None
    assert run.chunk is not None
    return run


@settings(max_examples=80, deadline=None)
@given(
    key=st.binary(min_size=1, max_size=40),
    ts_broker=st.integers(0, 2**62),
    specs=messages,
    stamp=st.integers(1, 2**62),
    partition=st.integers(0, 1023),
    base_offset=st.integers(0, 2**50),
)
def test_a_durable_chunk_from_a_wire_chunk_is_the_encoded_one(
    key: bytes,
    ts_broker: int,
    specs: list[tuple[bytes, bytes]],
    stamp: int,
    partition: int,
    base_offset: int,
) -> None:
    run = wire_run(key, ts_broker, specs)
    expected = encode_durable_run_chunk(
        Run(run.key, stamp, run.count, run.sizes, run.messages, partition, base_offset)
    )
    assert durable_chunk(run, stamp, partition, base_offset) == expected
    plain = Run(run.key, run.ts_broker, run.count, bytes(run.sizes), bytes(run.messages))
    assert durable_chunk(plain, stamp, partition, base_offset) == expected


@settings(max_examples=80, deadline=None)
@given(specs=messages, partitions=st.integers(1, 8))
def test_a_split_keeps_every_message_once_in_order_by_consecutive_partition(
    specs: list[tuple[bytes, bytes]], partitions: int
) -> None:
    run = wire_run(b"orders.k", 0, specs)
    pieces = partition_run(run, partitions)
    expected = [
        partition_for(kp or b"orders.k", partitions) if partitions > 1 else 0 for _, kp in specs
    ]
    got = [(partition, m.payload) for partition, part in pieces for m in decode_run(part)]
    assert got == [(p, payload) for p, (payload, _) in zip(expected, specs, strict=True)]
    assert all(a[0] != b[0] for a, b in itertools.pairwise(pieces)), "parts are maximal"
    for _, part in pieces:
        assert part.key == run.key
        assert len(part.sizes) == 4 * part.count


def test_key_partition_reads_the_field() -> None:
    assert key_partition(memoryview(encode_message(b"x", key_partition=b"abc"))) == b"abc"
    assert key_partition(memoryview(encode_message(b"x"))) == b""


@settings(max_examples=30, deadline=None)
@given(
    entries=st.lists(
        st.tuples(
            st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(-(2**63), 2**63 - 1)
        ),
        max_size=300,
    )
)
def test_a_long_publish_ack_round_trips(entries: list[tuple[int, int, int]]) -> None:
    ack = PublishAck(
        stream=7,
        sequence=3,
        runs=tuple(e[0] for e in entries),
        partitions=tuple(e[1] for e in entries),
        first_offsets=tuple(e[2] for e in entries),
        last_offsets=tuple(-e[2] - 1 for e in entries),
    )
    assert decode_frame(memoryview(encode_frame(ack))[4:]) == ack


def walked_key_partition(message: memoryview) -> bytes:
    """The validated table walk alone (what key_partition must agree with)."""
    (field,) = table_fields(message, int.from_bytes(message[:4], "little"), 1)
    return read_bytes(message, field)


@settings(max_examples=300, deadline=None)
@given(
    payload=st.binary(max_size=20),
    partition_key=st.binary(max_size=12),
    flips=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=3),
    cut=st.integers(0, 200),
)
def test_key_partition_agrees_with_the_validated_walk_on_any_bytes(
    payload: bytes, partition_key: bytes, flips: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(encode_message(payload, key_partition=partition_key, uid=b"u" * 20))
    for position, value in flips:
        if position < len(data):
            data[position] = value
    message = memoryview(bytes(data[: max(cut, 4)] if cut < len(data) else data))
    try:
        expected: bytes | type[Exception] = walked_key_partition(message)
    except RemoteProtocolError:
        expected = RemoteProtocolError
    if expected is RemoteProtocolError:
        with pytest.raises(RemoteProtocolError):
            key_partition(message)
    else:
        assert key_partition(message) == expected
