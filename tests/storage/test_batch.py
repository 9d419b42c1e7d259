"""The on-disk batch format: the layout docs/storage.md promises, and its checks."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from broky.protocol.frames import Run
from broky.protocol.message import decode_run
from broky.storage.batch import BATCH_HEADER_BYTES, BATCH_MAGIC, encode_batch
from broky.storage.batch_reading import decode_batch, verify_batch
from broky.storage.errors import CorruptRecordError, StorageError
from tests.storage.runs import make_run


def test_layout_matches_the_documented_bytes() -> None:
    run = make_run(b"a.b", [b"hi", b"there"], ts_broker=7)
    data = encode_batch(100, 123456789, run)
    length, crc, magic, flags, key_length, count, messages_length = struct.unpack_from(
        "<II4sHHII", data
    )
    base_offset, ts_broker, log_time = struct.unpack_from("<qqq", data, 24)
    assert (length, magic, flags, key_length, count) == (len(data), BATCH_MAGIC, 0, 3, 2)
    assert (base_offset, ts_broker, log_time) == (100, 7, 123456789)
    assert crc == crc32c(data[8:])
    assert length % 8 == 0
    key_at = BATCH_HEADER_BYTES
    assert data[key_at : key_at + 3] == b"a.b"
    sizes_at = key_at + 8  # the key padded to 8
    assert data[sizes_at : sizes_at + 8] == bytes(run.sizes)
    messages_at = sizes_at + 8
    assert messages_at % 8 == 0, "messages start 8-aligned, as on the wire"
    assert data[messages_at : messages_at + messages_length] == bytes(run.messages)


def test_round_trip_gives_the_wire_run_back() -> None:
    run = make_run(b"orders.eu", [b"x" * n for n in range(1, 40)], ts_broker=42)
    (batch,) = decode_batch(encode_batch(5, 9, run), 0).runs()
    assert (batch.base_offset, batch.count, batch.key, batch.ts_broker, batch.log_time) == (
        5,
        39,
        b"orders.eu",
        42,
        9,
    )
    assert bytes(batch.sizes) == bytes(run.sizes)
    assert bytes(batch.messages) == bytes(run.messages)
    assert [m.payload for m in decode_run(batch.run)] == [b"x" * n for n in range(1, 40)]
    assert [offset for offset, _ in batch.records()] == list(range(5, 44))


def test_slice_keeps_exact_offsets() -> None:
    (batch,) = decode_batch(
        encode_batch(10, 0, make_run(b"k", [b"a", b"bb", b"ccc", b"dddd"])), 0
    ).runs()
    part = batch.slice(11, 13)
    assert (part.base_offset, part.count) == (11, 2)
    assert [m.payload for m in decode_run(part.run)] == [b"bb", b"ccc"]
    assert batch.slice(0, 100) is batch


def test_every_single_bit_flip_is_detected() -> None:
    data = encode_batch(3, 4, make_run(b"k.x", [b"payload", b"more"]))
    for bit in range(len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        assert isinstance(verify_batch(damaged, 0), str), f"bit {bit} went unnoticed"
        with pytest.raises(CorruptRecordError):
            decode_batch(damaged, 0, "seg.log", 0)


def test_every_truncation_is_detected() -> None:
    data = encode_batch(0, 0, make_run(b"k", [b"payload"]))
    for cut in range(len(data)):
        assert isinstance(verify_batch(data[:cut], 0), str)


@pytest.mark.parametrize(
    "run",
    [
        Run(b"k", 0, 0, b"", b""),
        Run(b"k", 0, 1, struct.pack("<I", 8), b"\0" * 16),
        Run(b"k" * 70000, 0, 1, struct.pack("<I", 8), b"\0" * 8),
    ],
    ids=["empty", "sizes-disagree", "key-too-long"],
)
def test_runs_the_format_cannot_hold_are_refused(run: Run) -> None:
    with pytest.raises(StorageError):
        encode_batch(0, 0, run)
