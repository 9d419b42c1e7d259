"""Format version 2: many runs per batch, and logs of version 1 still read.

The invariant: whatever runs are appended, reading back gives every run's
key, ``ts_broker`` and messages, per key in order, with dense offsets,
whichever reader is used (the log's budgeted reads, the offline reader)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from broky.protocol.chunks import encode_durable_run_chunk
from broky.protocol.frames import Run
from broky.protocol.message import decode_run
from broky.storage.batch import (
    BATCH_HEADER_BYTES,
    BATCH_MAGIC_V2,
    RUN_ENTRY_BYTES,
    encode_batch,
    encode_runs,
)
from broky.storage.batch_reading import decode_batch, verify_batch
from broky.storage.config import LogConfig
from broky.storage.errors import CorruptRecordError, StorageError
from broky.storage.log import PartitionLog
from broky.storage.reader import iter_batches, partition_files
from broky.storage.segment import LOG_SUFFIX, segment_stem
from tests.storage.runs import flatten, make_run, read_all

KEYS = [b"k%d" % n for n in range(40)] + [b"orders.eu.long-key-name", b"x"]
#: (key, ts_broker, payloads) of one run.
run_specs = st.tuples(
    st.sampled_from(KEYS),
    st.integers(0, 2**62),
    st.lists(st.binary(max_size=30), min_size=1, max_size=4),
)


def payloads_of(run: Run) -> list[bytes]:
    return [message.payload for message in decode_run(run)]


def test_layout_matches_the_documented_bytes() -> None:
    runs = [make_run(b"a.b", [b"hi", b"there"], ts_broker=7), make_run(b"cde", [b"x"], 9)]
    data = encode_runs(100, 123456789, runs)
    length, crc, magic, flags, reserved, count, messages_length = struct.unpack_from(
        "<II4sHHII", data
    )
    base_offset, run_count, keys_length, log_time = struct.unpack_from("<qIIq", data, 24)
    assert (length, magic, flags, reserved, count) == (len(data), BATCH_MAGIC_V2, 0, 0, 3)
    assert (base_offset, run_count, keys_length, log_time) == (100, 2, 6, 123456789)
    assert crc == crc32c(data[8:])
    assert length % 8 == 0
    table = struct.unpack_from("<2q4I", data, BATCH_HEADER_BYTES)
    assert table == (7, 9, 2, 1, 3, 3), "ts_broker, count, key_length columns"
    keys_at = BATCH_HEADER_BYTES + 2 * RUN_ENTRY_BYTES
    assert data[keys_at : keys_at + 6] == b"a.bcde"
    sizes_at = keys_at + 8  # the keys padded to 8
    assert data[sizes_at : sizes_at + 12] == bytes(runs[0].sizes) + bytes(runs[1].sizes)
    messages_at = sizes_at + 16
    assert messages_at % 8 == 0, "messages start 8-aligned, as on the wire"
    assert data[messages_at : messages_at + messages_length] == bytes(runs[0].messages) + bytes(
        runs[1].messages
    )


@settings(max_examples=60, deadline=None)
@given(specs=st.lists(run_specs, min_size=1, max_size=12), base=st.integers(0, 2**40))
def test_a_batch_gives_back_every_run_in_order(
    specs: list[tuple[bytes, int, list[bytes]]], base: int
) -> None:
    runs = [make_run(key, payloads, ts) for key, ts, payloads in specs]
    batch = decode_batch(encode_runs(base, 5, runs), 0)
    back = list(batch.runs())
    assert [(r.key, r.ts_broker, r.count) for r in back] == [
        (r.key, r.ts_broker, r.count) for r in runs
    ]
    assert [payloads_of(r.run) for r in back] == [payloads for _, _, payloads in specs]
    for stored in back:  # a read budget admits no more than a frame can carry
        located = Run(stored.key, 1, stored.count, stored.sizes, stored.messages, 1023, base)
        assert len(encode_durable_run_chunk(located)) <= stored.stored_bytes
    offsets = [offset for r in back for offset, _ in r.records()]
    assert offsets == list(range(base, base + sum(r.count for r in runs))), "dense offsets"
    # Any window of offsets gives exactly those messages.
    total = len(offsets)
    start, stop = base + total // 3, base + total - total // 4
    window = [offset for r in batch.runs(start, stop) for offset, _ in r.records()]
    assert window == list(range(start, stop))


def test_stamps_replace_the_runs_ts_broker() -> None:
    runs = [make_run(b"a", [b"1"], 1), make_run(b"b", [b"2"], 2)]
    batch = decode_batch(encode_runs(0, 0, runs, [10, 20]), 0)
    assert [run.ts_broker for run in batch.runs()] == [10, 20]


def test_every_single_bit_flip_is_detected() -> None:
    data = encode_runs(3, 4, [make_run(b"k.x", [b"payload", b"more"]), make_run(b"y", [b"z"])])
    for bit in range(len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        assert isinstance(verify_batch(damaged, 0), str), f"bit {bit} went unnoticed"
        with pytest.raises(CorruptRecordError):
            decode_batch(damaged, 0, "seg.log", 0)


def test_every_truncation_is_detected() -> None:
    data = encode_runs(0, 0, [make_run(b"k", [b"payload"]), make_run(b"j", [b"p"])])
    for cut in range(len(data)):
        assert isinstance(verify_batch(data[:cut], 0), str)


def test_sizes_that_only_add_up_across_runs_are_refused() -> None:
    """Two runs whose size tables are each wrong by the same amount in
    opposite directions: the batch totals agree, the runs do not."""
    first, second = make_run(b"a", [b"aaaa"]), make_run(b"b", [b"bbbb"])
    (size,) = struct.unpack("<I", first.sizes)
    bad = [
        Run(b"a", 0, 1, struct.pack("<I", size + 8), first.messages),
        Run(b"b", 0, 1, struct.pack("<I", size - 8), second.messages),
    ]
    with pytest.raises(StorageError):
        encode_runs(0, 0, bad)
    long_runs = [make_run(b"a", [b"x"] * 20), make_run(b"b", [b"y"] * 20)]
    shifted = [
        Run(b"a", 0, 20, long_runs[0].sizes, bytes(long_runs[0].messages) + b"\0" * 8),
        Run(b"b", 0, 20, long_runs[1].sizes, bytes(long_runs[1].messages)[8:]),
    ]
    encode_runs(0, 0, long_runs)
    with pytest.raises(StorageError):
        encode_runs(0, 0, shifted)  # long runs take the per-run check
    with pytest.raises(StorageError):
        encode_runs(0, 0, [])
    with pytest.raises(StorageError):
        encode_runs(0, 0, [make_run(b"a", [b"1"]), Run(b"k", 0, 0, b"", b"")])


def write_v1_segment(directory: Path, runs: list[Run]) -> None:
    """A segment as a broker before format 2 left it: one batch per run, no index."""
    directory.mkdir(parents=True)
    data = []
    offset = 0
    for run in runs:
        data.append(encode_batch(offset, 1_000 + offset, run))
        offset += run.count
    (directory / (segment_stem(0) + LOG_SUFFIX)).write_bytes(b"".join(data))


def test_a_log_written_in_format_1_stays_readable_and_appendable(tmp_path: Path) -> None:
    old = [make_run(b"k%d" % (n % 3), [b"old%d" % n] * (n % 2 + 1)) for n in range(6)]
    write_v1_segment(tmp_path / "p", old)
    with PartitionLog.open(str(tmp_path / "p"), LogConfig(segment_bytes=600)) as log:
        assert log.end_offset == 9
        log.append([make_run(b"k%d" % n, [b"new%d" % n]) for n in range(20)])
        expected = [
            *((key, payload) for run in old for key, payload in zip(
                [run.key] * run.count, payloads_of(run), strict=True)),
            *((b"k%d" % n, b"new%d" % n) for n in range(20)),
        ]  # fmt: skip
        assert [(key, payload) for _, key, payload in read_all(log, max_bytes=64)] == expected
        assert log.last_offsets() == {b"k%d" % n: 9 + n for n in range(20)}
        assert len(log.segments) > 1
    files = partition_files(str(tmp_path / "p"))
    assert [(key, payload) for _, key, payload in flatten(iter_batches(files))] == expected


@settings(max_examples=25, deadline=None)
@given(
    appends=st.lists(st.lists(run_specs, min_size=1, max_size=30), min_size=1, max_size=6),
    segment_bytes=st.integers(400, 8192),
    budget=st.integers(1, 2048),
)
def test_per_key_order_and_dense_offsets_through_every_reader(
    tmp_path_factory: pytest.TempPathFactory,
    appends: list[list[tuple[bytes, int, list[bytes]]]],
    segment_bytes: int,
    budget: int,
) -> None:
    directory = tmp_path_factory.mktemp("log")
    appended: list[tuple[bytes, int, bytes]] = []
    with PartitionLog.open(str(directory), LogConfig(segment_bytes=segment_bytes)) as log:
        for specs in appends:
            runs = [make_run(key, payloads) for key, _, payloads in specs]
            stamps = [ts for _, ts, _ in specs]
            result = log.append(runs, stamps)
            assert result.first_offset == len(appended)
            appended.extend(
                (key, ts, payload) for key, ts, payloads in specs for payload in payloads
            )
        read = read_all(log, max_bytes=budget)
        assert [offset for offset, _, _ in read] == list(range(len(appended)))
        assert [(key, payload) for _, key, payload in read] == [(k, p) for k, _, p in appended]
        stamps_read = [
            batch.ts_broker for batch in log.read(0, max_bytes=1 << 30) for _ in range(batch.count)
        ]
        assert stamps_read == [ts for _, ts, _ in appended]
        last = {key: offset for offset, (key, _, _) in enumerate(appended)}
        assert log.last_offsets() == last
    # Reopened without indexes (a crash): recovery scans, the offline reader agrees.
    for name in os.listdir(directory):
        if name.endswith(".index"):
            os.unlink(directory / name)
    with PartitionLog.open(str(directory), LogConfig(segment_bytes=segment_bytes)) as log:
        assert log.end_offset == len(appended)
    files = partition_files(str(directory))
    offline = flatten(iter_batches(files))
    assert [(offset, key, payload) for offset, key, payload in offline] == [
        (offset, key, payload) for offset, (key, _, payload) in enumerate(appended)
    ]
