"""Format version 3: version 2 plus each run's idempotent producer.

What must hold: a version 3 batch reads back exactly like version 2 (every
run's key, ts_broker and messages), its producer columns come back from a
header-only read with the right offsets, logs mixing versions 2 and 3 read
whole, and batches without a producer run stay version 2."""

from __future__ import annotations

import struct
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from broky.storage.batch import (
    BATCH_HEADER_BYTES,
    BATCH_MAGIC_V2,
    BATCH_MAGIC_V3,
    RUN_ENTRY_BYTES_V3,
    encode_runs,
)
from broky.storage.batch_reading import decode_batch, read_header
from broky.storage.log import PartitionLog
from tests.storage.runs import make_run, read_all

#: (key, payloads, producer id, sequence) of one run.
producer_runs = st.tuples(
    st.sampled_from([b"a", b"orders.eu", b"k.1"]),
    st.lists(st.binary(max_size=20), min_size=1, max_size=4),
    st.sampled_from([0, 1, 2**64 - 1]),
    st.integers(0, 2**64 - 5),
)


def test_version_3_layout() -> None:
    runs = [make_run(b"a.b", [b"hi", b"there"], ts_broker=7), make_run(b"cde", [b"x"], 9)]
    data = encode_runs(100, 5, runs, producers=[(0xABCD, 41), (0, 0)])
    assert data[8:12] == BATCH_MAGIC_V3
    table = struct.unpack_from("<2q4I4Q", data, BATCH_HEADER_BYTES)
    assert table == (7, 9, 2, 1, 3, 3, 0xABCD, 0, 41, 0)
    header = read_header(data, 0)
    assert not isinstance(header, str)
    assert header.table_bytes == 2 * RUN_ENTRY_BYTES_V3 + 6
    tail = data[BATCH_HEADER_BYTES : BATCH_HEADER_BYTES + header.table_bytes]
    assert header.producer_runs(tail) == [(0xABCD, 41, 2, 100)]
    assert header.key_last_offsets(tail) == [(b"a.b", 101), (b"cde", 102)]


@settings(max_examples=60, deadline=None)
@given(specs=st.lists(producer_runs, min_size=1, max_size=10), base=st.integers(0, 2**40))
def test_version_3_reads_back_like_version_2(
    specs: list[tuple[bytes, list[bytes], int, int]], base: int
) -> None:
    runs = [make_run(key, payloads, 3) for key, payloads, _, _ in specs]
    producers = [(producer, sequence) for _, _, producer, sequence in specs]
    v3 = decode_batch(encode_runs(base, 5, runs, producers=producers), 0)
    v2 = decode_batch(encode_runs(base, 5, runs), 0)
    assert v3.version == 3
    assert v2.version == 2
    assert [(r.base_offset, r.key, bytes(r.messages)) for r in v3.runs()] == [
        (r.base_offset, r.key, bytes(r.messages)) for r in v2.runs()
    ]
    # Reads carry each run's producer (what replication sends to followers).
    assert [(r.producer, r.sequence) for r in v3.runs()] == [
        (producer, sequence if producer else 0) for producer, sequence in producers
    ]
    assert all((r.producer, r.sequence) == (0, 0) for r in v2.runs())
    data = encode_runs(base, 5, runs, producers=producers)
    header = read_header(data, 0)
    assert not isinstance(header, str)
    found = header.producer_runs(data[BATCH_HEADER_BYTES:])
    expected = []
    offset = base
    for run, (producer, sequence) in zip(runs, producers, strict=True):
        if producer:
            expected.append((producer, sequence, run.count, offset))
        offset += run.count
    assert found == expected


def test_a_log_mixes_versions_and_finds_its_producers(tmp_path: Path) -> None:
    directory = str(tmp_path / "p")
    with PartitionLog.open(directory) as log:
        log.append([make_run(b"a", [b"1", b"2"])])
        log.append([make_run(b"a", [b"3"]), make_run(b"b", [b"4"])], producers=[(0, 0), (9, 1)])
        log.append([make_run(b"b", [b"5", b"6"])], producers=[(0, 0)])
        log.append([make_run(b"c", [b"7"])], producers=[(9, 2)])
    with PartitionLog.open(directory) as log:
        assert [payload for _, _, payload in read_all(log)] == [
            b"1",
            b"2",
            b"3",
            b"4",
            b"5",
            b"6",
            b"7",
        ]
        assert list(log.producer_runs(1)) == [(9, 1, 1, 3), (9, 2, 1, 6)]
        segment = log.segments[-1]
    with open(segment.path, "rb") as file:
        data = file.read()
    magics = []
    position = 0
    while position < len(data):
        magics.append(data[position + 8 : position + 12])
        position += struct.unpack_from("<I", data, position)[0]
    assert magics == [BATCH_MAGIC_V2, BATCH_MAGIC_V3, BATCH_MAGIC_V2, BATCH_MAGIC_V3]


def test_a_read_from_inside_a_run_starts_its_sequence_there(tmp_path: Path) -> None:
    """A follower fetching from the middle of a producer's run stores the
    rest as a run whose first sequence is that of its first message."""
    with PartitionLog.open(str(tmp_path / "p")) as log:
        log.append(
            [make_run(b"a", [b"1", b"2", b"3"]), make_run(b"b", [b"4"])],
            producers=[(5, 10), (0, 0)],
        )
        (first, second) = log.read(1)
        assert (first.base_offset, first.count, first.producer, first.sequence) == (1, 2, 5, 11)
        assert (second.producer, second.sequence) == (0, 0)
